"""Co-executed builds whose GPU parts compute on OpenCL images (CoDL's hybrid data type).

The GPU part of every split (and a split's only part where the plan gives the GPU all of it)
computes in the texture layout: NCHW4c tensors in OpenCL images, OIHW4o weights arranged per
processor at build time; the CPU parts and every operator outside the plan keep NCHW buffers.
Conversions sit at the GPU parts' ends (CoDL Fig. 8): a conversion kernel packs the shared
tensor (or the slice of it a part reads) into an image where the part starts, and another
unpacks the part's result into its region of the shared output buffer, which the CPU part
writes beside it (:class:`~codl_tvm.passes.merge.MergePartsInPlace` makes that kernel write the
region directly). So the CPU never reads an image and the shared tensors stay buffers; a GPU
chain's part stays in images from its first operator to its last.

:func:`coexec_texture_pipeline` is :func:`codl_tvm.build.pipeline.coexec_pipeline` with these
phases changed or added (the others are the same functions):

- **texture-layout** (after **partition**): ``FoldConstant``, then
  :class:`~codl_tvm.passes.texture_parts.PackGpuParts` (the GPU parts' covered operators to
  NCHW4c; ``main``'s ``codl_texture_parts`` says which parts did and why others did not).
- **legalize-place-fuse**: convs in NCHW4c legalize with TVM's Adreno conv
  (:func:`~codl_tvm.build.texture.legalize_conv2d`), and ``PropagateNaN`` leaves packed kernels
  alone (its NaN test keeps TVM from vectorising image stores), so NaN through max and min on
  the GPU's images follows TIR, as in GPU-alone image builds.
- **scope** (new): :class:`~codl_tvm.passes.texture_scopes.GpuImageScopes` (packed GPU
  tensors in images, within the device's limits),
  :class:`~codl_tvm.passes.texture_call_sites.OwnScopedKernels`,
  ``SpecializePrimFuncBasedOnCallSite``.
- **schedule**: kernels reading or writing images first, with codl-tvm's texture rules and
  dlight's Adreno ones under the texture target (:func:`schedule_images`), then the co-executed
  build's rules for the rest.
- **storage** (after **finalize**): :class:`~codl_tvm.passes.texture_storage.ImageStorages`.

Build with ``tvm.compile(mod, target=gpu, relax_pipeline=pipeline,
tir_pipeline=texture.register_texture_tir_pipeline())`` (TVM's ``TextureFlatten`` and the image
store fix; the rest of TVM's TIR pipeline, which CPU kernels get unchanged) and run with one VM
device per VDevice: ``[opencl, cpu]`` and one ``opencl`` per texture scope
(:func:`vm_device_names`). The VM's device order puts the GPU's buffers at 0 and the CPU at 1,
as the co-execution sync expects.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx
from tvm.s_tir import dlight as dl

from codl_tvm.build import pipeline as coexec
from codl_tvm.build import texture
from codl_tvm.core.errors import DeviceSupportError
from codl_tvm.passes import PartitionOperators
from codl_tvm.passes.fused_targets import RecordFusedTargets, RestoreTargets
from codl_tvm.passes.merge import MergePartsInPlace
from codl_tvm.passes.nan_semantics import PropagateNaN
from codl_tvm.passes.order import OrderSplits
from codl_tvm.passes.place import PlaceParts
from codl_tvm.passes.texture_call_sites import OwnScopedKernels
from codl_tvm.passes.texture_layout import PACK
from codl_tvm.passes.texture_parts import (
    OUTSIDE,
    TEXTURE_PARTS_ATTR,
    PackGpuParts,
    texture_parts,
)
from codl_tvm.passes.texture_scopes import IMAGE_TENSORS_ATTR, GpuImageScopes, image_tensors
from codl_tvm.passes.texture_storage import ImageStorages
from codl_tvm.runtime.images import ImageCaps
from codl_tvm.schedules.opencl_texture import (
    TextureConv2d,
    TextureLayoutTransform,
    TexturePool2D,
    is_texture_scope,
)
from codl_tvm.schedules.settings import current_settings

__all__ = [
    "VM_DEVICES",
    "coexec_gpu_data_type",
    "coexec_gpu_dtype",
    "coexec_texture_pipeline",
    "compile_coexec_images",
    "image_record",
    "legalize_place_fuse_passes",
    "schedule_images",
    "scope_passes",
    "vm_device_names",
]


#: The VM's devices of a co-executed image build: the GPU's buffers, the CPU, and one slot per
#: texture scope :class:`~codl_tvm.passes.texture_scopes.GpuImageScopes` may use (a VM given
#: more slots than its module declares leaves the rest unused).
VM_DEVICES = ("opencl", "cpu", "opencl", "opencl")

logger = logging.getLogger(__name__)


def coexec_gpu_data_type(caps: ImageCaps | None, data_type: str, dtype: str) -> tuple[str, str]:
    """The data type of a co-executed build's GPU parts when ``data_type`` and ``dtype`` are
    asked, and why it is buffers where something else was asked (else ``""``).

    ``"image"`` needs a device with RGBA float images (``caps``; None: a cross-compiling
    preset, built as asked); a tensor beyond its image limits stays a buffer, with the reason
    (:class:`~codl_tvm.passes.texture_scopes.GpuImageScopes`), where a GPU-alone build raises.
    ``"auto"`` decides by capability here (images where the device has them, else buffers and
    why); a compile that measures then times both
    (:func:`codl_tvm.objectives.gpu_data.prepare_coexec_gpu_data`). ``"float16"`` GPU parts
    compute on half images (:func:`coexec_gpu_dtype`); buffer GPU parts stay float32 (the
    reason says so).

    Raises
    ------
    DeviceSupportError
        ``"image"`` on a device without usable images, or ``"image"`` in float16 on one
        without ``cl_khr_fp16`` or half images (one line naming the device and what it lacks).
    """
    notes = []
    missing = "" if caps is None else texture.missing_image_support(caps, "float32")
    if dtype == "float16" and not missing and data_type != "buffer" and caps is not None:
        half = _missing_half(caps)
        if half and data_type == "image":
            raise DeviceSupportError(f"{half}, which gpu_dtype 'float16' needs", ("gpu_dtype",))
        if half:  # auto: float32 images, and why
            notes.append(f"{half}: the GPU parts compute in float32")
    if dtype != "float32" and (data_type == "buffer" or missing):
        notes.append(
            f"gpu_dtype {dtype!r} applies to co-executed GPU parts on images; buffer GPU parts "
            "compute in float32"
        )
    if data_type == "auto" and missing:
        # auto never fails on a device without images: buffers, and why
        return "buffer", "; ".join([*notes, f"{missing}: the GPU parts keep buffers"])
    if data_type == "image" and missing:
        raise DeviceSupportError(
            f"{missing}; gpu_data_type 'image' needs images (use 'buffer')", ("gpu_data_type",)
        )
    return ("image" if data_type == "auto" else data_type), "; ".join(notes)


def _missing_half(caps: ImageCaps) -> str:
    """What the device ``caps`` describes lacks for half images (``cl_khr_fp16``, RGBA
    CL_HALF_FLOAT image2d arrays), or ``""``."""
    if not caps.fp16:
        return f"OpenCL device '{caps.device}' lacks cl_khr_fp16"
    return texture.missing_image_support(caps, "float16")


def coexec_gpu_dtype(caps: ImageCaps | None, data_type: str, dtype: str) -> str:
    """What a co-executed build's GPU parts compute in, given what :func:`coexec_gpu_data_type`
    decided (``data_type``, ``"image"`` or ``"buffer"``) and the asked ``dtype``: float16 on
    images of a device with ``cl_khr_fp16`` and half images (``caps`` None: a cross-compiling
    preset, as asked), float32 otherwise (buffer GPU parts, the CPU parts: float32 always)."""
    if dtype != "float16" or data_type != "image":
        return "float32"
    return "float16" if caps is None or not _missing_half(caps) else "float32"


def _packed_kernel(func: tirx.PrimFunc) -> bool:
    """Whether a kernel reads or writes an NCHW4c tensor (a 5-D buffer of 4-wide pixels)."""
    # buffer parameters carry their shape and scope; scalar parameters have neither
    for param in func.params:
        shape = getattr(param, "shape", None) if hasattr(param, "scope") else None
        if shape is not None and len(shape) == 5 and int(shape[-1]) == PACK:
            return True
    return False


@tvm.transform.module_pass(opt_level=0, name="codl.PropagateNaNOnBuffers")
def _propagate_nan_on_buffers(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """``PropagateNaN`` on every kernel but the packed ones (see the module docstring)."""
    buffers = {
        gv: f
        for gv, f in mod.functions_items()
        if isinstance(f, tirx.PrimFunc) and not _packed_kernel(f)
    }
    if not buffers:
        return mod
    done = PropagateNaN()(tvm.IRModule(buffers))
    out = mod.clone()
    for gv, func in done.functions_items():
        out.update_func(out.get_global_var(gv.name_hint), func)
    return out


def legalize_place_fuse_passes(
    target: tvm.target.Target, place: tvm.transform.Pass
) -> list[tvm.transform.Pass]:
    """:func:`codl_tvm.build.pipeline.legalize_passes` of a co-executed build, with NCHW4c convs
    legalized by TVM's Adreno conv and NaN propagation on buffer kernels only."""
    return [
        relax.transform.LegalizeOps({"relax.nn.conv2d": texture.legalize_conv2d}),
        _propagate_nan_on_buffers,
        # the rest as legalize_passes orders it: placement before fusion, the fences removed
        # right after it, the kernels' targets carried through FuseTIR
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        place,
        relax.transform.FuseOps(),
        relax.transform.CanonicalizeBindings(),
        RecordFusedTargets(),
        relax.transform.FuseTIR(),
        RestoreTargets(),
    ]


def scope_passes(gpu_target: tvm.target.Target, caps: ImageCaps | None) -> list[tvm.transform.Pass]:
    """Packed GPU tensors in images, and each kernel's buffers in its call site's scopes.

    The images stay within the device's limits (``caps``), or without it (a device this
    machine cannot ask) within the target's (``texture_spatial_limit``,
    ``texture_depth_limit``: TVM's 16384 and 2048 by default), as GPU-alone builds do."""
    if caps is not None:
        limits = (caps.image2d_max_width, caps.image2d_max_height, caps.image_max_array_size)
    else:
        spatial = int(gpu_target.attrs["texture_spatial_limit"])
        limits = (spatial, spatial, int(gpu_target.attrs["texture_depth_limit"]))
    return [
        GpuImageScopes(gpu_target, limits),
        OwnScopedKernels(),
        relax.transform.SpecializePrimFuncBasedOnCallSite(),
        relax.transform.Normalize(),
    ]


def _image_kernel(func) -> bool:
    if not isinstance(func, tirx.PrimFunc):
        return False
    return any(is_texture_scope(p.scope()) for p in func.params if hasattr(p, "scope"))


def schedule_images(texture_target: tvm.target.Target) -> tvm.transform.Pass:
    """Schedule the kernels that read or write images with codl-tvm's texture rules and
    dlight's Adreno and GPU rules, under ``texture_target`` (the GPU's target with the texture
    keys those rules gate on); each kernel keeps its own target for code generation."""

    rules = [
        dl.ApplyDefaultSchedule(
            TextureLayoutTransform(),
            TextureConv2d(),
            TexturePool2D(),
            dl.adreno.Conv2d(),
            dl.adreno.Fallback(),
        ),
        dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()),
    ]

    @tvm.transform.module_pass(opt_level=0, name="codl.ScheduleImageKernels")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        images = {gv: f for gv, f in mod.functions_items() if _image_kernel(f)}
        if not images:
            return mod
        targets = {gv.name_hint: f.attrs["target"] for gv, f in images.items()}
        sub = tvm.IRModule({gv: f.with_attr("target", texture_target) for gv, f in images.items()})
        with texture_target:
            done = tvm.transform.Sequential(rules)(sub)
        out = mod.clone()
        for gv, func in done.functions_items():
            out.update_func(
                out.get_global_var(gv.name_hint), func.with_attr("target", targets[gv.name_hint])
            )
        return out

    return _schedule


def image_record(mod: tvm.IRModule) -> list[dict]:
    """Each split's GPU part and its data type, from a module after the scope phase: the
    :func:`~codl_tvm.passes.texture_parts.texture_parts` record, with a part whose packed
    tensors all stayed in buffers (:func:`~codl_tvm.passes.texture_scopes.image_tensors`)
    turned to ``"buffer"`` and the reason."""
    rows = texture_parts(mod) or []
    tensors = image_tensors(mod) or {"images": {}, "buffers": {}}
    for row in rows:
        if row["data_type"] != "image":
            continue
        # kernels outside every split carry no split name
        split = "" if row["split"] == OUTSIDE else row["split"]
        row["images"] = tensors["images"].get(split, 0)
        kept = tensors["buffers"].get(split, [])
        if not row["images"]:
            row["data_type"] = "buffer"
            row["why"] = kept[0] if kept else "no packed tensor of its own (fused away)"
    return rows


def vm_device_names(mod: tvm.IRModule) -> list[str]:
    """The VM's device names (``"opencl"``, ``"cpu"``), one per VDevice of the lowered module."""
    vdevices = mod.global_infos.get("vdevice", ()) if mod.global_infos else ()
    return ["cpu" if v.target.kind.name == "llvm" else "opencl" for v in vdevices]


def coexec_texture_pipeline(
    plan,
    gpu_target: tvm.target.Target,
    cpu_target: tvm.target.Target,
    caps: ImageCaps | None = None,
    channel_blocks: bool = True,
    kernel_splits: dict | None = None,
    row_blocks: bool = False,
    weights: dict | None = None,
    issue_ahead: bool = True,
    record: dict | None = None,
    dtype: str = "float32",
    gates: bool | None = False,
) -> tvm.transform.Pass:
    """The co-execution pipeline with the GPU parts on images (phases in the module docstring).

    The arguments are :func:`~codl_tvm.build.pipeline.coexec_pipeline`'s (``gates`` as
    there: a gate holds the queue, image kernels and conversions included, until the CPU
    kernel it waits for signals; no fixed CPU/OpenCL configs: each target's presets; no
    ``dump_ir``: ``CODL_TVM_DUMP_IR`` names the folder), and ``caps``, the device's image
    limits (None: TVM's defaults), and ``record``, a dictionary receiving ``"gpu_parts"``
    (each split's GPU part data type, :func:`image_record`) and ``"vm_devices"``
    (:func:`vm_device_names`). ``dtype``: what the GPU parts' packed operators compute in
    (``"float16"``: half images, cast at the parts' conversions,
    :class:`~codl_tvm.passes.texture_parts.PackGpuParts`; the CPU parts and the shared
    tensors float32).
    """
    tex_target = texture.texture_target(gpu_target, caps)
    if gates is None:
        gates = issue_ahead and weights is None and coexec.gpu_gates_available()

    @tvm.transform.module_pass(opt_level=0, name="codl.CoexecTexturePipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        settings = current_settings()
        texture.install_texture_size_fix()
        with gpu_target:
            place = PlaceParts(gpu_target, cpu_target, plan.home)
            partition = [PartitionOperators(plan, channel_blocks, row_blocks)]
            if plan.order:
                partition.append(OrderSplits(plan.order))
            phases = [
                ("inference", coexec.inference_passes()),
                ("partition", partition),
                ("texture-layout", [relax.transform.FoldConstant(), PackGpuParts(dtype)]),
                (
                    "algorithm",
                    coexec.algorithm_passes(gpu_target, cpu_target, settings=settings),
                ),
                ("legalize-place-fuse", legalize_place_fuse_passes(gpu_target, place)),
                ("scope", [*scope_passes(gpu_target, caps), _take_image_record(record)]),
                (
                    "schedule",
                    [
                        schedule_images(tex_target),
                        *coexec.schedule_passes(gpu_target, settings=settings),
                    ],
                ),
                ("merge", [MergePartsInPlace()]),
                (
                    "dataflow-lower",
                    coexec.coexec_dataflow_lower_passes(
                        gpu_target, kernel_splits, issue_ahead, bool(gates)
                    ),
                ),
                ("finalize", coexec.finalize_passes(gpu_target)),
                ("storage", [ImageStorages()]),
            ]
            if weights is not None:
                phases.append(("weights", coexec.weights_passes(weights, "opencl")))
            mod = coexec.run_phases(mod, phases, None)  # CODL_TVM_DUMP_IR: the IR of each phase
        if record is not None:
            record["vm_devices"] = vm_device_names(mod)
        return coexec.take_kernel_splits(mod, kernel_splits)

    return _pipeline


def _take_image_record(record: dict | None) -> tvm.transform.Pass:
    """After the scope phase: the GPU parts' record to ``record["gpu_parts"]`` (None: dropped),
    and their attributes off ``main``."""

    @tvm.transform.module_pass(opt_level=0, name="codl.TakeImageRecord")
    def _take(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if record is not None:
            record["gpu_parts"] = image_record(mod)
        main = mod.get_global_var("main")
        mod = mod.clone()
        mod.update_func(
            main, mod[main].without_attr(TEXTURE_PARTS_ATTR).without_attr(IMAGE_TENSORS_ATTR)
        )
        return mod

    return _take


def compile_coexec_images(
    mod: tvm.IRModule,
    plan,
    gpu_target: tvm.target.Target,
    cpu_target: tvm.target.Target,
    caps: ImageCaps | None = None,
    **options,
) -> tuple[tvm.runtime.Executable, dict]:
    """Build ``mod`` co-executing ``plan`` with the GPU parts on images.

    ``options`` are :func:`coexec_texture_pipeline`'s other keyword arguments (``dtype``:
    ``"float16"`` GPU parts on half images). Returns the executable and the record
    (``gpu_parts``, ``vm_devices``; see :func:`coexec_texture_pipeline`).
    """
    record: dict = {}
    pipeline = coexec_texture_pipeline(
        plan, gpu_target, cpu_target, caps=caps, record=record, **options
    )
    tir = texture.register_texture_tir_pipeline()
    executable = tvm.compile(mod, target=gpu_target, relax_pipeline=pipeline, tir_pipeline=tir)
    images = [r["split"] for r in record["gpu_parts"] if r["data_type"] == "image"]
    logger.info(
        "co-executed build: the GPU parts of %d of %d splits compute on %s images%s",
        len(images),
        len(record["gpu_parts"]),
        options.get("dtype", "float32"),
        "" if len(images) == len(record["gpu_parts"]) else "; the record says why not the others",
    )
    return executable, record
