"""Shared plumbing of codl-tvm's Relax-to-Relax simplification passes (``fold_bn``,
``variadic``): one scan of a function's bindings and uses, the rebuild of its body with
bindings dropped or replaced, and the module pass that applies a rewrite to every function."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import tvm
from tvm import relax

__all__ = ["Bindings", "op_name", "rebuild", "rewrite_functions"]


def op_name(value) -> str | None:
    """The operator name of a call to a Relax op (``relax.add``), else None."""
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


class Bindings:
    """Bindings and uses of one Relax function body (``value_of`` keeps binding order)."""

    def __init__(self, func: relax.Function):
        self.value_of: dict[relax.Var, relax.Expr] = {}
        self.uses: dict[relax.Var, int] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    continue
                self.value_of[binding.var] = binding.value
                for used in relax.analysis.free_vars(binding.value):
                    self.uses[used] = self.uses.get(used, 0) + 1
        for used in relax.analysis.free_vars(func.body.body):
            self.uses[used] = self.uses.get(used, 0) + 1


def rebuild(
    func: relax.Function,
    drop: set[relax.Var],
    replace: Mapping[relax.Var, Sequence[relax.Binding]],
) -> relax.Function:
    """``func`` without the bindings of ``drop``, each binding of ``replace`` swapped for its
    bindings (the last one binding the same variable, so its users are unchanged)."""
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var in drop:
                continue
            bindings.extend(replace.get(binding.var, (binding,)))
        kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
        blocks.append(kind(bindings))
    # normalized: the new SeqExpr needs its type, or well_formed and TypeFunctors fail on it
    body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def rewrite_functions(
    mod: tvm.IRModule, rewrite: Callable[[relax.Function], tuple[relax.Function, int]]
) -> tvm.IRModule:
    """``mod`` with ``rewrite`` applied to every Relax function; the caller's module is never
    changed in place (a copy is made when anything changed)."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new, count = rewrite(func)
            if count:
                updates[gv] = new
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod
