"""Pipe-it's stage planning: a model's layers cut into contiguous stages, each on a processor
group, for throughput.

- :mod:`~codl_tvm.planner.stages.layer_model`: the layer model (one-core latency, core scaling)
  that predicts the time matrix;
- :mod:`~codl_tvm.planner.stages.table`: the time matrix, the executor's hand-off cost, stage
  costs and the plan a search returns;
- :mod:`~codl_tvm.planner.stages.heuristics`: Pipe-it's Algorithms 1-3 and the local search;
- :mod:`~codl_tvm.planner.stages.exact`: the exact solvers (optimal cuts, optimal pipeline);
- :mod:`~codl_tvm.planner.stages.search`: the public entry (:func:`search_pipeline`,
  :func:`optimal_pipeline`, :func:`recost_plan`) and the names users import with it;
- :mod:`~codl_tvm.planner.stages.refine`: the refinement on measured stages.

The processor groups a pipeline runs on are :mod:`codl_tvm.core.groups`.
"""
