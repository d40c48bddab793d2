"""Deployable build artifacts: ``codl-tvm compile MODEL.onnx -o OUT/`` and ``codl-tvm run OUT/``.

Deprecated: this package keeps the names earlier releases exported here for one release; import
them from their modules instead (listed below).

An artifact directory holds everything needed to run a planned model on its device, and nothing
that needs TVM's compiler (it runs with a runtime-only TVM, e.g. on a phone or a board):

``model.so``
    The library: OpenCL kernels for the GPU parts and LLVM kernels for the CPU parts
    (co-execution), or one processor's build.
``manifest.json``
    Format and version, the model (file, SHA-256, inputs, outputs), the processor set and VM
    device order, the targets, how the plan was made (planner mode, cost model file and its
    SHA-256), codl-tvm and TVM versions, and the SHA-256 of every file in the directory. With
    ``--tune``, ``"tune"``: the budget and seconds spent, where and on what the operators were
    measured, the cache file, how many operators were flagged, measured (fresh or from the
    cache) and left predicted, and each measured operator's part times the plan was made on
    (:meth:`~codl_tvm.objectives.tune.TuneResult.record`).
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
earlier artifact only, and only once the new one is complete. Here it also takes the keyword
arguments of earlier releases (each a :class:`~codl_tvm.options.CompileOptions` field, and
``log``), with a :class:`DeprecationWarning`.

The names, by concern: :mod:`~codl_tvm.runtime.artifact` (the format and its typed
``Manifest``, writing the directory safely, loading and running; runtime-only TVM is enough),
:mod:`~codl_tvm.options` (``CompileOptions``), :mod:`~codl_tvm.objectives.latency`
(``compile_artifact``), :mod:`~codl_tvm.build.cache` (the libraries of a compile and
the cache keyed by a ``BuildSpec``), :mod:`~codl_tvm.objectives.verify` (``--verify``) and
:mod:`~codl_tvm.objectives.refine` (``codl-tvm refine``). The planning policy (when to
co-execute, calibrated and candidate plans) is :mod:`codl_tvm.planner.policy`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from codl_tvm.core.errors import ArtifactError
from codl_tvm.objectives import latency, refine
from codl_tvm.objectives.latency import default_cost_model_for
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import (
    ARTIFACT_FORMAT,
    ARTIFACT_VERSION,
    DEVICES,
    LIBRARY,
    MANIFEST,
    REFERENCE,
    Artifact,
    Manifest,
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
    "CompileOptions",
    "Manifest",
    "compile_artifact",
    "compile_model",
    "compile_refined",
    "default_cost_model_for",
    "is_artifact",
    "load_artifact",
    "refine_artifact",
    "refined_plan",
]


class _Forward(logging.Handler):
    """Hands each log message to a ``log`` callable of an earlier release."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log(record.getMessage())


@contextlib.contextmanager
def _logging_to(log: Callable[[str], None] | None) -> Iterator[None]:
    """codl-tvm's INFO messages to ``log`` while the call runs (nothing changes for None)."""
    if log is None:
        yield
        return
    root = logging.getLogger("codl_tvm")
    handler, level = _Forward(log), root.level
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _deprecated(what: str) -> None:
    warnings.warn(what, DeprecationWarning, stacklevel=3)


def compile_artifact(
    model_path: str | Path,
    out_dir: str | Path,
    options: CompileOptions | None = None,
    **keywords: Any,
) -> Path:
    """:func:`codl_tvm.objectives.latency.compile_artifact`; also takes the keyword arguments of
    earlier releases (``CompileOptions`` fields, and ``log``: where progress lines went), with a
    :class:`DeprecationWarning`."""
    log = keywords.pop("log", None)
    if keywords or log is not None:
        _deprecated(
            "compile_artifact(model, out, **keywords) is deprecated: pass "
            "codl_tvm.options.CompileOptions(...) (progress goes to the codl_tvm logger)"
        )
    if keywords:
        if options is not None:
            raise TypeError("give either options or keyword arguments, not both")
        options = CompileOptions(**keywords)
    with _logging_to(log):
        return latency.compile_artifact(model_path, out_dir, options)


compile_model = compile_artifact


def _accepts_log(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking the ``log`` keyword of earlier releases, with a DeprecationWarning."""

    @functools.wraps(fn)
    def call(*args: Any, log: Callable[[str], None] | None = None, **kwargs: Any) -> Any:
        if log is not None:
            _deprecated(f"{fn.__name__}(log=...) is deprecated: it logs to the codl_tvm logger")
        with _logging_to(log):
            return fn(*args, **kwargs)

    return call


refine_artifact = _accepts_log(refine.refine_artifact)
compile_refined = _accepts_log(refine.compile_refined)
refined_plan = _accepts_log(refine.refined_plan)

# The planning policy (codl_tvm.planner.policy) needs TVM's compiler, which a runtime-only TVM
# (a device running artifacts) lacks: its names that callers import from here resolve on first
# use.
_POLICY_NAMES = ("MIN_PREDICTED_SPEEDUP", "cost_model_cpu_alone", "planning_context")


def __getattr__(name: str) -> Any:
    if name in _POLICY_NAMES:
        from codl_tvm.planner import policy  # deferred: TVM's compiler (see above)

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
