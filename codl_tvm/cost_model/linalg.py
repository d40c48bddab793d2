"""Small least-squares helpers (numpy only): column-scaled weighted least squares and NNLS."""

from __future__ import annotations

import numpy as np

__all__ = ["nnls", "weighted_lstsq"]


def _scaled(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = np.max(np.abs(a), axis=0)
    scale[scale == 0] = 1.0
    return a / scale, scale


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """Non-negative least squares ``min ||a x - b||, x >= 0`` (Lawson and Hanson's active set).

    Columns are scaled internally, so badly scaled features (FLOPs next to 1) are fine.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a_s, scale = _scaled(a)
    n = a_s.shape[1]
    max_iter = max_iter or 3 * n + 30
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a_s.T @ b).max(initial=0.0)))
    for _ in range(max_iter):
        grad = a_s.T @ (b - a_s @ x)
        if passive.all() or np.max(np.where(passive, -np.inf, grad)) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, grad)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a_s[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > 0):
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
            if not passive.any():
                break
    return x / scale


def weighted_lstsq(
    a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None, nonneg: bool = False
) -> np.ndarray:
    """Least squares with per-row weights (minimises ``sum (w_i (a_i x - b_i))^2``).

    ``weights = 1 / b`` makes it a relative-error fit, which suits latencies spanning decades.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if weights is not None:
        a = a * weights[:, None]
        b = b * weights
    if nonneg:
        return nnls(a, b)
    a_s, scale = _scaled(a)
    return np.linalg.lstsq(a_s, b, rcond=None)[0] / scale
