"""Turn the ONNX frontend's stack-and-reduce form of Sum, Max and Min into pairwise binary ops.

TVM's ONNX frontend imports a variadic ``Sum(a, b)`` (and ``Max``, ``Min``) with static shapes as

    a1 = broadcast_to(a, S)     b1 = broadcast_to(b, S)     s = stack((a1, b1), axis=0)
    y = sum(s, axis=[0])

ResNet50's sixteen residual joins are ``Sum`` nodes. Each becomes three kernels (the broadcast
copies fuse with the stack, then a reduction) that write and read the activation twice more,
and the ``relu`` after it is a kernel of its own: the stack-and-sum and relu kernels took 3.1 of
the 26 ms of ResNet50's CPU build on a skylake-avx512 Xeon (its kernel-by-kernel times),
where onnxruntime fuses the add and relu into the conv. :class:`PairwiseVariadic` rewrites
``y`` as ``add(a, b)`` (a left fold for more inputs, ``maximum``/``minimum`` for Max/Min), an
elementwise epilogue that FuseOps fuses into the conv before it, with the relu after it, and
that the partitioning pass absorbs into a split conv like any residual add.

The binary ops broadcast like ONNX's variadic ops (multidirectional), and a left fold adds in
the order the reduction does, so the result is bit-identical. ``y`` keeps its variable; the
``broadcast_to`` and ``stack`` bindings are dropped when nothing else uses them. Partitionable
operators are untouched, so plans (which name only those) still apply.
"""

from __future__ import annotations

import tvm
from tvm import relax

from codl_tvm.core.plan import static_shape

from .rewrite import Bindings, op_name, rebuild, rewrite_functions

__all__ = ["PairwiseVariadic", "pairwise_variadic"]

_BINARY = {
    "relax.sum": relax.op.add,
    "relax.max": relax.op.maximum,
    "relax.min": relax.op.minimum,
}


def _reduces_axis0(call: relax.Call) -> bool:
    axis = call.attrs.axis
    return axis is not None and [int(a) for a in axis] == [0] and not bool(call.attrs.keepdims)


def pairwise_variadic(func: relax.Function) -> tuple[relax.Function, int]:
    """``func`` with every stack-and-reduce of broadcast copies made pairwise, and how many."""
    if not isinstance(func.body, relax.SeqExpr):
        return func, 0
    scan = Bindings(func)
    value_of, uses = scan.value_of, scan.uses
    replace: dict[relax.Var, tuple[list[relax.VarBinding], relax.Expr]] = {}
    drop: set[relax.Var] = set()
    for var, value in value_of.items():
        binary = _BINARY.get(op_name(value))
        if binary is None or not _reduces_axis0(value):
            continue
        stacked = value.args[0]
        stack = value_of.get(stacked) if isinstance(stacked, relax.Var) else None
        if op_name(stack) != "relax.stack" or int(stack.attrs.axis) != 0:
            continue
        if uses.get(stacked, 0) != 1 or not isinstance(stack.args[0], relax.Tuple):
            continue
        out_shape = static_shape(var)
        if out_shape is None:
            continue
        operands, copies = [], []
        for item in stack.args[0].fields:
            src = value_of.get(item) if isinstance(item, relax.Var) else None
            if (
                op_name(src) == "relax.broadcast_to"
                and uses.get(item, 0) == 1
                and static_shape(item) == out_shape
            ):
                operands.append(src.args[0])
                copies.append(item)
            else:
                operands.append(item)
        if len(operands) < 2:
            continue
        inner, final = _fold_bindings(binary, operands, var)
        if static_shape(final) != out_shape:
            continue  # the operands alone do not broadcast to the reduced shape
        replace[var] = inner, final
        drop.add(stacked)
        drop.update(copies)
    if not replace:
        return func, 0
    bindings = {
        var: [*inner, relax.VarBinding(var, final)] for var, (inner, final) in replace.items()
    }
    return rebuild(func, drop, bindings), len(replace)


def _fold_bindings(binary, operands: list, var: relax.Var):
    """``(bindings of the inner folds, final call)`` of a left fold: inner folds of three or more
    operands get variables of their own (``<var>_fold<i>``), bound just before ``var``."""
    bb = relax.BlockBuilder()
    bindings = []
    acc = operands[0]
    for i, rhs in enumerate(operands[1:-1]):
        call = bb.normalize(binary(acc, rhs))
        inner = type(var)(f"{var.name}_fold{i}", call.ty)  # a DataflowVar in a dataflow block
        bindings.append(relax.VarBinding(inner, call))
        acc = inner
    return bindings, bb.normalize(binary(acc, operands[-1]))


@tvm.transform.module_pass(opt_level=0, name="codl.PairwiseVariadic")
class PairwiseVariadic:
    """Rewrite stack-and-reduce Sum/Max/Min as pairwise binary ops, in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        return rewrite_functions(mod, pairwise_variadic)
