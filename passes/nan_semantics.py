"""Make element-wise maxima and minima propagate NaN, as ONNX and onnxruntime do.

Preconditions: runs on the PrimFuncs of a module right after ``LegalizeOps`` (before
``AnnotateTIROpPattern`` and fusion), so that every kernel, including those the ONNX frontend
emits as TIR itself (its ``Clip`` is ``topi.maximum`` then ``topi.minimum``), is covered once.

What it does: TVM legalizes Relu as ``max(x, 0)``, Clip as ``min``/``max`` with the bounds, and
Max/Min as ``max(a, b)``/``min(a, b)``; LLVM and OpenCL C evaluate TIR's ``max``/``min`` with
``maxnum`` semantics, so a NaN operand yields the other one (Relu(NaN) = 0, Max(NaN, 1) = 1),
where ONNX and onnxruntime give NaN. :class:`PropagateNaN` rewrites every floating-point
``max``/``min`` of an element-wise block (a block without reduction iterations) as::

    max(a, b)  ->  select(isnan(a), a, select(isnan(b), b, max(a, b)))

checking only operands that can hold NaN: those that read a buffer or a variable (a constant
bound such as Relu's 0 needs no check, nor do coordinates computed from loop indices). Relu
thus costs one ``select`` more than TVM's, Max/Min two.

Not changed: reductions (max pooling, ``ReduceMax``, the max of a softmax). ONNX does not define
NaN inside a pooling window, and onnxruntime's MaxPool result depends on where in the window
the NaN falls, so no one answer matches it.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad

__all__ = ["PropagateNaN", "propagate_nan"]


def _may_be_nan(expr: tirx.PrimExpr) -> bool:
    """Whether ``expr`` (floating point) can be NaN: it reads data (a buffer or a variable)."""
    found = []
    tvm_ffi.structural_walk(expr, [((TensorLoad, tirx.Var), found.append)])
    return bool(found)


def _is_float(expr: tirx.PrimExpr) -> bool:
    return str(expr.ty.dtype).startswith(("float", "bfloat"))


def _nan_propagating(expr: tirx.PrimExpr) -> tirx.PrimExpr:
    if not _is_float(expr):
        return expr
    result = expr
    # the innermost check is the last operand's: select(isnan(a), a, select(isnan(b), b, m))
    for operand in (expr.b, expr.a):
        if _may_be_nan(operand):
            result = tirx.Select(tirx.isnan(operand), operand, result)
    return result


def _is_reduction(block: s_tir.SBlock) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in block.iter_vars)


def propagate_nan(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every floating-point ``max``/``min`` of its element-wise blocks made
    NaN-propagating (see the module docstring); ``func`` itself when there is none."""

    def on_block(block, mutator):
        if _is_reduction(block):
            return block
        return mutator.default_mutate(block)

    def on_minmax(expr, mutator):
        return _nan_propagating(mutator.default_mutate(expr))

    body = tvm_ffi.structural_mutate(
        func.body, [(s_tir.SBlock, on_block), ((tirx.Max, tirx.Min), on_minmax)]
    )
    if body.same_as(func.body):
        return func
    return func.with_body(body)


@tvm.ir.transform.module_pass(opt_level=0, name="codl.PropagateNaN")
class PropagateNaN:
    """Rewrite every PrimFunc of the module with :func:`propagate_nan`."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        changed = {}
        for gvar, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = propagate_nan(func)
                if not new.same_as(func):
                    changed[gvar] = new
        if not changed:
            return mod
        mod = mod.clone()
        for gvar, func in changed.items():
            mod[gvar] = func
        return mod
