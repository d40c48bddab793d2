"""How sure the planner is of each decision: the split margin and the decisions' provenance.

A cost model that stores its leave-one-model-out error and the reach of its data
(:mod:`codl_tvm.cost_model.uncertainty`, ``codl-tvm cost-model lomo --write``) tells the planner
how far off a prediction for an unseen model's operator may be. :class:`Uncertainty` turns that
into

- the **margin** a split must clear (``PlannerConfig.split_margin``; by default only for an
  operator outside the model's data): the split is chosen over the best whole placement only
  where its predicted gain exceeds
  :func:`~codl_tvm.cost_model.uncertainty.split_margin`, read at ``margin_quantiles[0]`` for an
  operator inside the data and ``margin_quantiles[1]`` for a novel one;
- each decision's **provenance**: ``measured`` where a lookup table of measurements
  (:class:`~codl_tvm.cost_model.measured.MeasuredModel`) holds every part it runs, or where
  the operator was tuned on the target (``PlannerConfig.tuned_parts``: planned on its
  measurements alone, held to no margin), otherwise ``predicted`` with the expected relative
  error of its prediction and the reasons it is novel.
"""

from __future__ import annotations

import math
from typing import Any

from codl_tvm.core.errors import PlannerError
from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.features import PROCESSORS, Partition, op_features
from codl_tvm.cost_model.uncertainty import Margin, split_margin, uncertainty_of
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.predict import OpEstimate, SplitEstimate

__all__ = ["Uncertainty"]


class Uncertainty:
    """The stored uncertainty of one cost model, applied to one planning run.

    Parameters
    ----------
    model
        The cost model the planner predicts with (its ``meta`` holds the errors).
    config
        ``split_margin`` and ``margin_quantiles`` are read.

    Attributes
    ----------
    notes
        What the report should say about the margin (e.g. that the model stores no error).
    held_whole
        The operators the margin kept whole, each with its predicted gain and margin (ms).
    """

    def __init__(self, model: CostModel, config: PlannerConfig):
        self.model = model
        self.config = config
        self.measured = model.kind == "measured"
        try:
            self.lomo, self.ranges = uncertainty_of(model)
        except ValueError as exc:
            raise PlannerError(f"the {model.kind} cost model: {exc}") from None
        self.notes: list[str] = []
        self.held_whole: list[tuple[str, float, float]] = []
        if config.split_margin != "none" and self.lomo is None and not self.measured:
            self.notes.append(
                f"the {model.kind} cost model stores no leave-one-model-out error "
                "(meta.lomo_error; `codl-tvm cost-model lomo MODEL DATA --write`): splits are "
                "chosen without a margin and decisions carry no expected error"
            )

    @property
    def active(self) -> bool:
        """Whether splits are held to a margin in this run."""
        return self.config.split_margin != "none" and self.lomo is not None and not self.measured

    def tuned(self, op: OpEstimate) -> bool:
        """Whether ``op`` was measured on the target (``PlannerConfig.tuned_parts``): its
        predictions are its measurements."""
        table = self.model.measured_parts
        return table is not None and table.holds_operator(op.params)

    def _held(self, ops: list[OpEstimate]) -> bool:
        """Whether ``ops`` are held to the margin: every operator (``lomo``), or where one lies
        outside the model's data (``novel``); never a tuned one (measured, not predicted)."""
        if not self.active or any(self.tuned(op) for op in ops):
            return False
        return self.config.split_margin == "lomo" or any(op.novel for op in ops)

    def novelty(self, op: OpEstimate) -> list[str]:
        """Why ``op`` lies outside the cost model's data: its class or shape
        (:meth:`~codl_tvm.cost_model.uncertainty.DataRanges.novelty`) or a kernel the model has
        no sub-model for (predicted by the FLOPs fallback)."""
        if self.measured:
            return []  # a table knows exactly what it measured: see provenance()
        out = [] if self.ranges is None else self.ranges.novelty(op.params)
        for proc in PROCESSORS:
            if not self.model.covers(op_features(op.params, proc, op.impl[proc])):
                out.append(f"no {op.params.op} {op.impl[proc]} {proc.upper()} data (FLOPs line)")
        return out

    def _quantile(self, op: OpEstimate) -> float:
        return self.config.margin_quantiles[1 if op.novel else 0]

    def margin(
        self, op: OpEstimate, whole_processor: str, whole_ms: float, split: SplitEstimate
    ) -> Margin | None:
        """The margin ``split`` must clear against ``op`` whole on ``whole_processor``, None
        where none applies (margin off, an operator inside the data under ``novel``, no stored
        error, or none for this kernel)."""
        if not self._held([op]):
            return None
        m = split_margin(
            self.lomo,
            op.params,
            op.impl,
            whole_processor,
            whole_ms,
            split.total_ms,
            self._quantile(op),
        )
        return m if math.isfinite(m.margin_ms) else None

    def chain_margin(self, ops: list[OpEstimate], nochain_ms: float) -> Margin | None:
        """The margin a chain must clear against its operators planned one by one: the largest
        ``split`` error of its operators' parts times the one-by-one latency (a chain's parts
        are split parts, with their halos); None where none applies."""
        if not self._held(ops):
            return None
        worst = None
        for op in ops:
            q = self._quantile(op)
            for p in PROCESSORS:
                err, basis = self.lomo.error(op.params, p, op.impl[p], "split", q)
                if math.isfinite(err) and (worst is None or err > worst.error):
                    worst = Margin(err * nochain_ms, err, q, basis)
        return worst

    def _error(self, op: OpEstimate, dim: str, ratio: float) -> float | None:
        if self.lomo is None:
            return None
        q = self._quantile(op)
        if ratio in (0.0, 1.0):
            proc = "gpu" if ratio == 1.0 else "cpu"
            err, _ = self.lomo.error(op.params, proc, op.impl[proc], "whole", q)
        else:
            err = max(self.lomo.error(op.params, p, op.impl[p], "split", q)[0] for p in PROCESSORS)
        return err if math.isfinite(err) else None

    def _in_table(self, op: OpEstimate, dim: str, ratio: float) -> bool:
        partition = Partition("none" if ratio in (0.0, 1.0) else dim, ratio)
        procs = [p for p in PROCESSORS if (p == "gpu") == (ratio > 0.0) or 0.0 < ratio < 1.0]
        return all(
            self.model.covers(op_features(op.params, p, op.impl[p], partition)) for p in procs
        )

    def provenance(self, ops: list[OpEstimate], dim: str, ratio: float) -> dict[str, Any]:
        """The provenance fields of the decision (``Decision.provenance``, ``expected_error``,
        ``novel``) for ``ops`` (one operator, or a chain's) at ``(dim, ratio)``. A chain's
        expected error is its worst operator's."""
        novel = tuple(dict.fromkeys(n for op in ops for n in op.novel))
        if len(ops) == 1 and self.tuned(ops[0]):
            # the reasons it was tuned stay on record
            return {"provenance": "measured", "expected_error": None, "novel": novel}
        if self.measured:
            if len(ops) == 1 and self._in_table(ops[0], dim, ratio):
                return {"provenance": "measured", "expected_error": None, "novel": ()}
            novel = (*novel, "parts not in the measured table (FLOPs line)")
            return {"provenance": "predicted", "expected_error": None, "novel": novel}
        errors = [self._error(op, dim, ratio) for op in ops]
        known = [e for e in errors if e is not None]
        return {
            "provenance": "predicted",
            "expected_error": max(known) if known and len(known) == len(errors) else None,
            "novel": novel,
        }
