"""CoDL's split planning: which operators and chains are split between GPU and CPU, on
which dimension (output rows H or channels OC) and at what ratio.

- :mod:`~codl_tvm.planner.split.config`: :class:`PlannerConfig`, the modes and the ideal bound;
- :mod:`~codl_tvm.planner.split.predict`: the cost model's predictions of operators, splits and
  chains, and the implementation each build uses;
- :mod:`~codl_tvm.planner.split.codl`: the planner itself (per-operator splits, Algorithm 1's
  chains, the plan and its decisions);
- :mod:`~codl_tvm.planner.split.search`: the public entry (:func:`plan_model`, :func:`plan_all`,
  :func:`comparison_table`);
- :mod:`~codl_tvm.planner.split.part_shapes`: the parts' shapes through a chain (halo rows);
- :mod:`~codl_tvm.planner.split.refine`: re-balancing a built plan from measured timelines.
"""
