"""Profiler: latency of each part of a partitioned operator on its processor, and data-sharing
costs, written to versioned latency datasets (``codl_tvm.cost_model.dataset``).

See :mod:`codl_tvm.profiling.parts` (building and timing one part, sharing costs, sessions),
:mod:`codl_tvm.profiling.profile` (jobs, resumable runs, compile-here/run-there) and
:mod:`codl_tvm.cli.profile` (``codl-tvm profile``).
"""

from codl_tvm.profiling.parts import (
    CompiledPart,
    LocalSession,
    ProfileError,
    RPCSession,
    TimingConfig,
    compile_part,
    measure_op,
    measure_sharing,
    part_module,
)
from codl_tvm.profiling.profile import (
    ProfileJob,
    compile_jobs,
    make_jobs,
    model_ops,
    profile,
    run_compiled,
    sampled_ops,
)

__all__ = [
    "CompiledPart",
    "LocalSession",
    "ProfileError",
    "ProfileJob",
    "RPCSession",
    "TimingConfig",
    "compile_jobs",
    "compile_part",
    "make_jobs",
    "measure_op",
    "measure_sharing",
    "model_ops",
    "part_module",
    "profile",
    "run_compiled",
    "sampled_ops",
]
