"""HOPE's placement: whole operators (and branches) placed on the CPU or the GPU over the
operator graph, with the baselines it is measured against.

- :mod:`~codl_tvm.planner.placement.graph`: the operator graph with predicted latencies and
  transfers (:func:`build_graph`);
- :mod:`~codl_tvm.planner.placement.schedule`: the timing model, :class:`Schedule` and its check;
- :mod:`~codl_tvm.planner.placement.heuristics`: HOPE's greedy search, StarPU-like, MOSAIC-like;
- :mod:`~codl_tvm.planner.placement.exact`: HOPE's exact placement (CP-SAT) and upward-rank
  partitioning;
- :mod:`~codl_tvm.planner.placement.hope`: the public entry of the methods above;
- :mod:`~codl_tvm.planner.placement.modes`: the planner modes that turn a schedule into a plan
  and a report (:func:`make_plan`, :func:`plan_placement`, ``auto``).
"""
