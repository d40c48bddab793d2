"""The planners: read a Relax module and a fitted cost model (never rewriting the IR) and return
a plan the passes build.

Three planners, each in one folder:

- :mod:`codl_tvm.planner.split`: CoDL's split planner (hybrid-dimension partitioning and operator
  chains). ``plan_model(mod, cost_model, mode="codl")`` returns a
  :class:`~codl_tvm.core.plan.PartitionPlan` and a :class:`PlanReport` (one row per operator or
  chain: dimension, ratio, predicted CPU/GPU/co-execution/no-chain latency and the reason; a text
  table and JSON). The baseline planners are modes of the same function (``cpu_only``,
  ``gpu_only``, ``ulayer_like``, ``codl_no_chain``, ``h_only``, ``oc_only``) and every report
  carries the ideal bound ``T* = 1 / (1/Tcpu + 1/Tgpu)``. :mod:`codl_tvm.planner.split.refine`
  re-balances a built plan's splits from timelines measured inside the model
  (``codl-tvm refine``).
- :mod:`codl_tvm.planner.placement`: HOPE's placement and its baselines (``hope``,
  ``hope_greedy``, ``starpu``, ``mosaic``, ``codl_hope``: :mod:`codl_tvm.planner.placement.modes`)
  place whole operators on the CPU or the GPU so independent branches run on both at once,
  scheduled on the operator graph of :mod:`codl_tvm.planner.placement.graph` by the methods of
  :mod:`codl_tvm.planner.placement.hope`.
- :mod:`codl_tvm.planner.stages`: Pipe-it's stage planning for throughput: a model's layers cut
  into stages on processor groups (:func:`~codl_tvm.planner.stages.search.search_pipeline`).

:func:`make_plan` runs any latency mode; :mod:`codl_tvm.planner.policy` picks the plan a
compile uses; :mod:`codl_tvm.planner.report` is the report every latency planner returns.
``codl-tvm plan`` is :mod:`codl_tvm.cli.plan`.
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
