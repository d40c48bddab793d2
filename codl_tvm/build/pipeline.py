"""codl-tvm's Relax build pipelines, as phase functions returning ``list[Pass]``.

``single_device_pipeline(target)`` builds a model for one processor: inference
simplification (``codl.SanitizeParamNames``: parameters named like ``x/0`` get C identifiers,
which OpenCL kernel arguments need; ``codl.ImportedClip``: the ONNX importer's Clip kernels
become ``R.clip``; ``codl.FoldBatchNorm``: batch norms after convs with
constant weights fold into them; ``codl.PairwiseVariadic``: ONNX Sum/Max/Min become binary
ops that fuse; ``codl.LRNWindowSum``: LRN's channel-window pool becomes shifted adds),
codl-tvm's algorithm selection (``codl.Conv2DWinograd``: qualifying 3x3 convs become Winograd
convs), TVM's legalization and fusion, then codl-tvm's schedule rules (``codl_tvm.schedules``)
ahead of dlight's GPU rules, then TVM's lowering and finalisation. The co-execution pipeline
adds the partitioning phase after the inference simplification (algorithm selection runs after
it, per part and processor), places the parts between legalization and fusion, merges them in place
after scheduling and inserts the synchronisation while leaving dataflow form.

Phases that codl-tvm does not change are TVM's own (``tvm.relax.backend.gpu_generic``'s
dataflow lowering and finalisation, as TVM's Adreno backend reuses them); only the phases that
differ are written out here.

IR dumps: pass ``dump_ir=DIR`` to a pipeline to write the IR after every phase
(``DIR/NN-phase.py``). ``CODL_TVM_DUMP_IR=DIR`` in the environment is an alias, read when the
pipeline runs, for builds made through the CLI or :mod:`codl_tvm.objectives` whose callers do not
pass the argument; an explicit ``dump_ir`` wins.
"""

from __future__ import annotations

import os
from pathlib import Path

import tvm
from tvm import relax
from tvm.relax.backend import gpu_generic

from codl_tvm.passes import PartitionOperators
from codl_tvm.passes.fold_bn import FoldBatchNorm
from codl_tvm.passes.fused_targets import RecordFusedTargets, RestoreTargets
from codl_tvm.passes.imported_clip import ImportedClip
from codl_tvm.passes.issue_ahead import GPU_INPUTS_ATTR, IssueGpuAhead, gpu_inputs
from codl_tvm.passes.kernel_splits import (
    KERNEL_SPLITS_ATTR,
    RecordKernelSplits,
    recorded_kernel_splits,
)
from codl_tvm.passes.lrn import LRNWindowSum
from codl_tvm.passes.merge import MergePartsInPlace
from codl_tvm.passes.nan_semantics import PropagateNaN
from codl_tvm.passes.order import OrderSplits
from codl_tvm.passes.param_names import SanitizeParamNames
from codl_tvm.passes.place import PlaceParts
from codl_tvm.passes.share_kernels import ShareIdenticalKernels
from codl_tvm.passes.stream_weights import StreamWeights
from codl_tvm.passes.sync import InsertCoexecSync
from codl_tvm.passes.variadic import PairwiseVariadic
from codl_tvm.passes.winograd import Conv2DWinograd
from codl_tvm.runtime import is_available as opencl_available
from codl_tvm.runtime.sync import gates_supported
from codl_tvm.schedules import apply_schedules
from codl_tvm.schedules.settings import ScheduleSettings, current_settings

__all__ = [
    "DUMP_IR_ENV",
    "algorithm_passes",
    "coexec_dataflow_lower_passes",
    "coexec_pipeline",
    "dataflow_lower_passes",
    "finalize_passes",
    "gpu_gates_available",
    "inference_passes",
    "legalize_passes",
    "run_phases",
    "schedule_passes",
    "single_device_pipeline",
    "take_kernel_splits",
    "weights_passes",
]

#: Environment alias of the pipelines' ``dump_ir`` argument (see the module docstring).
DUMP_IR_ENV = "CODL_TVM_DUMP_IR"


def inference_passes() -> list[tvm.transform.Pass]:
    """Inference-only simplifications that keep every operator's name, order and shape (so a
    plan made for the imported module applies): first give parameters C-identifier names (TVM
    names kernel arguments after them; a hand-made module or TVM's own ``from_onnx`` may keep
    names like ``x/0``), then make the importer's Clip kernels ``R.clip`` (an operator the
    texture layout and mixed precision see), fold batch norms into the convs before them, make
    the frontend's stack-and-reduce Sum/Max/Min pairwise binary ops (fusable epilogues), and
    write LRN's channel-window pools as shifted adds (one elementwise kernel per LRN)."""
    return [
        SanitizeParamNames(),
        ImportedClip(),
        FoldBatchNorm(),
        PairwiseVariadic(),
        LRNWindowSum(),
    ]


def algorithm_passes(
    target: tvm.target.Target,
    cpu_target: tvm.target.Target | None = None,
    cpu=None,
    opencl=None,
    settings: ScheduleSettings | None = None,
) -> list[tvm.transform.Pass]:
    """Choose each operator's algorithm before legalization (Winograd for qualifying convs).

    ``cpu_target`` is the CPU of a co-executed build (its parts use its config); ``cpu`` and
    ``opencl`` (:class:`~codl_tvm.schedules.CPUConfig` / ``OpenCLConfig``) replace the presets;
    ``settings`` are the build's schedule switches (None: those in effect).
    """
    return [Conv2DWinograd(target, cpu_target, cpu=cpu, opencl=opencl, settings=settings)]


def legalize_passes(
    target: tvm.target.Target, place: tvm.transform.Pass | None = None
) -> list[tvm.transform.Pass]:
    """Lower Relax ops to TIR and fuse them.

    TVM's ``gpu_generic.legalize_passes`` without its dlight schedules (codl-tvm schedules in its
    own phase). ``place`` (the co-executed build's :class:`~codl_tvm.passes.place.PlaceParts`)
    runs after constant folding, before fusion, and ``CanonicalizeBindings`` right after fusion
    removes the fences it put on every GPU/CPU edge; FuseTIR is then bracketed by
    ``RecordFusedTargets``/``RestoreTargets``, because FuseTIR drops the per-PrimFunc ``target``
    attribute that tells the CPU parts' kernels from the GPU's. ``codl.PropagateNaN`` right
    after legalization makes element-wise max/min (Relu, Clip, Max, Min) propagate NaN as ONNX
    does.
    """
    placed = place is not None
    return [
        relax.transform.LegalizeOps(),
        PropagateNaN(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        *([place] if placed else []),
        relax.transform.FuseOps(),
        # removes PlaceParts' fences (aliases that kept FuseOps from fusing across processors)
        *([relax.transform.CanonicalizeBindings()] if placed else []),
        *([RecordFusedTargets()] if placed else []),
        relax.transform.FuseTIR(),
        *([RestoreTargets()] if placed else []),
    ]


def schedule_passes(
    target: tvm.target.Target,
    cpu=None,
    opencl=None,
    settings: ScheduleSettings | None = None,
) -> list[tvm.transform.Pass]:
    """Schedule every PrimFunc with codl-tvm's rules (and dlight's GPU rules after them).

    The rules read each PrimFunc's own ``target`` attribute, so the CPU kernels of a
    co-executed build get the CPU rules and the OpenCL kernels the OpenCL ones; ``cpu`` and
    ``opencl`` configs replace the presets; ``settings`` are the build's schedule switches
    (None: those in effect).
    """
    return [apply_schedules(target, cpu, opencl, settings)]


def dataflow_lower_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Leave dataflow form and turn calls into explicit allocations (TVM's own phase)."""
    return list(gpu_generic.dataflow_lower_passes(target))


def gpu_gates_available() -> bool:
    """Whether this machine's OpenCL device can hold GPU work for the CPU on the device
    (:func:`codl_tvm.runtime.sync.gates_supported`); False where no device can be used.

    The default of a co-executed build's ``gates``: a build for this machine issues GPU kernels
    ahead of the CPU kernels they read where the device allows it. A library built here and run
    on a device that cannot is refused there by its first gate, with a message naming the switch.
    """
    return opencl_available() and gates_supported()


def coexec_dataflow_lower_passes(
    target: tvm.target.Target,
    kernel_splits: dict | None = None,
    issue_ahead: bool = True,
    gates: bool = False,
) -> list[tvm.transform.Pass]:
    """Leave dataflow form in a co-executed build: TVM's phase without
    ``RewriteDataflowReshape``, with the co-execution sync, the GPU issue order
    (:class:`~codl_tvm.passes.issue_ahead.IssueGpuAhead` unless ``issue_ahead`` is False;
    ``gates``: also ahead of the CPU kernels producing their inputs), the kernel record and
    kernel sharing before ``CallTIRRewrite``.

    TVM 0.27's ``RewriteDataflowReshape`` turns a reshape kernel whose output VDevice differs
    from its input's (or is unset, e.g. a fused inference-mode dropout) into a view bound to a
    new var and leaves the old one undefined, so reshapes stay (small) copy kernels on their
    processor. ``kernel_splits`` not None: record the kernel splits as the module's
    ``codl_kernel_splits`` attribute (:class:`~codl_tvm.passes.kernel_splits.RecordKernelSplits`).
    """
    return [
        relax.transform.ToNonDataflow(),
        relax.transform.RemovePurityChecking(),
        InsertCoexecSync(),
        # after the sync (it orders marks and views), before the record (execution order);
        # without issue_ahead it still records each GPU kernel's CPU producers for timelines
        IssueGpuAhead(gates, reorder=issue_ahead),
        *([RecordKernelSplits()] if kernel_splits is not None else []),
        # after the record: it reads each call's split from its own copy
        ShareIdenticalKernels(),
        relax.transform.CallTIRRewrite(),
    ]


def finalize_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Plan memory and lower to the VM's builtins (TVM's own phase)."""
    return list(gpu_generic.finalize_passes(target))


def weights_passes(weights: dict | None, device: str) -> list[tvm.transform.Pass]:
    """Last, with ``--weights beside``: large constants become fetches of weights loaded beside
    the library (:class:`~codl_tvm.passes.stream_weights.StreamWeights`; ``weights`` receives
    their key and arrays); none when ``weights`` is None (embedded in the library)."""
    return [] if weights is None else [StreamWeights(weights, device)]


def _dump_dir(dump_ir: str | Path | None) -> Path | None:
    if dump_ir is not None:
        return Path(dump_ir)
    alias = os.environ.get(DUMP_IR_ENV)
    return Path(alias) if alias else None


def run_phases(
    mod: tvm.IRModule, phases: list[tuple[str, list]], dump_ir: str | Path | None
) -> tvm.IRModule:
    """``mod`` through the named phases in order, the IR after each written to ``dump_ir`` (or
    the folder :data:`DUMP_IR_ENV` names) where one is given."""
    dump = _dump_dir(dump_ir)
    for i, (name, passes) in enumerate(phases):
        if passes:
            mod = tvm.transform.Sequential(passes)(mod)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{i:02d}-{name}.py").write_text(mod.script(show_meta=False))
    return mod


def single_device_pipeline(
    target: tvm.target.Target,
    cpu=None,
    opencl=None,
    dump_ir: str | Path | None = None,
    weights: dict | None = None,
) -> tvm.transform.Pass:
    """The Relax pipeline for a model that runs on one processor.

    ``cpu`` / ``opencl`` (:class:`~codl_tvm.schedules.CPUConfig` / ``OpenCLConfig``) replace the
    presets the target would get, for algorithm selection and schedules alike. ``dump_ir``: a
    folder that receives the IR after every phase (see the module docstring). ``weights``: a
    dictionary that receives the weights to store beside the library (:func:`weights_passes`).
    """

    @tvm.transform.module_pass(opt_level=0, name="codl.SingleDevicePipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        settings = current_settings()  # read once: both phases get the same switches
        with target:
            phases = [
                ("inference", inference_passes()),
                ("algorithm", algorithm_passes(target, cpu=cpu, opencl=opencl, settings=settings)),
                ("legalize", legalize_passes(target)),
                ("schedule", schedule_passes(target, cpu, opencl, settings)),
                ("dataflow-lower", dataflow_lower_passes(target)),
                ("finalize", finalize_passes(target)),
            ]
            if weights is not None:
                device = "opencl" if "gpu" in target.keys else "cpu"
                phases.append(("weights", weights_passes(weights, device)))
            return run_phases(mod, phases, dump_ir)

    return _pipeline


def coexec_pipeline(
    plan,
    gpu_target: tvm.target.Target,
    cpu_target: tvm.target.Target,
    cpu=None,
    opencl=None,
    channel_blocks: bool = True,
    kernel_splits: dict | None = None,
    row_blocks: bool = False,
    dump_ir: str | Path | None = None,
    weights: dict | None = None,
    issue_ahead: bool = True,
    gates: bool | None = False,
) -> tvm.transform.Pass:
    """The Relax pipeline that co-executes ``plan``'s operators on the GPU and the CPU.

    Build with ``tvm.compile(mod, target=gpu_target, relax_pipeline=coexec_pipeline(...))`` and
    run in ``VirtualMachine(lib, [tvm.opencl(0), tvm.cpu(0)])``. Algorithms are chosen after
    partitioning: each part with its processor's config (``cpu`` / ``opencl`` replace the
    presets of ``cpu_target`` / ``gpu_target``), operators outside the plan with the GPU's.
    ``channel_blocks``: also split the InstanceNorm-like blocks after a split on channels
    (:class:`~codl_tvm.passes.PartitionOperators`; False keeps them whole); ``row_blocks``
    likewise for the LRN-like blocks after an H split, along rows.
    ``kernel_splits``: a dictionary the build fills with every kernel call of ``main`` in
    execution order and the split it computes (:func:`codl_tvm.passes.kernel_splits.
    kernel_splits`), which attributes a timeline's kernels to the plan's splits.
    ``dump_ir``: a folder that receives the IR after every phase (see the module docstring).
    ``weights``: a dictionary that receives the weights to store beside the library
    (:func:`weights_passes`).
    ``issue_ahead``: enqueue each GPU kernel as early as its inputs allow
    (:class:`~codl_tvm.passes.issue_ahead.IssueGpuAhead`); False keeps the host order.
    ``gates``: also ahead of the CPU kernels producing its inputs, held on the device until
    they signal; None: where :func:`gpu_gates_available`, and never with ``weights`` (the weight
    loader's uploads are blocking commands on the queue, which would wait behind a gate). Off by
    default: a gate saves only the host's enqueue latency after a CPU kernel, unmeasured on the
    benchmark devices so far, and serial timelines (``trace_inference(serial=True)``) of gated
    builds show GPU kernels released by a signal up to ~15 us before it (the GPU clock's
    alignment to the host's, estimated from launches).
    """
    if gates is None:
        gates = issue_ahead and weights is None and gpu_gates_available()

    @tvm.transform.module_pass(opt_level=0, name="codl.CoexecPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        settings = current_settings()  # read once: both phases get the same switches
        with gpu_target:
            place = PlaceParts(gpu_target, cpu_target, plan.home)
            phases = [
                ("inference", inference_passes()),
                (
                    "partition",
                    [
                        PartitionOperators(plan, channel_blocks, row_blocks),
                        # the plan's issue order (a placement schedule's), if it has one
                        *([OrderSplits(plan.order)] if plan.order else []),
                    ],
                ),
                ("algorithm", algorithm_passes(gpu_target, cpu_target, cpu, opencl, settings)),
                ("legalize-place-fuse", legalize_passes(gpu_target, place)),
                ("schedule", schedule_passes(gpu_target, cpu, opencl, settings)),
                ("merge", [MergePartsInPlace()]),
                (
                    "dataflow-lower",
                    coexec_dataflow_lower_passes(
                        gpu_target, kernel_splits, issue_ahead, bool(gates)
                    ),
                ),
                ("finalize", finalize_passes(gpu_target)),
            ]
            if weights is not None:
                phases.append(("weights", weights_passes(weights, "opencl")))
            mod = run_phases(mod, phases, dump_ir)
        return take_kernel_splits(mod, kernel_splits)

    return _pipeline


def take_kernel_splits(mod: tvm.IRModule, kernel_splits: dict | None) -> tvm.IRModule:
    """``mod`` without the kernel-split and GPU-input attributes of a co-execution pipeline,
    which go to ``kernel_splits`` (None: dropped): the record is the module's attribute, and
    the caller's dictionary gets it, since ``tvm.compile`` returns the executable, not the
    module."""
    if kernel_splits is not None:
        kernel_splits.clear()
        kernel_splits.update(recorded_kernel_splits(mod) or {})
        # which CPU kernel calls each GPU kernel call waits for (host-caused GPU idle)
        kernel_splits["gpu_inputs"] = {str(k): v for k, v in gpu_inputs(mod).items()}
        mod = mod.without_attr(KERNEL_SPLITS_ATTR)
    return mod.without_attr(GPU_INPUTS_ATTR)
