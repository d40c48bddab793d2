"""HOPE's placement of whole operators on the CPU and the GPU, and the baselines it is measured
against, on an :class:`~codl_tvm.planner.placement.graph.OpGraph`.

Every method returns a :class:`Schedule` under one timing model, which :func:`check_schedule`
validates:

- a node runs whole on one processor for its predicted latency there, without preemption; a
  processor runs one node at a time (a node predicted to take no time, e.g. a concat the cost
  model does not describe, occupies no processor);
- a node starts after each producer finished, plus the edge's transfer delay when the two run on
  different processors (a delay, not work of either processor, so a tensor moved once serves every
  reader on the other side), with the tensor's image pack (to the GPU) or unpack (to the CPU)
  where the GPU computes on images (:meth:`~codl_tvm.planner.placement.graph.OpGraph.cross_ms`);
- a follow node (concat, residual add:
  :attr:`~codl_tvm.planner.placement.graph.DagNode.follows`) runs where ``codl.PlaceParts`` puts
  it: its producers' one processor, else the graph's ``home``;
- a node that offers a CoDL split (:attr:`~codl_tvm.planner.placement.graph.DagNode.split_ms`)
  may run split (``"both"``): it occupies both processors for its Eq. 2 latency, which includes
  the sharing of its input and output, so the edges next to it carry no transfer delay
  (``codl_hope``).

Methods
-------
- :func:`solve_exact`: placement and per-processor order minimising the makespan, with OR-Tools
  CP-SAT (HOPE's ILP, formulated with optional intervals and no-overlap constraints). A time limit
  returns the best schedule found and its proven gap; a graph above ``max_nodes`` is cut by HOPE's
  upward-rank partitioning (Algorithm 1) into pieces solved in order, each with the earlier pieces
  fixed.
- :func:`greedy_schedule`: HOPE's GS (Algorithm 2): the ``k`` ready nodes with the earliest start,
  all ``2**k`` mappings tried, the one finishing them earliest kept; by default also GS scored
  with upward ranks and a local search over both (:func:`improve_schedule`), which GS's window
  alone needs on Inception-like graphs.
- :func:`starpu_schedule`: each node in topological order to the processor where it finishes
  earliest (StarPU's DMDA-like policy).
- :func:`mosaic_schedule`: MOSAIC's slicing: contiguous slices of the topological order, each on
  one processor, chosen by dynamic programming over the slices' compute and the transfers into
  each slice.

Where each lives: the timing model and :class:`Schedule` in
:mod:`codl_tvm.planner.placement.schedule`; GS, StarPU-like and MOSAIC-like in
:mod:`codl_tvm.planner.placement.heuristics`; the exact solve and the upward-rank partitioning in
:mod:`codl_tvm.planner.placement.exact`. This module is their public entry.
"""

from __future__ import annotations

from codl_tvm.planner.placement.exact import (
    DEFAULT_MAX_NODES,
    DEFAULT_TIME_LIMIT_S,
    SolverMissingError,
    partition_by_upward_rank,
    solve_exact,
)
from codl_tvm.planner.placement.heuristics import (
    DEFAULT_GREEDY_K,
    greedy_schedule,
    improve_schedule,
    mosaic_schedule,
    starpu_schedule,
)
from codl_tvm.planner.placement.schedule import (
    Schedule,
    ScheduleError,
    check_schedule,
    lower_bound_ms,
    simulate,
)

__all__ = [
    "DEFAULT_GREEDY_K",
    "DEFAULT_MAX_NODES",
    "DEFAULT_TIME_LIMIT_S",
    "Schedule",
    "ScheduleError",
    "SolverMissingError",
    "check_schedule",
    "greedy_schedule",
    "improve_schedule",
    "lower_bound_ms",
    "mosaic_schedule",
    "partition_by_upward_rank",
    "simulate",
    "solve_exact",
    "starpu_schedule",
]
