"""Measured latencies as a cost model: the oracle of the planner benchmark.

``MeasuredModel`` predicts a part by looking up its own measurement: the key is the operator's
hyper-parameters, the processor and the part's geometry (rows/channels it reads and writes), so
only parts that were profiled are covered. A split part that was not measured is predicted as
infinitely slow (so the planner never picks an unmeasured split, and chains, whose parts read
halos never measured alone, are never formed); a whole operator that was not measured goes to the
embedded FLOPs-linear fallback with a warning, like every model. Planning with it in
``codl_no_chain`` mode therefore picks each operator's measured best (dim, ratio): the
per-operator upper bound CoDL's oracle stands for.

Repeated measurements of one key keep their median. The file stores the table, so a planner
run with ``--cost-model oracle.json`` is reproducible.

A table also stands in for another model on the operators it holds whole on both processors
(:meth:`MeasuredModel.holds_operator`, :meth:`~codl_tvm.cost_model.base.CostModel.\
with_measurements`): the operators ``compile --tune`` measured on the target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import (
    PROCESSORS,
    OpFeatures,
    OpParams,
    Partition,
    PartShape,
    part_shape,
)

__all__ = ["MeasuredModel"]

_PART_FIELDS = ("out_h", "out_w", "oc", "in_h", "in_w", "ic", "groups")


def _key(processor: str, params: OpParams, part: PartShape) -> str:
    geometry = ",".join(str(getattr(part, f)) for f in _PART_FIELDS)
    pad = ",".join(str(int(v)) for v in params.padding)
    return (
        f"{processor}|{params.op}|{params.h}x{params.w}|{params.ic}->{params.oc}"
        f"|k{params.kernel}s{params.stride}d{params.dilation}g{params.groups}p{pad}"
        f"|c{int(bool(params.ceil_mode))}|{geometry}"
    )


class MeasuredModel(CostModel):
    """A lookup table of measured part latencies (see the module docstring)."""

    kind = "measured"

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[str, float] = {}

    def _fit_ops(self, records: list[OpRecord]) -> None:
        samples: dict[str, list[float]] = {}
        for r in records:
            # Under the shape really built and under the planner's split convention.
            keys = {
                _key(r.processor, r.params, r.part),
                _key(r.processor, r.params, part_shape(r.params, r.partition, r.processor)),
            }
            for k in keys:
                samples.setdefault(k, []).append(r.latency_ms)
        self.table = {k: float(np.median(v)) for k, v in sorted(samples.items())}

    def covers(self, features: OpFeatures) -> bool:
        return _key(features.processor, features.params, features.part) in self.table

    def holds_operator(self, params: OpParams) -> bool:
        """Whether the table holds the operator ``params`` whole on every processor (an
        operator measured as such, not a part of another one sampled)."""
        return all(
            _key(p, params, part_shape(params, Partition("none", 1.0 if p == "gpu" else 0.0), p))
            in self.table
            for p in PROCESSORS
        )

    def measured_ms(self, features: OpFeatures) -> float:
        """The part's measured latency; infinity where it was not measured."""
        return self.table.get(_key(features.processor, features.params, features.part), np.inf)

    def predict_many(self, features: Sequence[OpFeatures]) -> np.ndarray:
        features = list(features)
        out = np.full(len(features), np.inf)
        rest = [i for i, f in enumerate(features) if self.covers(f) or f.partition.dim == "none"]
        if rest:
            out[rest] = super().predict_many([features[i] for i in rest])
        return out

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        return np.array([self.table[_key(f.processor, f.params, f.part)] for f in features])

    def body_json(self) -> dict:
        return {"table": self.table}

    def load_body(self, body: dict) -> None:
        table = body["table"]
        if not isinstance(table, dict):
            raise ValueError("'table' must be an object")
        out = {}
        for k, v in table.items():
            if k.split("|", 1)[0] not in PROCESSORS:
                raise ValueError(f"table key {k!r} names no processor")
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"table entry {k!r} must be a positive latency, got {v!r}")
            out[k] = float(v)
        self.table = out
