"""codl.GpuImageScopes: packed GPU tensors of a co-executed model live in OpenCL images.

After :class:`~codl_tvm.passes.texture_parts.PackGpuParts` the GPU parts compute on NCHW4c
tensors, still in buffers. This pass gives each packed tensor a GPU kernel writes and only GPU
kernels read a texture scope: its ``call_tir``'s output type gets a VDevice of the GPU target in
``scope`` (``global.texture``: an image2d array of ``N * C/4`` layers, ``H`` rows of ``W``
pixels), appended to ``main``'s ``"vdevice"`` global info after the GPU's and the CPU's (so
the VM's devices are ``[opencl, cpu, opencl]``). ``SpecializePrimFuncBasedOnCallSite`` then
writes the scope into the kernels' buffers, and the texture TIR pipeline turns their accesses
into image reads and writes. After fusion ``main`` reads::

    lv = R.call_tir(cls.fused_conv2d_NCHWc_OIHWo_add_relu, (x_4c, W),
                    out_ty=R.Tensor((1, 2, 64, 64, 4), "float32", vdevice="opencl:0:global"))
    y = R.call_tir(cls.te_layout_transform, (lv,),
                   out_ty=R.Tensor((1, 8, 64, 64), "float32", vdevice="opencl:0:global"))

and after this pass ``lv``'s type is ``R.Tensor((1, 2, 64, 64, 4), "float32",
vdevice="opencl:1:global.texture")`` (the second OpenCL VDevice, the third of the list).
A packed tensor of ``float16`` (GPU parts packed in half,
:class:`~codl_tvm.passes.texture_parts.PackGpuParts`) gets the same scopes: its image's format
follows the tensor's type (the runtime creates ``CL_HALF_FLOAT`` RGBA images for it, and the
kernels read and write it with ``read_imageh``/``write_imageh``, as in GPU-alone half builds).
Kept in buffers: a packed tensor the CPU, a fence, a tuple or ``main``'s result reads (only
GPU kernels read images), and one whose image would
exceed the device's limits in both layouts (``limits``: ``(max width, max height, max
layers)``; ``global.texture`` is tried first, then ``global.texture-nhwc``: rows of ``H * W``
pixels, ``C/4`` rows, ``N`` layers). Weights stay buffers (the VM uploads
constants into buffers).

``main`` gets ``codl_image_tensors`` (:data:`IMAGE_TENSORS_ATTR`): per split (the
producing kernel's ``codl.split``), how many packed tensors got images and why others stayed
buffers, which the build's record reports per split. Preconditions: after FuseOps, FuseTIR and
:class:`~codl_tvm.passes.fused_targets.RestoreTargets` (every kernel has its ``target`` and its
output its processor's VDevice), before ``SpecializePrimFuncBasedOnCallSite`` and scheduling.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from .fused_targets import SPLIT_ATTR
from .rewrite import op_name
from .texture_layout import PACK

__all__ = [
    "IMAGE_TENSORS_ATTR",
    "TEXTURE_SCOPE_AXIS",
    "GpuImageScopes",
    "image_extents",
    "image_tensors",
]

#: ``main``'s attribute counting, per split, the tensors given images and why others are not
#: (JSON).
IMAGE_TENSORS_ATTR = "codl_image_tensors"

#: The axis where each texture scope's image rows start in an NCHW4c tensor (TVM's separator:
#: axes before it, but the first, are layers; from it to the pixel axis, pixels of a row).
TEXTURE_SCOPE_AXIS = {"global.texture": 3, "global.texture-weight": 1, "global.texture-nhwc": 2}

#: The packed tensors' types images hold (RGBA CL_FLOAT or CL_HALF_FLOAT pixels).
_FLOATS = ("float32", "float16")


def image_extents(shape: tuple[int, ...], scope: str) -> tuple[int, int, int]:
    """``(width, height, layers)`` of the image holding an NCHW4c tensor of ``shape`` in
    ``scope`` (as the runtime plugin allocates it: axes before the row axis are layers, the row
    axis rows, the axes after it pixels)."""
    axis = TEXTURE_SCOPE_AXIS[scope]
    width = height = depth = 1
    for i, extent in enumerate(shape[:-1]):
        if i < axis - 1:
            depth *= int(extent)
        elif i < axis:
            height *= int(extent)
        else:
            width *= int(extent)
    return width, height, depth


def _packed_shape(ty) -> tuple[int, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None or str(ty.dtype) not in _FLOATS:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or len(values) != 5:
        return None
    if not all(isinstance(v, tvm.tirx.IntImm) for v in values) or int(values[-1]) != PACK:
        return None
    return tuple(int(v) for v in values)


def _is_gpu_kernel(mod: tvm.IRModule, value) -> bool:
    if op_name(value) != "relax.call_tir":
        return False
    func = mod[value.args[0]]
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and target.kind.name == "opencl"


class _Choice:
    """Which packed tensors of ``main`` get which scope, and why others do not."""

    def __init__(self, mod: tvm.IRModule, limits: tuple[int, int, int] | None, scopes):
        self.mod, self.limits, self.scopes = mod, limits, scopes
        self.chosen: dict[relax.Var, str] = {}
        # split -> how many of its packed tensors got images / why others did not
        self.images: dict[str, int] = {}
        self.kept: dict[str, list[str]] = {}

    def scope_for(self, shape: tuple[int, ...]) -> str | None:
        for scope in self.scopes:
            extents = image_extents(shape, scope)
            if self.limits is None or all(e <= m for e, m in zip(extents, self.limits)):
                return scope
        return None

    def run(self, func: relax.Function) -> None:
        bindings = [b for block in func.body.blocks for b in block.bindings]
        readers: dict[relax.Var, list] = {}
        for b in bindings:
            value = b.value
            # a GPU kernel's tensor arguments may be images; any other read needs a buffer
            gpu = _is_gpu_kernel(self.mod, value)
            reads = {a for a in value.args[1].fields if isinstance(a, relax.Var)} if gpu else ()
            for var in relax.analysis.free_vars(value):
                readers.setdefault(var, []).append(var in reads)
        for var in relax.analysis.free_vars(func.body.body):
            readers.setdefault(var, []).append(False)
        for b in bindings:
            shape = _packed_shape(b.var.ty)
            if shape is None or not _is_gpu_kernel(self.mod, b.value):
                continue
            split = self.split_of(b.value)
            if not all(readers.get(b.var, [False])):
                self.keep(split, "a packed tensor read outside GPU kernels")
                continue
            scope = self.scope_for(shape)
            if scope is None:
                self.keep(split, f"packed shape {shape} beyond the device's image limits")
                continue
            self.chosen[b.var] = scope
            self.images[split] = self.images.get(split, 0) + 1

    def split_of(self, call) -> str:
        func = self.mod[call.args[0]]
        return str(func.attrs.get(SPLIT_ATTR, "")) if func.attrs is not None else ""

    def keep(self, split: str, why: str) -> None:
        if why not in self.kept.setdefault(split, []):
            self.kept[split].append(why)


@relax.expr_functor.mutator
class _Rescope(relax.PyExprMutator):
    """Give the chosen kernels' outputs their texture VDevice."""

    def __init__(self, mod, chosen: dict, vdevices: dict[str, relax.VDevice]) -> None:
        super().__init__(mod)
        self.chosen, self.vdevices = chosen, vdevices

    def visit_var_binding_(self, binding) -> None:
        scope = self.chosen.get(binding.var)
        if scope is None:
            super().visit_var_binding_(binding)
            return
        call = binding.value
        old = call.ty_args[0]
        ty = relax.TensorType(old.shape, old.dtype, vdevice=self.vdevices[scope])
        value = relax.Call(call.op, [self.visit_expr(a) for a in call.args], call.attrs, [ty])
        value = self.builder_.normalize(value)
        if isinstance(binding.var, relax.DataflowVar):
            new_var = self.builder_.emit(value, name_hint=binding.var.name)
        else:
            new_var = self.builder_.emit_output(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new_var)


def image_tensors(mod: tvm.IRModule) -> dict | None:
    """``main``'s :data:`IMAGE_TENSORS_ATTR` record (``{"images": {split: count}, "buffers":
    {split: [why, ...]}}``), or None where it has none."""
    attrs = mod["main"].attrs
    if attrs is None or IMAGE_TENSORS_ATTR not in attrs:
        return None
    return json.loads(str(attrs[IMAGE_TENSORS_ATTR]))


@tvm.transform.module_pass(opt_level=0, name="codl.GpuImageScopes")
class GpuImageScopes:
    """Put the packed tensors GPU kernels write and only GPU kernels read in images (see the
    module docstring).

    Parameters
    ----------
    gpu_target
        The GPU's target (the texture VDevices' target).
    limits
        The device's ``(IMAGE2D_MAX_WIDTH, IMAGE2D_MAX_HEIGHT, IMAGE_MAX_ARRAY_SIZE)``; None:
        no limit is checked.
    """

    def __init__(
        self, gpu_target: tvm.target.Target, limits: tuple[int, int, int] | None = None
    ) -> None:
        self.gpu_target = gpu_target
        self.limits = limits

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        main = mod.get_global_var("main")
        choice = _Choice(mod, self.limits, ("global.texture", "global.texture-nhwc"))
        choice.run(mod[main])
        record = {"images": choice.images, "buffers": choice.kept}
        if not choice.chosen:
            return _with_record(mod, main, record)
        existing = list(mod.global_infos.get("vdevice", ()))
        vdevices = {}
        for scope in sorted(set(choice.chosen.values())):
            vdevices[scope] = relax.VDevice(self.gpu_target, 0, scope)
            existing.append(vdevices[scope])
        rescope = _Rescope(mod, choice.chosen, vdevices)
        func = rescope.visit_expr(mod[main])
        out = rescope.builder_.get()
        out.update_func(main, func)
        out.update_global_info("vdevice", existing)
        return _with_record(out, main, record)


def _with_record(mod: tvm.IRModule, main: tvm.ir.GlobalVar, record: dict) -> tvm.IRModule:
    mod = mod.clone()
    mod.update_func(main, mod[main].with_attr(IMAGE_TENSORS_ATTR, json.dumps(record)))
    return mod
