"""Operator shapes to profile: CoDL's uniform ranges and the SVM paper's power-of-two intervals.

- ``"codl"`` (CoDL section 7.5): H = W uniform in 1..640 (or H and W independently), IC uniform in
  3..4096, OC in 32..4096, F in {1, 3, 5, 7}, S in {1, 2}.
- ``"pow2"`` (the fine-grained SVM paper, section 5.2): for every dimension pick an interval
  ``[2^k, 2^(k+1))`` with k uniform in ``2..9``, then a value uniform inside it; F in {1, 3, 5, 7},
  S in {1, 2}. Small and large sizes are then equally represented.

Padding is "same" (F // 2). ``max_gflops`` rejects shapes too large to measure in reasonable time
(CoDL's upper corner, 640x640x4096->4096 with a 7x7 filter, is ~38 TFLOPs). Sampling is seeded
through a ``numpy.random.Generator`` and deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from codl_tvm.cost_model.features import DIMS, OpParams, Partition

__all__ = [
    "CODL_SPACE",
    "POW2_SPACE",
    "SampleSpace",
    "sample_conv2d",
    "sample_dense",
    "sample_partitions",
]


@dataclass(frozen=True)
class SampleSpace:
    """Ranges of one sampling scheme (inclusive integer ranges; ``pow2_k``: exponents)."""

    method: str
    hw: tuple[int, int] = (1, 640)
    ic: tuple[int, int] = (3, 4096)
    oc: tuple[int, int] = (32, 4096)
    pow2_k: tuple[int, int] = (2, 9)
    kernels: tuple[int, ...] = (1, 3, 5, 7)
    strides: tuple[int, ...] = (1, 2)
    square: bool = True

    def __post_init__(self) -> None:
        if self.method not in ("codl", "pow2"):
            raise ValueError(f"sampling method {self.method!r} is not 'codl' or 'pow2'")
        for name in ("hw", "ic", "oc", "pow2_k"):
            lo, hi = getattr(self, name)
            if lo > hi or lo < (0 if name == "pow2_k" else 1):
                raise ValueError(f"SampleSpace.{name}: bad range ({lo}, {hi})")


CODL_SPACE = SampleSpace("codl")
POW2_SPACE = SampleSpace("pow2")


def _value(rng: np.random.Generator, space: SampleSpace, rng_range: tuple[int, int]) -> int:
    if space.method == "codl":
        return int(rng.integers(rng_range[0], rng_range[1] + 1))
    k = int(rng.integers(space.pow2_k[0], space.pow2_k[1] + 1))
    return int(rng.integers(2**k, 2 ** (k + 1)))


def _conv_flops(p: OpParams) -> float:
    return 2.0 * p.out_h * p.out_w * p.oc * (p.ic // p.groups) * p.kernel * p.kernel


def sample_conv2d(
    rng: np.random.Generator,
    n: int,
    space: SampleSpace = CODL_SPACE,
    max_gflops: float | None = 20.0,
    max_tries: int = 1000,
) -> list[OpParams]:
    """``n`` conv2d shapes from ``space`` (rejecting those above ``max_gflops``)."""
    out: list[OpParams] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > max_tries * max(n, 1):
            raise ValueError(
                f"could not sample {n} conv2d shapes under {max_gflops} GFLOPs from "
                f"{space} (got {len(out)})"
            )
        h = _value(rng, space, space.hw)
        w = h if space.square else _value(rng, space, space.hw)
        ic = _value(rng, space, space.ic)
        oc = _value(rng, space, space.oc)
        k = int(rng.choice(space.kernels))
        s = int(rng.choice(space.strides))
        p = OpParams("conv2d", h, w, ic, oc, k, s, k // 2)
        if max_gflops is not None and _conv_flops(p) > max_gflops * 1e9:
            continue
        out.append(p)
    return out


def sample_dense(
    rng: np.random.Generator,
    n: int,
    space: SampleSpace = POW2_SPACE,
    max_gflops: float | None = 20.0,
) -> list[OpParams]:
    """``n`` dense shapes (rows L, K, N) drawn like the SVM paper's linear layers."""
    out: list[OpParams] = []
    while len(out) < n:
        rows = _value(rng, space, space.hw)
        k = _value(rng, space, space.ic)
        nn = _value(rng, space, space.oc)
        if max_gflops is not None and 2.0 * rows * k * nn > max_gflops * 1e9:
            continue
        out.append(OpParams("dense", rows, 1, k, nn))
    return out


def sample_partitions(
    rng: np.random.Generator,
    n: int,
    dims: tuple[str, ...] = ("H", "OC"),
    ratios: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
) -> list[Partition]:
    """``n`` partitions with a dimension from ``dims`` and a ratio from ``ratios``."""
    for d in dims:
        if d not in DIMS:
            raise ValueError(f"partition dim {d!r} is not one of {DIMS}")
    return [Partition(str(rng.choice(dims)), float(rng.choice(ratios))) for _ in range(n)]
