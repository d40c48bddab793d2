"""CoDL's partition planner (sections 4.1 and 4.2) and the baseline planners.

The planner reads the partitionable operators of a Relax module and a cost model; it never
rewrites the IR. It returns a :class:`~codl_tvm.core.plan.PartitionPlan` and a
:class:`~codl_tvm.planner.report.PlanReport`.

1. **Per operator** (hybrid-dimension partitioning, CoDL 4.1): every dimension the operator can
   be split along (H, OC) and every GPU share ``rho`` of the grid strictly between 0 and 1 is
   predicted with :meth:`CostModel.predict_coexec` (``chained=False``: Eq. 2 with the data-sharing
   costs of the operator's input and output). The best split is kept when it beats running the
   operator whole on the faster processor by more than ``min_gain_ms``; otherwise the operator
   runs whole there (ratio 0: CPU, 1: GPU). A grid point whose cut gives one processor nothing
   is not a split and is skipped.
2. **Chains** (CoDL Algorithm 1): walking the operators in order, a chain starts at a head with
   the head's split (dim, rho) and grows one operator at a time while the operators are
   consecutive in the data flow and each one's output feeds only the next (the rule
   ``codl.PartitionOperators`` enforces, checked with its own analysis). For each length the best
   ``rho`` within ``chain_delta`` of the head's is searched; each operator's parts are predicted
   with the shapes the halo geometry gives (input rows grow backwards through the chain), data is
   shared only at the chain's entry and exit, and each processor runs its parts back to back, so
   the chain takes ``sharing + max(sum of CPU parts, sum of GPU parts)``. The gain is against the
   same operators planned one by one; the chain grows while its gain improves and is kept when the
   gain exceeds ``min_gain_ms`` and ``chain_min_gain`` of the one-by-one latency (a margin for
   the cost model's error; the report's notes name every chain it turned down).

Predicted totals cover the partitionable operators only (the other operators, e.g. elementwise
ones, are the same in every plan). Switching a whole operator between processors costs nothing
in Eq. 2 and so costs nothing here either.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model.base import CostModel
from codl_tvm.planner.report import Decision, PlanReport, PlanSummary
from codl_tvm.planner.split.codl import SplitPlanner
from codl_tvm.planner.split.config import DEFAULT_RATIOS, MODES, PlannerConfig, ideal_latency
from codl_tvm.planner.split.predict import (
    OpEstimate,
    calibrated_model,
    expected_impl,
    flops_model,
)

__all__ = [
    "DEFAULT_RATIOS",
    "MODES",
    "PlannerConfig",
    "PlannerError",
    "calibrated_model",
    "comparison_table",
    "expected_impl",
    "ideal_latency",
    "plan_all",
    "plan_model",
]

# The cost model warns once per prediction without sharing data; plan_model says it once.
_NO_SHARING = "has no data-sharing measurements"


def _summary(ops: list[OpEstimate], rows: list[Decision], home: str) -> PlanSummary:
    modelled = [o for o in ops if o.params is not None]
    cpu = sum(o.cpu_ms for o in modelled)
    gpu = sum(o.gpu_ms for o in modelled)
    predicted = sum(d.coexec_ms for d in rows if d.coexec_ms is not None)
    singles = [d for d in rows if not d.is_chain and d.ratio is not None]
    split = [d for d in singles if 0.0 < d.ratio < 1.0]
    return PlanSummary(
        predicted_ms=predicted,
        cpu_only_ms=cpu,
        gpu_only_ms=gpu,
        ideal_ms=ideal_latency(cpu, gpu),
        n_ops=len(ops),
        n_split_h=sum(d.dim == "H" for d in split)
        + sum(len(d.ops) for d in rows if d.is_chain and d.dim == "H"),
        n_split_oc=sum(d.dim == "OC" for d in split)
        + sum(len(d.ops) for d in rows if d.is_chain and d.dim == "OC"),
        n_whole_cpu=sum(d.ratio == 0.0 for d in singles),
        n_whole_gpu=sum(d.ratio == 1.0 for d in singles),
        chain_lengths=tuple(len(d.ops) for d in rows if d.is_chain),
        n_unmodelled=sum(o.params is None for o in ops),
        home=home,
    )


def plan_model(
    mod,
    cost_model: CostModel,
    mode: str = "codl",
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> tuple[PartitionPlan, PlanReport]:
    """Plan the co-execution of ``mod`` with ``cost_model``.

    Parameters
    ----------
    mod
        The Relax module as imported (the plan names its partitionable operators).
    cost_model
        A fitted :class:`~codl_tvm.cost_model.CostModel`.
    mode
        ``codl`` (the full planner), ``codl_no_chain``, ``h_only``, ``oc_only`` (CoDL restricted
        to one dimension, chains included), ``ulayer_like`` (an OC split of every operator, its
        ratio chosen by the cost model's FLOPs-linear model, no chains), ``cpu_only``,
        ``gpu_only``.
    config
        Search space and thresholds (:class:`PlannerConfig`).
    model_name
        Recorded in the report.

    Returns
    -------
    (PartitionPlan, PlanReport)
        The plan (every modelled operator appears, ratio 0 or 1 for a whole operator) and the
        report of every decision; all predicted times come from ``cost_model``.
    """
    if not isinstance(cost_model, CostModel):
        raise PlannerError(f"plan_model needs a fitted CostModel, got {type(cost_model).__name__}")
    if mode not in MODES:
        raise PlannerError(f"unknown planner mode {mode!r} (known: {', '.join(MODES)})")
    config = config or PlannerConfig()
    if mode == "codl_no_chain":
        config = replace(config, chains=False)
    elif mode == "h_only":
        config = replace(config, dims=("H",))
    elif mode == "oc_only":
        config = replace(config, dims=("OC",))
    elif mode == "ulayer_like":
        config = replace(config, dims=("OC",), chains=False)
    cost_model, notes = calibrated_model(cost_model, config)
    if cost_model.sharing is None and mode not in ("cpu_only", "gpu_only"):
        notes.append(
            f"the {cost_model.kind} cost model has no data-sharing measurements: sharing costs "
            "are taken as 0, which favours splits"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=f".*{_NO_SHARING}")
        planner = SplitPlanner(mod, cost_model, config, mode)
        forced = {"cpu_only": "cpu", "gpu_only": "gpu"}.get(mode)
        chooser = None
        if mode == "ulayer_like":
            chooser = SplitPlanner(mod, flops_model(cost_model), config, mode)
        plan, rows = planner.run(forced, chooser)
    plan.validate(mod)
    notes.extend(planner.uncertainty.notes)
    held = planner.uncertainty.held_whole
    if held:
        notes.append(
            f"the split margin (PlannerConfig.split_margin={planner.config.split_margin!r}: a "
            "split must gain more than the cost model's leave-one-model-out error) kept "
            f"{len(held)} operator(s) whole: "
            + ", ".join(f"{n} (gain {g:.3f} < {m:.3f} ms)" for n, g, m in held[:4])
            + (", ..." if len(held) > 4 else "")
        )
    notes.extend(planner.chain_notes)
    notes.extend(planner.pixel_notes(plan))
    for (proc, impl, closest), names in planner.uncovered.items():
        notes.append(
            f"the {proc.upper()} build uses {impl} kernels for {len(names)} operator(s) "
            f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}); the cost model has no "
            f"{impl} data, so they are predicted as {closest} (profile them: `codl-tvm profile "
            f"--{impl}`)"
        )
    notes.extend(dict.fromkeys(str(w.message) for w in caught))  # once each, in order
    report = PlanReport(
        mode=mode,
        cost_model=cost_model.kind,
        decisions=tuple(rows),
        summary=_summary(planner.ops, rows, plan.home),
        notes=tuple(notes),
        model=model_name,
    )
    return plan, report


def plan_all(
    mod,
    cost_model: CostModel,
    modes: Sequence[str] = MODES,
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> dict[str, tuple[PartitionPlan, PlanReport]]:
    """:func:`plan_model` for several modes (the baselines of CoDL's evaluation)."""
    return {m: plan_model(mod, cost_model, m, config, model_name) for m in modes}


def comparison_table(results: Mapping[str, tuple[Any, PlanReport]]) -> str:
    """One line per mode: predicted latency, speedup over the best single processor, T* share."""
    lines = [f"{'mode':<14} {'predicted ms':>12} {'vs best single':>14} {'of T*':>7}"]
    for mode, (_, rep) in results.items():
        s = rep.summary
        lines.append(
            f"{mode:<14} {s.predicted_ms:>12.3f} {s.speedup_vs_best_single:>13.2f}x "
            f"{s.efficiency:>7.0%}"
        )
    return "\n".join(lines)
