"""CoDL's partition planner: hybrid-dimension partitioning and operator chains.

``plan_model(mod, cost_model, mode="codl")`` reads the partitionable operators of a Relax module
and a fitted cost model (it never rewrites the IR) and returns a
:class:`~codl_tvm.core.plan.PartitionPlan` and a :class:`PlanReport` (one row per operator or chain:
dimension, ratio, predicted CPU/GPU/co-execution/no-chain latency and the reason; a text table
and JSON). The baseline planners are modes of the same function (``cpu_only``, ``gpu_only``,
``ulayer_like``, ``codl_no_chain``, ``h_only``, ``oc_only``) and every report carries the ideal
bound ``T* = 1 / (1/Tcpu + 1/Tgpu)``. ``codl-tvm plan`` is :mod:`codl_tvm.cli.plan`.
The placement modes (``hope``, ``hope_greedy``, ``starpu``, ``mosaic``:
:mod:`codl_tvm.planner.placement.modes`) place whole operators on the CPU or the GPU so independent
branches run on both at once, scheduled on the operator graph of
:mod:`codl_tvm.planner.placement.graph` by
:mod:`codl_tvm.planner.placement.hope`; :func:`make_plan` runs any mode.
``codl_tvm.planner.split.refine`` re-balances a built plan's splits from timelines measured inside
the model (``codl-tvm refine``).
"""

from codl_tvm.planner.placement.modes import (
    ALL_MODES,
    PLACEMENT_MODES,
    PlacementConfig,
    make_plan,
    plan_placement,
)
from codl_tvm.planner.report import Decision, PlanReport, PlanSummary
from codl_tvm.planner.split.part_shapes import ChainParts, chain_parts, op_params
from codl_tvm.planner.split.search import (
    DEFAULT_RATIOS,
    MODES,
    PlannerConfig,
    PlannerError,
    comparison_table,
    ideal_latency,
    plan_all,
    plan_model,
)

__all__ = [
    "ALL_MODES",
    "DEFAULT_RATIOS",
    "MODES",
    "PLACEMENT_MODES",
    "ChainParts",
    "Decision",
    "PlacementConfig",
    "PlanReport",
    "PlanSummary",
    "PlannerConfig",
    "PlannerError",
    "chain_parts",
    "comparison_table",
    "ideal_latency",
    "make_plan",
    "op_params",
    "plan_all",
    "plan_model",
    "plan_placement",
]
