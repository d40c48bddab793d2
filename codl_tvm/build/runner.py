"""Build a Relax module for one processor and run it in the stock Relax VM.

OpenCL modules built in-process hold TVM's codegen-time OpenCL stub, which cannot launch kernels;
they are exported to a shared library and loaded back, so the codl-tvm runtime plugin's loader
creates the real module (this is also how a model is deployed).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.targets import host_cpu_spec
from codl_tvm.runtime.vm import Latency, flatten_outputs, time_vm

__all__ = [
    "BuiltModel",
    "Latency",
    "build",
    "default_target",
    "flatten_outputs",
    "max_abs_difference",
    "remove_with",
    "time_vm",
]

DEVICES = ("cpu", "opencl")


def default_target(device: str):
    """The default TVM target of a processor: this machine's CPU (LLVM, with its detected CPU
    model and features), or OpenCL with that CPU as host."""
    if device == "cpu":
        return tvm.target.Target(host_cpu_spec())
    if device == "opencl":
        return tvm.target.Target({"kind": "opencl"}, host=host_cpu_spec())
    raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")


@dataclass
class BuiltModel:
    """A model compiled for one device and loaded into a Relax VM."""

    device: str
    library: Path
    vm: object
    tvm_device: object

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run once; return every output as a numpy array."""
        args = [tvm.runtime.tensor(x, self.tvm_device) for x in inputs]
        out = self.vm["main"](*args)
        return flatten_outputs(out)

    def time(self, inputs: Sequence[np.ndarray], number: int = 5, repeat: int = 3) -> Latency:
        """Time ``main`` with TVM's ``time_evaluator`` (device timer; warm-up run first)."""
        return time_vm(self.vm, self.tvm_device, inputs, number, repeat)


def max_abs_difference(outputs, expected) -> float:
    """The largest absolute difference between ``outputs`` and ``expected``, where equal
    values (the same infinity, NaN and NaN) differ by 0 and a NaN or infinity against anything
    else by inf: a model whose outputs hold inf or NaN (as onnxruntime's do) matches its
    reference instead of giving ``inf - inf = nan``."""
    err = 0.0
    for a, b in zip(outputs, expected, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(invalid="ignore"):  # inf - inf where ``same`` already holds
            diff = np.where(same, 0.0, np.abs(a - b))
        err = max(err, float(np.max(np.nan_to_num(diff, nan=np.inf, posinf=np.inf), initial=0.0)))
    return err


def build(
    mod,
    device: str,
    target=None,
    work_dir: str | Path | None = None,
    relax_pipeline=None,
    model: str = "Relax module",
) -> BuiltModel:
    """Compile ``mod`` for ``device`` ("cpu" or "opencl"), export it, and load it into a VM.

    Parameters
    ----------
    mod
        A Relax IRModule with a ``main`` function.
    device
        ``"cpu"`` or ``"opencl"``.
    target
        A TVM target overriding :func:`default_target`.
    work_dir
        Where the exported library goes. By default a temporary directory, removed when the
        returned model is garbage collected; pass a directory to keep the library.
    relax_pipeline
        A Relax pipeline passed to ``tvm.compile`` (default: codl-tvm's pipeline for the target).
    model
        What error messages call the model (e.g. its file).

    Raises
    ------
    BuildError
        TVM could not build or export ``mod`` for ``device``; the message names ``model``,
        ``device`` and the first line of the cause (the original exception is its
        ``__cause__``). OpenCL kernels are compiled by the driver at the first run, so a kernel
        that does not compile fails there (:func:`codl_tvm.runtime.build_error` turns that
        failure into the same error).
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    target = target or default_target(device)
    if relax_pipeline is None:
        # deferred: the pipeline needs TVM's compiler, and this module runs built models where
        # TVM is runtime-only (artifacts on a device)
        from codl_tvm.build.pipeline import single_device_pipeline

        relax_pipeline = single_device_pipeline(target)
    if device == "opencl":
        runtime.load()
    with runtime.build_errors(model, device):
        ex = tvm.compile(mod, target=target, relax_pipeline=relax_pipeline)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="codl-tvm-"))
    work.mkdir(parents=True, exist_ok=True)
    lib_path = work / f"model_{device}.so"
    with runtime.build_errors(model, device):
        ex.export_library(str(lib_path))  # compiles and links the host code
        lib = tvm.runtime.load_module(str(lib_path))
    dev = tvm.cpu(0) if device == "cpu" else tvm.opencl(0)
    vm = VirtualMachine(lib, dev)
    built = BuiltModel(device=device, library=lib_path, vm=vm, tvm_device=dev)
    if not work_dir:
        remove_with(built, work)
    return built


def remove_with(owner: object, directory: Path) -> None:
    """Remove ``directory`` (a temporary one we created) once ``owner`` is garbage collected.

    A loaded library stays mapped after its file is gone, but ``owner.library`` must stay
    valid while the caller can still copy or upload it, so the files live as long as ``owner``.
    """
    weakref.finalize(owner, shutil.rmtree, str(directory), True)
