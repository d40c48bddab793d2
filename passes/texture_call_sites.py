"""Give each memory-scope signature of a shared kernel a PrimFunc of its own.

``SpecializePrimFuncBasedOnCallSite`` writes the scopes of a ``call_tir``'s arguments and
result into the PrimFunc it calls; a PrimFunc called from several sites gets one site's scopes,
and the others then pass images to a kernel compiled for buffers (or the reverse). TVM's
fusion shares a PrimFunc between identical operators, and the scope annotation may place two
of them differently (SqueezeNet's last two fire modules: one concat writes an image the next
conv reads, the other a buffer the average pool reads)::

    a = R.call_tir(cls.concatenate3, (x, y),
                   out_ty=R.Tensor(..., vdevice="opencl:2:global.texture-nhwc"))
    b = R.call_tir(cls.concatenate3, (u, v), out_ty=R.Tensor(..., vdevice="opencl:1:global"))

after this pass the second site calls a copy, ``concatenate3_scoped1``; call sites with the same
scopes keep sharing one PrimFunc. Run right before ``SpecializePrimFuncBasedOnCallSite``.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.s_tir import renew_defs

from .rewrite import op_name

__all__ = ["OwnScopedKernels", "scope_signature"]


def _scope(ty) -> str:
    vdevice = getattr(ty, "vdevice", None)
    return "" if vdevice is None else str(vdevice.memory_scope)


def scope_signature(call: relax.Call, out: relax.Var) -> tuple[str, ...]:
    """The memory scopes of a ``call_tir``'s tensor arguments and its result (``""``: none)."""
    args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
    return (*(_scope(a.ty) for a in args), _scope(out.ty))


def _own_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    bb = relax.BlockBuilder(mod)
    # PrimFunc -> {signature: the GlobalVar its sites of that signature call}
    seen: dict[tvm.ir.GlobalVar, dict[tuple[str, ...], tvm.ir.GlobalVar]] = {}
    added = 0
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        blocks, changed = [], 0
        for block in func.body.blocks:
            bindings = []
            for b in block.bindings:
                value = b.value if isinstance(b, relax.VarBinding) else None
                if op_name(value) != "relax.call_tir":
                    bindings.append(b)
                    continue
                kernel = value.args[0]
                sites = seen.setdefault(kernel, {})
                sig = scope_signature(value, b.var)
                if sig not in sites:
                    if sites:  # a second signature: a copy of the PrimFunc
                        name = f"{kernel.name_hint}_scoped{len(sites)}"
                        # fresh parameters and buffers: a PrimFunc never shares them
                        prim = renew_defs(mod[kernel]).with_attr("global_symbol", name)
                        sites[sig] = bb.add_func(prim, name)
                        added += 1
                    else:
                        sites[sig] = kernel
                if sites[sig].same_as(kernel):
                    bindings.append(b)
                    continue
                args = [sites[sig], *value.args[1:]]
                call = relax.Call(value.op, args, value.attrs, value.ty_args)
                bindings.append(relax.VarBinding(b.var, call))
                changed += 1
            blocks.append(type(block)(bindings))
        if changed:
            body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
            new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
            bb.update_func(gv, new)
    return bb.get() if added else mod


@tvm.transform.module_pass(opt_level=0, name="codl.OwnScopedKernels")
class OwnScopedKernels:
    """Give every memory-scope signature of a PrimFunc called from several sites its own copy
    (see the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return _own_kernels(mod)
