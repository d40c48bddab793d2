"""FLOPs-linear latency baseline (uLayer-like): ``latency_ms = a + b * FLOPs``.

One non-negative line per (operator kind, processor), with per-processor and global lines
behind it for combinations never measured, so it predicts every operator. Fitted on relative
error (rows weighted by 1 / latency) because latencies span decades. It is both the comparison
baseline of CoDL's Table 3 and the fallback every other model embeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.cost_model.base import CostModel, finite_number
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, OpFeatures
from codl_tvm.cost_model.linalg import weighted_lstsq

__all__ = ["FlopsLine", "FlopsModel"]


@dataclass(frozen=True)
class FlopsLine:
    """``latency_ms = intercept_ms + ms_per_gflop * FLOPs / 1e9`` fitted on ``n`` records."""

    intercept_ms: float
    ms_per_gflop: float
    n: int

    def __call__(self, flops: float) -> float:
        return self.intercept_ms + self.ms_per_gflop * flops * 1e-9

    @classmethod
    def fit(cls, flops: np.ndarray, latency_ms: np.ndarray) -> FlopsLine:
        a = np.stack([np.ones_like(flops), flops * 1e-9], axis=1)
        if len(flops) == 1:
            return cls(0.0, float(latency_ms[0] / a[0, 1]), 1)
        coef = weighted_lstsq(a, latency_ms, 1.0 / latency_ms, nonneg=True)
        return cls(float(coef[0]), float(coef[1]), len(flops))

    def to_json(self) -> dict:
        return {"intercept_ms": self.intercept_ms, "ms_per_gflop": self.ms_per_gflop, "n": self.n}

    @classmethod
    def from_json(cls, obj: dict) -> FlopsLine:
        n = obj["n"]
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"'n' must be a positive integer, got {n!r}")
        return cls(finite_number(obj, "intercept_ms"), finite_number(obj, "ms_per_gflop"), n)


class FlopsModel(CostModel):
    """Linear in FLOPs per (operator kind, processor); see the module docstring."""

    kind = "flops"

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[tuple[str, str], FlopsLine] = {}
        self.per_processor: dict[str, FlopsLine] = {}
        self.overall: FlopsLine | None = None

    def _fit_ops(self, records: list[OpRecord]) -> None:
        flops = np.array([r.features().flops for r in records])
        lat = np.array([r.latency_ms for r in records])
        ops = np.array([r.op for r in records])
        procs = np.array([r.processor for r in records])
        self.overall = FlopsLine.fit(flops, lat)
        self.per_processor = {
            p: FlopsLine.fit(flops[procs == p], lat[procs == p]) for p in sorted(set(procs))
        }
        self.lines = {}
        for key in sorted(set(zip(ops, procs))):
            sel = (ops == key[0]) & (procs == key[1])
            self.lines[(str(key[0]), str(key[1]))] = FlopsLine.fit(flops[sel], lat[sel])

    def covers(self, features: OpFeatures) -> bool:
        return self.overall is not None

    def line_for(self, op: str, processor: str) -> FlopsLine:
        line = self.lines.get((op, processor)) or self.per_processor.get(processor) or self.overall
        if line is None:
            raise ValueError("the FLOPs model is not fitted")
        return line

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        # A line fitted on few points can cross zero for tiny ops; latencies stay positive.
        return np.array([max(self.line_for(f.op, f.processor)(f.flops), 1e-6) for f in features])

    def body_json(self) -> dict:
        return {
            "lines": [
                {"op": op, "processor": p, **line.to_json()}
                for (op, p), line in sorted(self.lines.items())
            ],
            "per_processor": {p: line.to_json() for p, line in sorted(self.per_processor.items())},
            "overall": None if self.overall is None else self.overall.to_json(),
        }

    def load_body(self, body: dict) -> None:
        self.lines = {}
        for obj in body["lines"]:
            if obj["op"] not in OP_KINDS or obj["processor"] not in PROCESSORS:
                raise ValueError(
                    f"unknown operator kind/processor {obj['op']!r}/{obj['processor']!r}"
                )
            self.lines[(obj["op"], obj["processor"])] = FlopsLine.from_json(obj)
        self.per_processor = {p: FlopsLine.from_json(v) for p, v in body["per_processor"].items()}
        self.overall = None if body["overall"] is None else FlopsLine.from_json(body["overall"])
