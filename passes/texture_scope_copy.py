"""Copy a tensor between two texture scopes with a kernel instead of an image copy.

TVM's ``AnnotateCustomMemoryScope`` picks each tensor's texture scope from its shape and
consumers, so a producer and its consumer may disagree: a pool writes ``global.texture``
(rows of ``W`` pixels, ``H`` rows, ``N * C/4`` layers) and the conv after it reads
``global.texture-nhwc`` (rows of ``H * W`` pixels, ``C/4`` rows). ``FoldVDeviceScopeChange``
leaves a ``to_vdevice`` between the two, which the VM runs as a device copy; the two images
have different extents, so no image copy (``clEnqueueCopyImage``) can do it. After
``FoldVDeviceScopeChange``, ``main`` reads::

    p = R.call_tir(cls.max_pool2d, (c,), out_ty=R.Tensor((1, 16, 112, 112, 4), "float32",
                                                         vdevice="opencl:0:global.texture"))
    q: R.Tensor((1, 16, 112, 112, 4), "float32", vdevice="opencl:2:global.texture-nhwc") = (
        R.to_vdevice(p, dst_vdevice="opencl:2:global.texture-nhwc"))

and after this pass::

    q = R.call_tir(cls.texture_copy, (p,), out_ty=R.Tensor((1, 16, 112, 112, 4), "float32",
                                                          vdevice="opencl:2:global.texture-nhwc"))

with ``texture_copy`` an elementwise identity of the 5-D tensor (block ``texture_copy``), one
PrimFunc per shape and dtype, which ``SpecializePrimFuncBasedOnCallSite`` then gives the two
scopes and :class:`~codl_tvm.schedules.opencl_texture.TextureLayoutTransform` schedules (one
pixel read, one pixel written per work-item). Copies from or to ``global`` buffers stay
``to_vdevice`` (the runtime copies between an image and a buffer). Run after
``FoldVDeviceScopeChange``, before ``SpecializePrimFuncBasedOnCallSite``.
"""

from __future__ import annotations

import tvm
from codl_tvm.schedules.opencl_texture import COPY_BLOCK
from tvm import relax, te

from .rewrite import op_name

__all__ = ["TextureScopeCopies", "copy_prim_func"]


def _is_texture(ty) -> bool:
    vdevice = getattr(ty, "vdevice", None)
    return vdevice is not None and "texture" in str(vdevice.memory_scope)


def copy_prim_func(shape: tuple[int, ...], dtype: str) -> tvm.tirx.PrimFunc:
    """An identity kernel of a tensor of ``shape`` and ``dtype`` (block :data:`COPY_BLOCK`)."""
    # int64 extents, as legalized kernels have: SpecializePrimFuncBasedOnCallSite matches the
    # buffer shapes against the call site's and refuses int32 constants
    shape = [tvm.tirx.IntImm("int64", int(s)) for s in shape]
    src = te.placeholder(shape, dtype, name="src")
    dst = te.compute(shape, lambda *i: src(*i), name=COPY_BLOCK)
    return te.create_prim_func([src, dst]).with_attr("global_symbol", COPY_BLOCK)


def _scope_copies(mod: tvm.IRModule) -> tvm.IRModule:
    bb = relax.BlockBuilder(mod)
    funcs: dict[tuple, tvm.ir.GlobalVar] = {}

    def copy_kernel(shape: tuple[int, ...], dtype: str) -> tvm.ir.GlobalVar:
        """The GlobalVar of the copy kernel of ``shape`` and ``dtype`` (added once, typed)."""
        if (shape, dtype) not in funcs:
            name = f"{COPY_BLOCK}{len(funcs) or ''}"
            prim = copy_prim_func(shape, dtype).with_attr("global_symbol", name)
            funcs[shape, dtype] = bb.add_func(prim, name)
        return funcs[shape, dtype]

    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks, changed = [], 0
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                value = b.value if isinstance(b, relax.VarBinding) else None
                src = value.args[0] if op_name(value) == "relax.to_vdevice" else None
                if src is None or not (_is_texture(src.ty) and _is_texture(b.var.ty)):
                    bindings.append(b)
                    continue
                if str(src.ty.vdevice.memory_scope) == str(b.var.ty.vdevice.memory_scope):
                    bindings.append(b)
                    continue
                shape = tuple(int(s) for s in src.ty.shape.values)
                kernel = copy_kernel(shape, str(src.ty.dtype))
                bindings.append(relax.VarBinding(b.var, relax.call_tir(kernel, [src], b.var.ty)))
                changed += 1
            blocks.append(type(block)(bindings))
        if changed:
            body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
            new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
            bb.update_func(gv, new)
    return bb.get() if funcs else mod


@tvm.transform.module_pass(opt_level=0, name="codl.TextureScopeCopies")
class TextureScopeCopies:
    """Replace every ``to_vdevice`` between two texture scopes with a copy kernel (see the
    module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return _scope_copies(mod)
