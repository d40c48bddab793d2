"""Whole-model latency: the cost model's per-operator sums against measured single-processor
builds, and a per-processor in-model factor evaluated leave-one-model-out.

The profiler times each part alone, repeated, with its weights warm in the caches; inside a
model the other operators evict them, and the kernels outside the plan (activations, concat,
softmax) run too. A CPU-only or GPU-only build's measured latency is therefore not the sum of
its operators' predictions. :func:`whole_model_table` compares the two per model and
processor; :func:`lomo_factors` fits, for each model, one factor per processor on the *other*
models (the geometric mean of their measured / predicted ratios) and applies it to the held-out
model, the honest estimate of how well a calibrated sum predicts a model never measured whole.

The predicted sums come from the planner (``plan_model`` in ``cpu_only`` / ``gpu_only`` mode:
its ``PlanSummary.cpu_only_ms`` / ``gpu_only_ms``), which this module does not import (the
planner depends on the cost models, not the other way round): ``scripts/cost_model_in_model.py``
collects them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["WholeModelRow", "lomo_factors", "whole_model_table"]


@dataclass(frozen=True)
class WholeModelRow:
    """One model on one processor: predicted operator sum, measured build, and the prediction
    after the factor fitted on the other models."""

    model: str
    processor: str
    predicted_ms: float
    measured_ms: float
    factor: float = 1.0

    @property
    def error(self) -> float:
        """Relative error of the raw sum, ``predicted / measured - 1``."""
        return self.predicted_ms / self.measured_ms - 1.0

    @property
    def calibrated_error(self) -> float:
        """Relative error after the leave-one-model-out factor."""
        return self.predicted_ms * self.factor / self.measured_ms - 1.0

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "processor": self.processor,
            "predicted_ms": self.predicted_ms,
            "measured_ms": self.measured_ms,
            "error": self.error,
            "lomo_factor": self.factor,
            "calibrated_error": self.calibrated_error,
        }


def whole_model_table(
    predicted: Mapping[str, Mapping[str, float]], measured: Mapping[str, Mapping[str, float]]
) -> list[WholeModelRow]:
    """Rows for every (model, processor) in both ``predicted`` and ``measured`` (``{model:
    {"cpu": ms, "gpu": ms}}``), with leave-one-model-out factors (:func:`lomo_factors`)."""
    rows = []
    for model in sorted(set(predicted) & set(measured)):
        for proc in ("cpu", "gpu"):
            p, m = predicted[model].get(proc), measured[model].get(proc)
            if p is None or m is None:
                continue
            for what, v in (("predicted", p), ("measured", m)):
                if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                    raise ValueError(f"{model} on {proc}: {what} latency must be > 0, got {v!r}")
            rows.append(WholeModelRow(model, proc, float(p), float(m)))
    return lomo_factors(rows)


def lomo_factors(rows: Sequence[WholeModelRow]) -> list[WholeModelRow]:
    """``rows`` with each one's factor: the geometric mean of measured / predicted over the
    other models' rows of the same processor (1.0 where there is no other model)."""
    out = []
    for r in rows:
        others = [
            math.log(o.measured_ms / o.predicted_ms)
            for o in rows
            if o.processor == r.processor and o.model != r.model
        ]
        factor = math.exp(float(np.mean(others))) if others else 1.0
        out.append(WholeModelRow(r.model, r.processor, r.predicted_ms, r.measured_ms, factor))
    return out


def summary(rows: Sequence[WholeModelRow], tol: float = 0.10) -> dict[str, dict[str, float]]:
    """Per processor: rows, share within ``tol`` and mean |error| before and after the
    leave-one-model-out factor, and the factor fitted on all of them."""
    out = {}
    for proc in ("cpu", "gpu"):
        rs = [r for r in rows if r.processor == proc]
        if not rs:
            continue
        raw = np.array([r.error for r in rs])
        cal = np.array([r.calibrated_error for r in rs])
        out[proc] = {
            "models": len(rs),
            "within_raw": float(np.mean(np.abs(raw) <= tol + 1e-12)),
            "mean_abs_error_raw": float(np.mean(np.abs(raw))),
            "within_calibrated": float(np.mean(np.abs(cal) <= tol + 1e-12)),
            "mean_abs_error_calibrated": float(np.mean(np.abs(cal))),
            "factor_all": math.exp(
                float(np.mean([math.log(r.measured_ms / r.predicted_ms) for r in rs]))
            ),
        }
    return out
