"""Build GPU operators that compute in the texture layout (OpenCL images), CoDL's GPU data type.

CoDL keeps the GPU's tensors in images and the CPU's in buffers, converting at chain
boundaries. This module builds the GPU side: ``build_texture_gpu(mod, target)`` compiles a
Relax module whose covered operators (convs with their bias and activation, pools, elementwise
ops) compute on NCHW4c tensors in ``global.texture*`` scopes with OIHW4o weights arranged at
build time. ``codl-tvm compile --device opencl --gpu-data-type image`` builds whole models with
it (:func:`codl_tvm.build.cache.build_library`); co-executed builds reuse its phases for their
GPU parts (:mod:`codl_tvm.build.texture_coexec`).

The Relax pipeline, as phases (TVM's Adreno backend, ``tvm/relax/backend/adreno/pipeline.py``,
with the pinned wheel's bugs worked around):

0. **inference**: the inference simplifications of codl-tvm's other builds (parameter names,
   the ONNX importer's Clip kernels as ``R.clip``, batch norms folded into convs, pairwise
   Sum/Max/Min, LRN's window as shifted adds), and
   with ``dtype="float16"`` TVM's ``ToMixedPrecision`` (convs and matmuls accumulate in half;
   the inputs and outputs stay float32, cast at the model's ends).
1. **layout**: ``FoldConstant`` (the frontend's bias reshapes become constants), then
   :class:`~codl_tvm.passes.texture_layout.ToTextureLayout` in place of TVM's
   ``ConvertLayout``, which segfaults for packed layouts with apache-tvm-ffi 0.1.15.
2. **scope**: TVM's partial legalization (convs and pools kept), ``AnnotateCustomMemoryScope``
   (texture scopes on the VDevices of 5-D tensors whose consumers read images), the remaining
   legalization and the Adreno conv (``conv2d_NCHWc_OIHWo`` for NCHW4c convs; convs left NCHW
   keep TVM's legalization; no ``PropagateNaN``, which keeps image stores from vectorising, so
   max/min of a NaN follow TIR, not ONNX), fusion, ``FoldVDeviceScopeChange``,
   :class:`~codl_tvm.passes.texture_scope_copy.TextureScopeCopies` (a tensor a kernel writes in
   one texture scope and the next reads in another is copied by a kernel: no image copy
   changes an image's extents), :class:`~codl_tvm.passes.texture_call_sites.OwnScopedKernels`
   (a PrimFunc shared by call sites of different scopes gets a copy per scope signature) and
   ``SpecializePrimFuncBasedOnCallSite`` (PrimFunc buffers take their call site's scope).
3. **schedule**: codl-tvm's :class:`~codl_tvm.schedules.opencl_texture.TextureLayoutTransform`
   (whole-pixel conversion kernels) and :class:`~codl_tvm.schedules.opencl_texture.
   TextureConv2d` (dlight's Adreno conv tiling reading the input image itself instead of a
   padded copy in a buffer; depthwise convs too, legalized by :func:`depthwise_conv2d_nchw4c`)
   and :class:`~codl_tvm.schedules.opencl_texture.TexturePool2D` (dlight's Adreno ``Pool2D``
   gives a pixel's four channels one register; global average pools too), then dlight's
   Adreno conv and fallback rules and its GPU rules.
4. **dataflow-lower**, **finalize**: TVM's ``gpu_generic`` phases.
5. **storage**: :class:`~codl_tvm.passes.texture_storage.ImageStorages` gives every texture
   tensor an image storage of its own shape (TVM plans flat ``global`` storages for Adreno
   targets, whose image views need ``cl_khr_image2d_from_buffer`` for image arrays, which PoCL
   refuses).
6. **weights** (``weights`` given): large constants fetched from a weights file beside the
   library (:class:`~codl_tvm.passes.stream_weights.StreamWeights`).

Images and the device: :func:`texture_target` gives TVM's scope annotation the device's image
limits (``texture_spatial_limit``, ``texture_depth_limit``; a tensor no image of the device can
hold stays a buffer). :func:`image_support` says, before anything is built, whether a model's
packed tensors fit the device's images (:func:`check_device` raises where the build was asked
for images or half precision the device lacks).

TIR: :func:`register_texture_tir_pipeline` registers :data:`TEXTURE_TIR_PIPELINE` (TVM's
``tir_pipeline="adreno"`` is a single pass where ``tvm.compile`` expects a (device, host,
device-finalize) triple). It runs TVM's ``TextureFlatten`` and then
:func:`texture_store_type_fix`: in the wheel ``TextureFlatten`` types each image store by its
image's pointer type, so ``VectorizeLoop`` takes it for a non-primitive call and scalarises the
pixel loop, and every pixel written gets one channel in all four lanes. Then TVM's Adreno TIR
pipeline.

Memory: TVM's memory planner sizes a texture tensor's storage by multiplying the image's size
in bytes (``DeviceGetMemSize.opencl``) by the element size again, 4x too large for float32. The
storage only backs the image, so this wastes memory without changing results;
:func:`install_texture_size_fix` (called by :func:`build_texture_gpu`) corrects it.

Running: export the executable and load it with codl-tvm's OpenCL runtime
(:mod:`codl_tvm.runtime`, whose allocator makes texture-scoped storages images and passes them
to kernels as image arguments). ``AnnotateCustomMemoryScope`` rewrites
``global_infos["vdevice"]`` to one VDevice per memory scope, and the VM indexes its device list
with them (each allocation's slot also gives its tensor's view its scope, so the slots cannot
be merged): create it with :meth:`TextureBuild.vm_devices`. A build has at most
:data:`VM_DEVICE_SLOTS` VDevices (``global`` and the three texture scopes); a VM given more
slots than its module declares leaves the rest unused, so an artifact lists its OpenCL device
that many times.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax, tirx, topi
from tvm.relax.backend import gpu_generic
from tvm.relax.backend.adreno import transform as adreno_relax
from tvm.s_tir import dlight as dl
from tvm.s_tir.backend.adreno import pipeline as adreno_tir
from tvm.s_tir.backend.adreno import transform as adreno_tir_transform
from tvm.tirx import compilation_pipeline

from codl_tvm.core.errors import DeviceSupportError
from codl_tvm.core.plan import static_shape
from codl_tvm.passes.fold_bn import FoldBatchNorm
from codl_tvm.passes.imported_clip import ImportedClip
from codl_tvm.passes.lrn import LRNWindowSum
from codl_tvm.passes.param_names import SanitizeParamNames
from codl_tvm.passes.rewrite import op_name
from codl_tvm.passes.stream_weights import StreamWeights
from codl_tvm.passes.texture_call_sites import OwnScopedKernels
from codl_tvm.passes.texture_layout import PACK, POOL_OPS, ToTextureLayout
from codl_tvm.passes.texture_scope_copy import TextureScopeCopies
from codl_tvm.passes.texture_scopes import TEXTURE_SCOPE_AXIS, image_extents
from codl_tvm.passes.texture_storage import ImageStorages
from codl_tvm.passes.variadic import PairwiseVariadic
from codl_tvm.runtime.images import ImageCaps
from codl_tvm.schedules.opencl_texture import (
    DEPTHWISE_BLOCK,
    TextureConv2d,
    TextureLayoutTransform,
    TexturePool2D,
)

__all__ = [
    "DTYPES",
    "TEXTURE_SCOPE_AXIS",
    "TEXTURE_TIR_PIPELINE",
    "VM_DEVICE_SLOTS",
    "ImageSupport",
    "TextureBuild",
    "build_texture_gpu",
    "check_device",
    "depthwise_conv2d_nchw4c",
    "image_extents",
    "image_support",
    "inference_passes",
    "install_texture_size_fix",
    "layout_passes",
    "legalize_conv2d",
    "missing_image_support",
    "own_constants",
    "packed_tensors",
    "register_texture_tir_pipeline",
    "schedule_passes",
    "scope_passes",
    "texture_pipeline",
    "texture_store_type_fix",
    "texture_target",
    "texture_tir_pipeline",
]

logger = logging.getLogger(__name__)

#: Name under which :func:`register_texture_tir_pipeline` registers the TIR pipeline.
TEXTURE_TIR_PIPELINE = "codl_texture"

#: Ops TVM's Adreno pipeline keeps unlegalized until memory scopes are annotated (the scope
#: annotation reads their layout attributes).
_SCOPE_OPS = [
    "relax.nn.conv2d",
    "relax.nn.max_pool2d",
    "relax.nn.avg_pool2d",
    "relax.nn.adaptive_avg_pool2d",
]

_TEXTURE_KEYS = ("adreno", "texture")
# the planner's hook for texture sizes, and where the original is kept once replaced
_SIZE_HOOK = "DeviceGetMemSize.opencl"
_SIZE_HOOK_ORIGINAL = "codl.texture.DeviceGetMemSize.opencl.tvm"


def texture_target(gpu: tvm.target.Target, caps: ImageCaps | None = None) -> tvm.target.Target:
    """``gpu`` (an OpenCL target) with the keys that turn on TVM's texture lowering.

    ``adreno`` enables dlight's Adreno rules (they gate on it), ``texture`` TVM's texture
    passes. JSON targets without them build buffers; the tag ``qcom/adreno-opencl-texture``
    has both. ``caps`` (the device's, :func:`codl_tvm.runtime.images.image_caps`) sets the
    image limits TVM's scope annotation keeps tensors within (``texture_spatial_limit``: rows
    and pixels per row, ``texture_depth_limit``: layers); without it the target's own stay
    (TVM's default, 16384 and 2048).
    """
    if gpu.kind.name != "opencl":
        raise ValueError(f"gpu: texture builds need an OpenCL target, got {gpu.kind.name!r}")
    config = dict(gpu.export())
    keys = list(config.get("keys", ()))
    config["keys"] = [*keys, *(k for k in _TEXTURE_KEYS if k not in keys)]
    if caps is not None:
        config["texture_spatial_limit"] = min(caps.image2d_max_width, caps.image2d_max_height)
        config["texture_depth_limit"] = caps.image_max_array_size
    host = config.pop("host", None)
    config.pop("tag", None)
    return tvm.target.Target(config, host=host)


#: The most VDevices a texture build declares: ``global`` and the three texture scopes.
VM_DEVICE_SLOTS = 4

#: Data types of GPU tensors a build can ask for.
DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class ImageSupport:
    """Whether a model's GPU tensors can be images on a device, and why not.

    Attributes
    ----------
    device
        The device's name.
    reason
        Why images cannot be used (one line naming the device and the missing feature or the
        limit), or ``""`` where they can.
    """

    device: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def packed_tensors(mod: tvm.IRModule) -> list[tuple[str, tuple[int, ...]]]:
    """``(op, NCHW4c shape)`` of every packed tensor a texture build's convs and pools read or
    write, from ``mod`` as imported (the layout phase runs on a copy)."""
    laid = tvm.transform.Sequential([*inference_passes(), *layout_passes()])(mod)
    found: dict[tuple[int, ...], str] = {}
    for _gv, func in laid.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                name = op_name(b.value)
                if name != "relax.nn.conv2d" and name not in POOL_OPS:
                    continue
                for expr in (b.value.args[0], b.var):
                    shape = static_shape(expr)
                    if shape is not None and len(shape) == 5 and shape[-1] == PACK:
                        found.setdefault(tuple(shape), name.rpartition(".")[2])
    return [(op, shape) for shape, op in found.items()]


def missing_image_support(caps: ImageCaps, dtype: str = "float32") -> str:
    """Why the device ``caps`` describes has no images a build could use (no image support,
    no RGBA image2d arrays of ``dtype``), or ``""``; whatever the model."""
    dev = caps.device
    if not caps.image_support:
        return f"OpenCL device '{dev}' has no image support (CL_DEVICE_IMAGE_SUPPORT is false)"
    if not caps.supports(dtype):
        kind = "CL_HALF_FLOAT" if dtype == "float16" else "CL_FLOAT"
        return f"OpenCL device '{dev}' has no RGBA {kind} image2d arrays"
    return ""


def image_support(mod: tvm.IRModule, caps: ImageCaps, dtype: str = "float32") -> ImageSupport:
    """Whether every packed tensor of ``mod``'s convs and pools fits an image of the device
    ``caps`` describes, in one of TVM's texture scopes (:func:`image_extents`).

    The first reason found is kept: no image support, no RGBA images of ``dtype``, or a tensor
    wider, taller or deeper than every scope's image can be (e.g. ``H * W`` pixels beyond
    ``CL_DEVICE_IMAGE2D_MAX_WIDTH``).
    """
    dev = caps.device
    missing = missing_image_support(caps, dtype)
    if missing:
        return ImageSupport(dev, missing)
    limits = (caps.image2d_max_width, caps.image2d_max_height, caps.image_max_array_size)
    for op, shape in packed_tensors(mod):
        fits = [
            all(e <= lim for e, lim in zip(image_extents(shape, scope), limits))
            for scope in TEXTURE_SCOPE_AXIS
        ]
        if any(fits):
            continue
        # the narrowest image the tensor could be: its rows of W pixels (global.texture)
        width, height, depth = image_extents(shape, "global.texture")
        n, c4, h, w, _ = shape
        if width > limits[0]:
            what = f"{width} pixels wide, beyond CL_DEVICE_IMAGE2D_MAX_WIDTH = {limits[0]}"
        elif height > limits[1]:
            what = f"{height} rows high, beyond CL_DEVICE_IMAGE2D_MAX_HEIGHT = {limits[1]}"
        else:
            what = f"{depth} layers, beyond CL_DEVICE_IMAGE_MAX_ARRAY_SIZE = {limits[2]}"
        return ImageSupport(
            dev,
            f"OpenCL device '{dev}' cannot hold the {op} tensor of shape "
            f"{(n, c4 * PACK, h, w)} in an image: every image layout of it is at least {what}",
        )
    return ImageSupport(dev)


def check_device(mod: tvm.IRModule, caps: ImageCaps, data_type: str, dtype: str) -> tuple[str, str]:
    """The GPU data type a build of ``mod`` gets on the device ``caps`` describes, and why.

    Parameters
    ----------
    mod
        The model as imported.
    caps
        The device's image support (:func:`codl_tvm.runtime.images.image_caps`).
    data_type
        ``"image"`` (asked for: a device that cannot is an error), ``"auto"`` (images where the
        device can hold every packed tensor, else buffers) or ``"buffer"``.
    dtype
        ``"float32"`` or ``"float16"`` (GPU tensors in half: needs ``cl_khr_fp16``).

    Returns
    -------
    tuple[str, str]
        ``("image" | "buffer", reason)``; the reason says why ``auto`` chose buffers
        (``""`` otherwise).

    Raises
    ------
    DeviceSupportError
        ``dtype`` is float16 and the device lacks ``cl_khr_fp16``, or ``data_type`` is
        ``"image"`` and the model's tensors cannot be the device's images (one line naming the
        device and the limit or feature).
    """
    if dtype == "float16" and not caps.fp16:
        raise DeviceSupportError(
            f"OpenCL device '{caps.device}' lacks cl_khr_fp16, which gpu_dtype 'float16' needs",
            ("gpu_dtype",),
        )
    if data_type == "buffer":
        return "buffer", ""
    support = image_support(mod, caps, dtype)
    if support.ok:
        return "image", ""
    if data_type == "image":
        raise DeviceSupportError(
            f"{support.reason}; gpu_data_type 'image' needs images (use 'buffer')",
            ("gpu_data_type",),
        )
    return "buffer", support.reason


def texture_store_type_fix() -> tvm.transform.Pass:
    """A TIR pass giving image stores (``texture2d_store`` calls) the ``void`` type.

    TVM 0.27's ``TextureFlatten`` types them with the image's pointer type; ``VectorizeLoop``
    then treats the store as a non-primitive call and scalarises the loop over a pixel's four
    channels, each scalar store writing a whole pixel (channel ``4k + 3`` wins everywhere).
    Run right after ``TextureFlatten``.
    """
    store = tvm.ir.Op.get("tirx.texture2d_store")

    def fix(call: tvm.ir.Call):
        if not call.op.same_as(store) or isinstance(call.ty, tvm.ir.PrimType):
            return call
        return tvm.ir.Call(store, list(call.args), ret_ty=tvm.ir.PrimType("void"))

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="codl.TextureStoreType")
    def _fix(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
        body = tvm_ffi.structural_map(func.body, [(tvm.ir.Call, fix)])
        return func if body.same_as(func.body) else func.with_body(body)

    return _fix


def texture_tir_pipeline():
    """The TIR pipeline triple of :data:`TEXTURE_TIR_PIPELINE` (see the module docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="codl.TextureTIRPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        passes = [
            adreno_tir_transform.TextureFlatten(),
            texture_store_type_fix(),
            # TVM's Adreno pipeline flattens again: a no-op on flattened accesses
            adreno_tir.default_tir_pipeline(),
        ]
        return tvm.transform.Sequential(passes)(mod)

    return (
        _pipeline,
        compilation_pipeline.finalize_host_passes,
        compilation_pipeline.finalize_device_passes,
    )


def register_texture_tir_pipeline() -> str:
    """Register the texture TIR pipeline with TVM (once; later calls change nothing) and
    return its name, the ``tir_pipeline`` argument of ``tvm.compile``."""
    if compilation_pipeline.PIPELINE_MAP.get(TEXTURE_TIR_PIPELINE) is not texture_tir_pipeline:
        compilation_pipeline.register_tir_pipeline(TEXTURE_TIR_PIPELINE, texture_tir_pipeline)
    return TEXTURE_TIR_PIPELINE


def install_texture_size_fix() -> None:
    """Make TVM's memory planner size texture storage by the image's bytes (once).

    The planner multiplies ``DeviceGetMemSize.opencl``'s result, already in bytes, by the
    element size (``StorageToken`` in ``static_plan_block_memory.cc``); the replacement divides
    it back. Only texture scopes reach the hook. The original stays registered under another
    name, which is also how a second call knows it is done.
    """
    if tvm.get_global_func(_SIZE_HOOK_ORIGINAL, allow_missing=True) is not None:
        return
    original = tvm.get_global_func(_SIZE_HOOK)
    tvm.register_global_func(_SIZE_HOOK_ORIGINAL, original)

    def texture_bytes(shape, dtype, vdevice):
        nbytes = int(original(shape, dtype, vdevice))
        element = tvm.DataType(str(dtype)).bits // 8
        # rows are padded to the image alignment (64 bytes): a multiple of any element size
        return tvm.tirx.IntImm("int64", nbytes // element)

    tvm.register_global_func(_SIZE_HOOK, texture_bytes, override=True)
    logger.debug("texture storage sizes: replaced %s", _SIZE_HOOK)


def inference_passes(dtype: str = "float32") -> list[tvm.transform.Pass]:
    """The inference simplifications of codl-tvm's other builds (names, batch norms, variadic
    ops, LRN), then, for ``dtype="float16"``, TVM's ``ToMixedPrecision`` accumulating in half."""
    passes = [
        SanitizeParamNames(),
        # ToMixedPrecision rejects R.clip (PrimValue bounds): ReLU6 as maximum and minimum
        ImportedClip(clip=dtype != "float16"),
        FoldBatchNorm(),
        PairwiseVariadic(),
        LRNWindowSum(),
    ]
    if dtype == "float16":
        passes += [
            relax.transform.ConvertToDataflow(),
            relax.transform.ToMixedPrecision(out_dtype="float16"),
        ]
    elif dtype != "float32":
        raise ValueError(f"dtype: one of {DTYPES}, got {dtype!r}")
    return passes


def layout_passes() -> list[tvm.transform.Pass]:
    """Rewrite covered operators to NCHW4c/OIHW4o (weights arranged at build time)."""
    return [relax.transform.FoldConstant(), ToTextureLayout()]


def depthwise_conv2d_nchw4c(data, kernel, strides, padding, dilation, out_dtype: str):
    """A depthwise conv over NCHW4c ``data`` with (C/4, 1, KH, KW, 4) ``kernel`` (topi's
    generic ``depthwise_conv2d_NCHWc`` is unimplemented): each lane of an output pixel sums
    its own channel's window, so a pixel's four channels are one vector throughout."""
    _, _, kh, kw, _ = (int(d) for d in kernel.shape)
    (sh, sw), (dh, dw) = (int(s) for s in strides), (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    n, blocks, h, w, lanes = data.shape
    oh = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    ow = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    pad = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="dw_data_pad")
    ry, rx = tvm.te.reduce_axis((0, kh), "ry"), tvm.te.reduce_axis((0, kw), "rx")
    return tvm.te.compute(
        (n, blocks, oh, ow, lanes),
        lambda b, c, y, x, i: tvm.te.sum(
            pad[b, c, y * sh + ry * dh, x * sw + rx * dw, i].astype(out_dtype)
            * kernel[c, 0, ry, rx, i].astype(out_dtype),
            axis=[ry, rx],
        ),
        name=DEPTHWISE_BLOCK,
    )


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """TVM's Adreno legalization for dense NCHW4c convs, :func:`depthwise_conv2d_nchw4c` for
    depthwise ones, TVM's default one for convs left NCHW (grouped convs); a ``LegalizeOps``
    customization for ``relax.nn.conv2d``. The kernel's output gets the type
    ``AnnotateCustomMemoryScope`` gave the call (its ``ty_args``, as TVM's Adreno legalization):
    ``call_te`` alone takes the VDevice of a positional tensor argument (the dense conv has
    none), and a conv without epilogue then left its output, and the pool behind it (which TVM
    types by its input), in buffers. Calls without ``ty_args`` (co-executed builds) keep it."""
    a = call.attrs
    ty_args = list(call.ty_args)  # [] lets call_te type the output itself
    vdevice = ty_args[0].vdevice if ty_args else None
    # the kernel carries the VDevice's target, else LegalizeOps renames a copy of it "..._opencl"
    attrs = None if vdevice is None else {"target": vdevice.target}
    typed = {"ty_args": ty_args, "primfunc_attrs": attrs}
    if str(a.data_layout) != "NCHW4c":
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    if int(a.groups) != 1:  # codl.ToTextureLayout packs depthwise convs only
        return bb.call_te(
            depthwise_conv2d_nchw4c,
            call.args[0],
            call.args[1],
            a.strides,
            a.padding,
            a.dilation,
            str(call.ty.dtype),
            **typed,
            primfunc_name_hint="depthwise_conv2d_NCHW4c",
        )
    # TVM's legalization (legalize_ops/adreno) leaves out out_dtype: float32 whatever the
    # conv's type, which a float16 model's fusion then refuses; the call's type is the conv's
    return bb.call_te(
        topi.nn.conv2d_NCHWc_OIHWo,
        data=call.args[0],
        kernel=call.args[1],
        stride=a.strides,
        padding=a.padding,
        dilation=a.dilation,
        layout=a.data_layout,
        out_layout=a.out_layout,
        out_dtype=str(call.ty.dtype),
        **typed,
        primfunc_name_hint="conv2d_NCHWc_OIHWo",
    )


def scope_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Give image-friendly tensors texture scopes, legalize and fuse (TVM's Adreno order)."""
    return [
        tirx.transform.BindTarget(target),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.Normalize(),
        relax.transform.LegalizeOps(skip_ops=_SCOPE_OPS),
        relax.transform.AnnotateTIROpPattern(),
        adreno_relax.AnnotateCustomMemoryScope(target),
        # not codl.PropagateNaN: its NaN test in ReLU epilogues keeps TVM from vectorising the
        # image store of a conv's pixel (a scalar reinterpreted as float4: no OpenCL C)
        relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_conv2d}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
        adreno_relax.FoldVDeviceScopeChange(),
        relax.transform.DeadCodeElimination(),
        TextureScopeCopies(),
        OwnScopedKernels(),
        relax.transform.SpecializePrimFuncBasedOnCallSite(),
        relax.transform.Normalize(),
    ]


def schedule_passes() -> list[tvm.transform.Pass]:
    """Schedule every kernel: whole-pixel conversions first, then dlight's Adreno rules."""
    # not dl.adreno.Pool2D: it gives a pixel's four channels one register (wrong results)
    return [
        dl.ApplyDefaultSchedule(
            TextureLayoutTransform(),
            TextureConv2d(),
            TexturePool2D(),
            dl.adreno.Conv2d(),
            dl.adreno.Fallback(),
        ),
        dl.ApplyDefaultSchedule(dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()),
    ]


def texture_pipeline(
    target: tvm.target.Target,
    dump_ir: str | Path | None = None,
    image_storages: bool = True,
    dtype: str = "float32",
    weights: dict | None = None,
) -> tvm.transform.Pass:
    """The Relax pipeline of a texture build (phases in the module docstring).

    ``target`` must carry the texture keys (:func:`texture_target`). ``dump_ir``: a folder
    that receives the IR after every phase (``NN-phase.py``). ``image_storages``: give each
    texture tensor an image storage of its own (:class:`~codl_tvm.passes.texture_storage.
    ImageStorages`); False keeps TVM's planned buffer storages, whose image views need a driver
    that creates image arrays on buffers. ``dtype``: the GPU tensors' type (``"float16"``:
    half, inputs and outputs cast). ``weights``: a dictionary receiving the weights stored
    beside the library (:class:`~codl_tvm.passes.stream_weights.StreamWeights`); None keeps
    them embedded.
    """

    @tvm.transform.module_pass(opt_level=0, name="codl.TexturePipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            phases = [
                ("inference", inference_passes(dtype)),
                ("layout", layout_passes()),
                ("scope", scope_passes(target)),
                ("schedule", schedule_passes()),
                ("dataflow-lower", list(gpu_generic.dataflow_lower_passes(target))),
                ("finalize", list(gpu_generic.finalize_passes(target))),
                ("storage", [ImageStorages()] if image_storages else []),
                ("weights", [] if weights is None else [StreamWeights(weights, "opencl")]),
            ]
            for i, (name, passes) in enumerate(phases):
                mod = tvm.transform.Sequential(passes)(mod)
                if dump_ir is not None:
                    Path(dump_ir).mkdir(parents=True, exist_ok=True)
                    (Path(dump_ir) / f"{i:02d}-{name}.py").write_text(mod.script(show_meta=False))
        return mod

    return _pipeline


@dataclass(frozen=True)
class TextureBuild:
    """A texture build: the executable, the memory scope of each VDevice, and its kernels.

    Attributes
    ----------
    executable
        The compiled model.
    scopes
        The memory scope of each VDevice of the lowered module.
    kernels
        Every kernel's name, each with whether it reads or writes an image.
    """

    executable: tvm.runtime.Executable
    scopes: tuple[str, ...]
    kernels: tuple[tuple[str, bool], ...] = ()

    @property
    def image_kernels(self) -> int:
        """How many kernels read or write an image."""
        return sum(1 for _, image in self.kernels if image)

    def vm_devices(self, device: tvm.runtime.Device) -> list[tvm.runtime.Device]:
        """The VM's device list: ``device`` once per VDevice (TVM's Adreno tests do the same)."""
        return [device] * max(1, len(self.scopes))

    def kernel_source(self) -> str:
        """The generated OpenCL C of every kernel."""
        return "\n".join(m.inspect_source() for m in _opencl_modules(self.executable.mod))


def _opencl_modules(mod) -> list:
    found = [mod] if mod.kind == "opencl" else []
    for sub in mod.imports:
        found.extend(_opencl_modules(sub))
    return found


def own_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with a node of its own for every constant (sharing the constant's data).

    TVM 0.27's ``AnnotateCustomMemoryScope`` sets VDevices on the types of the constants it
    visits in place; on the caller's module's constants they would follow it into every later
    build (a CPU build then fails in ``CallTIRRewrite`` looking up a VDevice its module lacks).
    """
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            updates[gv] = tvm_ffi.structural_map(func, [(tvm.ir.GenericConst, _fresh_constant)])
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod


def _fresh_constant(const: tvm.ir.GenericConst) -> tvm.ir.GenericConst:
    return relax.const(const.value)


def _kernels(mod: tvm.IRModule) -> tuple[tuple[str, bool], ...]:
    """Every PrimFunc of the lowered module, with whether a parameter is an image."""
    found = []
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc):
            # buffer parameters carry their storage scope; scalar parameters have none
            scopes = [p.scope() for p in func.params if hasattr(p, "scope")]
            found.append((gv.name_hint, any("texture" in s for s in scopes)))
    return tuple(sorted(found))


def build_texture_gpu(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    dump_ir: str | Path | None = None,
    image_storages: bool = True,
    caps: ImageCaps | None = None,
    dtype: str = "float32",
    weights: dict | None = None,
) -> TextureBuild:
    """Compile ``mod`` for ``target``'s GPU with its covered operators in the texture layout.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module as the ONNX frontend makes it (NCHW, constant weights, static shapes).
    target : tvm.target.Target
        An OpenCL target with an LLVM host; the texture keys are added (:func:`texture_target`).
    dump_ir : str | Path | None
        A folder receiving the IR after every phase.
    image_storages : bool
        Each texture tensor on an image storage of its own (True: runs on any driver with
        images), or on TVM's planned buffer storages (False: less memory, needs images on
        buffers for ``image2d_array_t``).
    caps : ImageCaps | None
        The device's image limits, which tensors in images are kept within (None: TVM's).
    dtype : str
        ``"float32"``, or ``"float16"``: GPU tensors in half, inputs and outputs float32.
    weights : dict | None
        Receives the weights to store beside the library (None: embedded).

    Returns
    -------
    TextureBuild
        The executable, its VM device slots and its kernels.
    """
    target = texture_target(target, caps)
    install_texture_size_fix()
    pipeline = register_texture_tir_pipeline()
    lowered = texture_pipeline(target, dump_ir, image_storages, dtype, weights)(own_constants(mod))
    scopes = tuple(str(v.memory_scope) for v in lowered.global_infos.get("vdevice", ()))
    kernels = _kernels(lowered)
    logger.info(
        "texture build: %d of %d kernels read or write images",
        sum(1 for _, image in kernels if image),
        len(kernels),
    )
    executable = tvm.compile(lowered, target=target, relax_pipeline=None, tir_pipeline=pipeline)
    if len(scopes) > VM_DEVICE_SLOTS:  # an artifact lists VM_DEVICE_SLOTS devices
        raise RuntimeError(f"texture build with {len(scopes)} VDevices {scopes}")
    return TextureBuild(executable, scopes, kernels)
