"""What the passes after fusion ask of a kernel call: is it one, and which processor runs it.

Shared by :mod:`~codl_tvm.passes.merge`, :mod:`~codl_tvm.passes.sync`,
:mod:`~codl_tvm.passes.kernel_splits` and :mod:`~codl_tvm.passes.share_kernels`, which all walk
``main``'s ``call_tir`` bindings of a scheduled, co-executed module. Pure queries; no pass here.
"""

from __future__ import annotations

import tvm
from tvm import relax

__all__ = ["CALL_TIR", "CALL_TIR_INPLACE", "dtype_expr", "is_kernel_call", "kernel_processor"]

CALL_TIR = tvm.ir.Op.get("relax.call_tir")
CALL_TIR_INPLACE = tvm.ir.Op.get("relax.call_tir_inplace")


def is_kernel_call(value) -> bool:
    """Whether ``value`` is a ``call_tir`` or ``call_tir_inplace`` call (one kernel launch)."""
    return isinstance(value, relax.Call) and (
        value.op.same_as(CALL_TIR) or value.op.same_as(CALL_TIR_INPLACE)
    )


def kernel_processor(mod: tvm.IRModule, call: relax.Call) -> str:
    """``"cpu"`` when the called PrimFunc's ``target`` attribute is an llvm target, else
    ``"gpu"`` (a kernel without a target runs on the build's main target, the GPU)."""
    callee = mod[call.args[0]]
    target = callee.attrs.get("target") if callee.attrs is not None else None
    return "cpu" if target is not None and target.kind.name == "llvm" else "gpu"


def dtype_expr(dtype: str) -> relax.Expr:
    """A data type as a Relax argument of a packed call (the runtime reads it as DLDataType)."""
    return tvm.ir.GenericConst(tvm.DataType(dtype), relax.AnyType())
