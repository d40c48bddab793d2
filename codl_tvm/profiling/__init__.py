"""Profiler: latency of each part of a partitioned operator on its processor, and data-sharing
costs, written to versioned latency datasets (``codl_tvm.cost_model.dataset``).

One part's path: ``cost_model.part_ir`` (the part's one-op module, scheduled and compiled),
:mod:`codl_tvm.profiling.part_build` (a part compiled into a library), :mod:`~.sessions` (where
libraries run: here or through TVM RPC), :mod:`~.timing` (the timing protocol and a part's
record), :mod:`~.sharing` (data-sharing costs). Runs of many parts:
:mod:`codl_tvm.profiling.profile` (jobs, resumable runs, compile-here/run-there) and
:mod:`~.farm` (a device farm); ``codl-tvm profile`` is :mod:`codl_tvm.cli.profile`. Whole
models: :mod:`~.layers` (Pipe-it's per-layer latencies), :mod:`~.trace` (co-execution
timelines), :mod:`~.bound` (plans against the ideal bound), :mod:`~.cold_start`;
:mod:`~.stats` holds the timing statistics of benchmarks.

The package imports none of its modules (import them by name): the measured process of a cold
start (``python -m codl_tvm.profiling.cold_start``) must start with the standard library alone,
and importing this package runs before it can take its first mark.
"""
