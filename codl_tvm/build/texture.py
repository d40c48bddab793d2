"""Build GPU operators that compute in the texture layout (OpenCL images), CoDL's GPU data type.

CoDL keeps the GPU's tensors in images and the CPU's in buffers, converting at chain
boundaries. This module builds the GPU side: ``build_texture_gpu(mod, target)`` compiles a
Relax module whose covered operators (convs with their bias and activation, pools, elementwise
ops) compute on NCHW4c tensors in ``global.texture*`` scopes with OIHW4o weights arranged at
build time. It is not wired into :func:`codl_tvm.build.pipeline.coexec_pipeline` yet.

The Relax pipeline, as phases (TVM's Adreno backend, ``tvm/relax/backend/adreno/pipeline.py``,
with the pinned wheel's bugs worked around):

1. **layout**: ``FoldConstant`` (the frontend's bias reshapes become constants), then
   :class:`~codl_tvm.passes.texture_layout.ToTextureLayout` in place of TVM's
   ``ConvertLayout``, which segfaults for packed layouts with apache-tvm-ffi 0.1.15.
2. **scope**: TVM's partial legalization (convs and pools kept), ``AnnotateCustomMemoryScope``
   (texture scopes on the VDevices of 5-D tensors whose consumers read images), the remaining
   legalization and the Adreno conv (``conv2d_NCHWc_OIHWo``), fusion, ``FoldVDeviceScopeChange``
   and ``SpecializePrimFuncBasedOnCallSite`` (PrimFunc buffers take their call site's scope).
3. **schedule**: codl-tvm's :class:`~codl_tvm.schedules.opencl_texture.TextureLayoutTransform`
   (whole-pixel conversion kernels) and :class:`~codl_tvm.schedules.opencl_texture.
   TextureConv2d` (dlight's Adreno conv tiling reading the input image itself instead of a
   padded copy in a buffer) and :class:`~codl_tvm.schedules.opencl_texture.TexturePool2D`
   (dlight's Adreno ``Pool2D`` gives a pixel's four channels one register), then dlight's
   Adreno conv and fallback rules and its GPU rules.
4. **dataflow-lower**, **finalize**: TVM's ``gpu_generic`` phases.
5. **storage**: :class:`~codl_tvm.passes.texture_storage.ImageStorages` gives every texture
   tensor an image storage of its own shape (TVM plans flat ``global`` storages for Adreno
   targets, whose image views need ``cl_khr_image2d_from_buffer`` for image arrays, which PoCL
   refuses).

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
with them: create it with :meth:`TextureBuild.vm_devices`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.backend import gpu_generic
from tvm.relax.backend.adreno import transform as adreno_relax
from tvm.relax.transform.legalize_ops import adreno as legalize_adreno
from tvm.s_tir import dlight as dl
from tvm.s_tir.backend.adreno import pipeline as adreno_tir
from tvm.s_tir.backend.adreno import transform as adreno_tir_transform
from tvm.tirx import compilation_pipeline

from codl_tvm.passes.texture_layout import ToTextureLayout
from codl_tvm.passes.texture_storage import ImageStorages
from codl_tvm.schedules.opencl_texture import (
    TextureConv2d,
    TextureLayoutTransform,
    TexturePool2D,
)

__all__ = [
    "TEXTURE_TIR_PIPELINE",
    "TextureBuild",
    "build_texture_gpu",
    "install_texture_size_fix",
    "layout_passes",
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


def texture_target(gpu: tvm.target.Target) -> tvm.target.Target:
    """``gpu`` (an OpenCL target) with the keys that turn on TVM's texture lowering.

    ``adreno`` enables dlight's Adreno rules (they gate on it), ``texture`` TVM's texture
    passes. JSON targets without them build buffers; the tag ``qcom/adreno-opencl-texture``
    has both.
    """
    if gpu.kind.name != "opencl":
        raise ValueError(f"gpu: texture builds need an OpenCL target, got {gpu.kind.name!r}")
    config = dict(gpu.export())
    keys = list(config.get("keys", ()))
    config["keys"] = [*keys, *(k for k in _TEXTURE_KEYS if k not in keys)]
    host = config.pop("host", None)
    config.pop("tag", None)
    return tvm.target.Target(config, host=host)


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


def layout_passes() -> list[tvm.transform.Pass]:
    """Rewrite covered operators to NCHW4c/OIHW4o (weights arranged at build time)."""
    return [relax.transform.FoldConstant(), ToTextureLayout()]


def scope_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """Give image-friendly tensors texture scopes, legalize and fuse (TVM's Adreno order)."""
    return [
        tirx.transform.BindTarget(target),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.Normalize(),
        relax.transform.LegalizeOps(skip_ops=_SCOPE_OPS),
        relax.transform.AnnotateTIROpPattern(),
        adreno_relax.AnnotateCustomMemoryScope(target),
        relax.transform.LegalizeOps({"relax.nn.conv2d": legalize_adreno.conv2d_NCHWc_OIHWo}),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
        adreno_relax.FoldVDeviceScopeChange(),
        relax.transform.DeadCodeElimination(),
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
) -> tvm.transform.Pass:
    """The Relax pipeline of a texture build (phases in the module docstring).

    ``target`` must carry the texture keys (:func:`texture_target`). ``dump_ir``: a folder
    that receives the IR after every phase (``NN-phase.py``). ``image_storages``: give each
    texture tensor an image storage of its own (:class:`~codl_tvm.passes.texture_storage.
    ImageStorages`); False keeps TVM's planned buffer storages, whose image views need a driver
    that creates image arrays on buffers.
    """

    @tvm.transform.module_pass(opt_level=0, name="codl.TexturePipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            phases = [
                ("layout", layout_passes()),
                ("scope", scope_passes(target)),
                ("schedule", schedule_passes()),
                ("dataflow-lower", list(gpu_generic.dataflow_lower_passes(target))),
                ("finalize", list(gpu_generic.finalize_passes(target))),
                ("storage", [ImageStorages()] if image_storages else []),
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
    """A texture build: the executable and the memory scope of each VM device slot."""

    executable: tvm.runtime.Executable
    scopes: tuple[str, ...]

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


def build_texture_gpu(
    mod: tvm.IRModule,
    target: tvm.target.Target,
    dump_ir: str | Path | None = None,
    image_storages: bool = True,
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

    Returns
    -------
    TextureBuild
        The executable and its VM device slots.
    """
    target = texture_target(target)
    install_texture_size_fix()
    pipeline = register_texture_tir_pipeline()
    lowered = texture_pipeline(target, dump_ir, image_storages)(mod)
    scopes = tuple(str(v.memory_scope) for v in lowered.global_infos.get("vdevice", ()))
    executable = tvm.compile(lowered, target=target, relax_pipeline=None, tir_pipeline=pipeline)
    return TextureBuild(executable, scopes)
