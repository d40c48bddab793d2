"""One-call co-execution: ``codl_tvm.compile(mod, plan)`` builds a model whose partitioned
operators run on the OpenCL device (GPU) and the host CPU at the same time.

The build is TVM's own ``tvm.compile`` with :func:`codl_tvm.build.pipeline.coexec_pipeline` as the
Relax pipeline; the result runs in the stock Relax VM on ``[tvm.opencl(0), tvm.cpu(0)]`` with the
codl-tvm OpenCL runtime plugin.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.runner import remove_with
from codl_tvm.build.targets import host_cpu_spec
from codl_tvm.runtime.vm import flatten_outputs, time_vm

__all__ = ["CoexecModule", "compile_coexec", "placement_report"]


def _targets(gpu, cpu):
    # this machine's CPU model and features: without them LLVM emits baseline x86-64 code
    gpu = gpu or tvm.target.Target({"kind": "opencl"}, host=host_cpu_spec())
    cpu = cpu or tvm.target.Target(host_cpu_spec())
    if isinstance(gpu, dict):
        gpu = tvm.target.Target(gpu, host=host_cpu_spec())
    if isinstance(cpu, dict):
        cpu = tvm.target.Target(cpu)
    if gpu.kind.name != "opencl":
        raise ValueError(f"the GPU target must be an OpenCL target, not {gpu.kind.name}")
    if cpu.kind.name != "llvm":
        raise ValueError(f"the CPU target must be an LLVM target, not {cpu.kind.name}")
    return gpu, cpu


@dataclass
class CoexecModule:
    """A co-executed model: its library, the plan it was built with and a Relax VM.

    Attributes
    ----------
    library
        The exported shared library (deployable with ``tvm.runtime.load_module``).
    plan
        The :class:`~codl_tvm.core.plan.PartitionPlan` it was built with.
    placements
        One row per partitioned operator: its split, ratio and the regions each processor writes.
    kernel_splits
        The kernel calls in execution order with the split each computes
        (:func:`codl_tvm.passes.kernel_splits.kernel_splits`; read by
        :func:`codl_tvm.profiling.trace.trace_inference`). An image build adds
        ``gpu_parts``: each split's GPU part data type (``"image"`` or ``"buffer"`` and why).
    vm_devices
        The VM's devices by name: ``["opencl", "cpu"]``, and one ``"opencl"`` per texture scope
        of an image build.
    """

    library: Path
    plan: object
    placements: list[dict] = field(default_factory=list)
    kernel_splits: dict | None = None
    vm_devices: tuple[str, ...] = ("opencl", "cpu")
    _vm: object = None

    @property
    def vm(self):
        """The Relax VM over :attr:`vm_devices` (created on first use)."""
        if self._vm is None:
            runtime.load()
            lib = tvm.runtime.load_module(str(self.library))
            devices = [tvm.opencl(0) if d == "opencl" else tvm.cpu(0) for d in self.vm_devices]
            self._vm = VirtualMachine(lib, devices)
        return self._vm

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run once on numpy inputs; return numpy outputs."""
        # asarray keeps a 0-d input 0-d (ascontiguousarray returns at least 1-d)
        args = [tvm.runtime.tensor(np.asarray(x, order="C"), tvm.opencl(0)) for x in inputs]
        return flatten_outputs(self.vm["main"](*args))

    def time(self, inputs: Sequence[np.ndarray], number: int = 5, repeat: int = 3):
        """Latency with ``time_evaluator`` on the OpenCL device's event timer."""
        return time_vm(self.vm, tvm.opencl(0), inputs, number, repeat)


def placement_report(
    mod, plan, channel_blocks: bool = True, row_blocks: bool = False
) -> list[dict]:
    """For each split (plan entries, and unless ``channel_blocks`` / ``row_blocks`` is False
    the channel / row blocks split after them): dimension, ratio and the output region of each
    processor."""
    # deferred here and in compile_coexec: the passes and the pipeline need TVM's compiler, and
    # this module runs co-executed libraries where TVM is runtime-only (`codl-tvm run`)
    from codl_tvm.build.pipeline import inference_passes
    from codl_tvm.passes import PartitionOperators, collect_parts

    # partition what the build partitions: the module after the inference simplifications
    simplified = tvm.transform.Sequential(inference_passes())(mod)
    parts = collect_parts(PartitionOperators(plan, channel_blocks, row_blocks)(simplified))
    rows = []
    for split in parts:
        rows.append(
            {
                "ops": list(split.ops),
                "dim": split.dim.value,
                "ratio": split.ratio,
                "axis": split.axis,
                "parts": [
                    {"processor": p.processor.value, "region": list(p.region)} for p in split.parts
                ],
            }
        )
    return rows


def compile_coexec(
    mod,
    plan,
    gpu=None,
    cpu=None,
    work_dir: str | Path | None = None,
    name: str = "coexec",
    row_blocks: bool = False,
    model: str = "Relax module",
    issue_ahead: bool = True,
    gates: bool | None = False,
    gpu_data_type: str = "buffer",
    gpu_dtype: str = "float32",
) -> CoexecModule:
    """Build ``mod`` so that ``plan``'s operators co-execute on the GPU and the CPU.

    Parameters
    ----------
    mod
        A Relax IRModule (e.g. from :func:`codl_tvm.frontend.importer.load_onnx`).
    plan
        A :class:`~codl_tvm.core.plan.PartitionPlan` (see :func:`codl_tvm.core.plan.uniform_plan`).
    gpu, cpu
        TVM targets (or JSON dicts) of the OpenCL device and the CPU; by default generic OpenCL
        with an LLVM host, and the host LLVM target.
    work_dir
        Where the library, plan and placement report are written. By default a temporary
        directory, removed when the returned module is garbage collected.
    row_blocks
        Also split the LRN-like block after an H split along rows
        (:class:`~codl_tvm.passes.PartitionOperators`); off by default.
    model
        What error messages call the model (e.g. its file).
    issue_ahead, gates
        Enqueue each GPU kernel as early as its inputs allow, and with ``gates`` also ahead of
        the CPU kernels producing them (None: where this machine's device can hold GPU work
        for the CPU; off by default); see :func:`codl_tvm.build.pipeline.coexec_pipeline`.
    gpu_data_type
        The GPU parts' tensors: ``"buffer"`` or ``"image"`` (:mod:`codl_tvm.build.texture_coexec`).
    gpu_dtype
        What image GPU parts compute in: ``"float32"``, or ``"float16"`` (half images; needs
        ``cl_khr_fp16``; the CPU parts and the shared tensors stay float32).

    Raises
    ------
    PlanError
        ``plan`` does not fit ``mod``.
    DeviceSupportError
        ``gpu_data_type`` is ``"image"`` and this machine's device has no usable images (or,
        ``gpu_dtype`` float16, no ``cl_khr_fp16``).
    BuildError
        TVM could not build or export the co-executed model; the message names ``model`` and
        the first line of the cause (the original exception is its ``__cause__``).
    """
    # deferred: needs TVM's compiler (see placement_report)
    from codl_tvm.build.pipeline import coexec_pipeline

    if gpu_data_type not in ("buffer", "image"):
        raise ValueError(f"gpu_data_type: 'buffer' or 'image', got {gpu_data_type!r}")
    half_buffers = (gpu_dtype, gpu_data_type) == ("float16", "buffer")
    if gpu_dtype not in ("float32", "float16") or half_buffers:
        raise ValueError(f"gpu_dtype: 'float32', or 'float16' with images, got {gpu_dtype!r}")
    gpu, cpu = _targets(gpu, cpu)
    plan.validate(mod)
    runtime.load()
    splits: dict = {}
    vm_devices: tuple[str, ...] = ("opencl", "cpu")
    if gpu_data_type == "image":
        # deferred: needs TVM's compiler (see placement_report)
        from codl_tvm.build.texture_coexec import (
            VM_DEVICES,
            coexec_gpu_data_type,
            compile_coexec_images,
        )
        from codl_tvm.runtime.images import image_caps

        caps = image_caps()
        coexec_gpu_data_type(caps, "image", gpu_dtype)  # a device without images/fp16: raise
        with runtime.build_errors(model, "coexec"):
            ex, record = compile_coexec_images(
                mod,
                plan,
                gpu,
                cpu,
                caps,
                kernel_splits=splits,
                row_blocks=row_blocks,
                issue_ahead=issue_ahead,
                dtype=gpu_dtype,
                gates=gates,
            )
        splits["gpu_parts"] = record["gpu_parts"]
        vm_devices = VM_DEVICES
    else:
        pipeline = coexec_pipeline(
            plan,
            gpu,
            cpu,
            kernel_splits=splits,
            row_blocks=row_blocks,
            issue_ahead=issue_ahead,
            gates=gates,
        )
        with runtime.build_errors(model, "coexec"):
            ex = tvm.compile(mod, target=gpu, relax_pipeline=pipeline)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="codl-coexec-"))
    work.mkdir(parents=True, exist_ok=True)
    lib = work / f"{name}.so"
    with runtime.build_errors(model, "coexec"):
        ex.export_library(str(lib))
    (work / f"{name}.plan.json").write_text(plan.to_json())
    report = placement_report(mod, plan, row_blocks=row_blocks)
    (work / f"{name}.placement.json").write_text(json.dumps(report, indent=2))
    built = CoexecModule(
        library=lib, plan=plan, placements=report, kernel_splits=splits, vm_devices=vm_devices
    )
    if not work_dir:
        remove_with(built, work)
    return built
