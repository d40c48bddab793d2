"""Deployable build artifacts: ``codl-tvm compile MODEL.onnx -o OUT/`` and ``codl-tvm run OUT/``.

An artifact directory holds everything needed to run a planned model on its device, and nothing
that needs TVM's compiler (it runs with a runtime-only TVM, e.g. on a phone or the device
machine):

``model.so``
    The library: OpenCL kernels for the GPU parts and LLVM kernels for the CPU parts
    (co-execution), or one processor's build.
``manifest.json``
    Format and version, the model (file, SHA-256, inputs, outputs), the processor set and VM
    device order, the targets, how the plan was made (planner mode, cost model file and its
    SHA-256), codl-tvm and TVM versions, and the SHA-256 of every file in the directory.
``plan.json``, ``plan_report.json``, ``plan_report.txt``, ``placement.json``
    The partition plan, the planner's report (one row per operator or chain with its reason)
    and where each part runs (co-execution only).
``program_binaries/``
    OpenCL builds compiled on a reachable device: each kernel's program binary for that device
    and driver (:mod:`~codl_tvm.runtime.program_binaries`), so the first run there skips the
    OpenCL compiler; any other device compiles from source.
``weights.bin``
    With ``--weights beside``: the weights the library fetches while it runs, read on a thread
    during the first inference (:mod:`~codl_tvm.runtime.weights`).
``reference.npz``
    Seeded inputs (``input:<name>``) and the unpartitioned model's outputs on the host CPU
    (``output:<name>``), so ``run OUT/`` checks the numerics on the device with no compiler.

``compile_artifact`` never overwrites a directory it did not write; ``force=True`` replaces an
earlier artifact only, and only once the new one is complete.

The package, by concern: :mod:`~codl_tvm.runtime.artifact` (the format, writing the directory
safely, loading and running; runtime-only TVM is enough), :mod:`~codl_tvm.objectives.latency`
(``compile_artifact``), :mod:`~codl_tvm.build.cache` (the libraries of a compile and
the cache keyed by a ``BuildSpec``), :mod:`~codl_tvm.objectives.verify` (``--verify``) and
:mod:`~codl_tvm.objectives.refine` (``codl-tvm refine``). The planning policy (when to
co-execute, calibrated and candidate plans) is :mod:`codl_tvm.planner.policy`.
"""

from __future__ import annotations

from typing import Any

from codl_tvm.core.errors import ArtifactError
from codl_tvm.objectives.latency import _adopt_plan as _adopt_plan  # for older callers
from codl_tvm.objectives.latency import _calibrated_plans as _calibrated_plans
from codl_tvm.objectives.latency import compile_artifact, default_cost_model_for
from codl_tvm.objectives.refine import compile_refined, refine_artifact, refined_plan
from codl_tvm.runtime.artifact import (
    ARTIFACT_FORMAT,
    ARTIFACT_VERSION,
    DEVICES,
    LIBRARY,
    MANIFEST,
    REFERENCE,
    Artifact,
    is_artifact,
    load_artifact,
)

__all__ = [
    "ARTIFACT_FORMAT",
    "ARTIFACT_VERSION",
    "DEVICES",
    "LIBRARY",
    "MANIFEST",
    "REFERENCE",
    "Artifact",
    "ArtifactError",
    "compile_artifact",
    "compile_refined",
    "default_cost_model_for",
    "is_artifact",
    "load_artifact",
    "refine_artifact",
    "refined_plan",
]

# The planning policy (codl_tvm.planner.policy) needs TVM's compiler, which a runtime-only TVM
# (a device running artifacts) lacks: its names that callers import from here resolve on first
# use.
_POLICY_NAMES = ("MIN_PREDICTED_SPEEDUP", "cost_model_cpu_alone", "planning_context")


def __getattr__(name: str) -> Any:
    if name in _POLICY_NAMES:
        from codl_tvm.planner import policy  # deferred: TVM's compiler (see above)

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
