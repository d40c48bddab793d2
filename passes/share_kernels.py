"""codl.ShareIdenticalKernels: one compiled kernel per distinct piece of code.

Preconditions
-------------
- Runs after scheduling, InsertCoexecSync and (when a kernel record is wanted)
  :class:`~codl_tvm.passes.kernel_splits.RecordKernelSplits`, before ``CallTIRRewrite``: kernel
  calls are still ``call_tir`` / ``call_tir_inplace`` and each split's kernels still carry their
  ``codl.split`` attribute.

What it does
------------
:class:`~codl_tvm.passes.place.PlaceParts` gives every (processor, split) its own PrimFunc, and
every kernel at a CPU/GPU edge its own opaque copy, so that FuseOps cannot fuse across
processors and the kernel record can name each call's split. Once that record is written, the
copies are only cost: PrimFuncs equal in everything but their symbol and split (same target,
same scheduled code) become one, and every call uses it.

Why it matters: PoCL's CPU driver keeps the loaded binaries of at most 128 kernels (its
``dlhandle`` cache, least recently used first out). FST's co-executed build had 175 distinct GPU
kernels per inference before this pass, so every launch reloaded its binary with ``dlopen``; the
timelines showed 0.2-0.27 ms between consecutive GPU kernels instead of 0.02-0.04 ms, and the
model ran 0.89x its GPU-only build. Fewer distinct kernels also means less to compile and ship
on a phone.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from .fused_targets import SPLIT_ATTR
from .kernel_calls import is_kernel_call
from .kernel_splits import kernel_symbol, recorded_kernel_splits, with_kernel_splits

__all__ = ["ShareIdenticalKernels", "share_identical_kernels"]


def _code(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with the attributes that name it (symbol, split) set to fixed values."""
    return func.with_attr("global_symbol", "codl_kernel").with_attr(SPLIT_ATTR, "")


def share_identical_kernels(mod: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, str]]:
    """``mod`` with PrimFuncs of identical code merged into the first by name.

    Returns
    -------
    tuple
        The new module and ``{removed symbol: kept symbol}`` (empty when nothing was shared).
    """
    kept: dict[int, list[tuple[tvm.ir.GlobalVar, tvm.tirx.PrimFunc]]] = {}
    replace: dict[tvm.ir.GlobalVar, tvm.ir.GlobalVar] = {}
    prims = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    for gv, func in sorted(prims, key=lambda item: item[0].name_hint):
        code = _code(func)
        bucket = kept.setdefault(int(tvm_ffi.structural_hash(code)), [])
        for rep, rep_code in bucket:
            if tvm_ffi.structural_equal(code, rep_code):
                replace[gv] = rep
                break
        else:
            bucket.append((gv, code))
    if not replace:
        return mod, {}
    out = mod.clone()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = _Redirect(replace).visit_expr(func)
    for gv in replace:
        del out[gv]
    return out, {
        kernel_symbol(gv, mod[gv]): kernel_symbol(rep, mod[rep]) for gv, rep in replace.items()
    }


@relax.expr_functor.mutator
class _Redirect(relax.PyExprMutator):
    def __init__(self, replace: dict) -> None:
        super().__init__()
        self.replace = replace

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if is_kernel_call(call) and call.args[0] in self.replace:
            args = [self.replace[call.args[0]], *call.args[1:]]
            return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)
        return call


@tvm.transform.module_pass(opt_level=0, name="codl.ShareIdenticalKernels")
class ShareIdenticalKernels:
    """Merge PrimFuncs of identical code (:func:`share_identical_kernels`).

    A kernel record that :class:`~codl_tvm.passes.kernel_splits.RecordKernelSplits` left on the
    module (its ``codl_kernel_splits`` attribute) follows: its calls are renamed to the kernels
    the VM will call.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        out, renamed = share_identical_kernels(mod)
        record = recorded_kernel_splits(out)
        if record and renamed:
            for call in record.get("calls", []):
                call[0] = renamed.get(call[0], call[0])
            out = with_kernel_splits(out, record)
        return out
