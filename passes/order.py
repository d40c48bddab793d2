"""codl.OrderSplits: order ``main``'s bindings so the placement schedule is what runs.

Preconditions
-------------
- Runs after :class:`~codl_tvm.passes.partition.PartitionOperators` (``main`` carries the
  ``"codl_parts"`` record naming each split's bindings) and before LegalizeOps: the bindings are
  still Relax operator calls, each split's are named in the record.
- ``order`` names splits of the record (plan entries: ``conv2d_3``), e.g. the dispatch order of
  a HOPE schedule (:func:`codl_tvm.planner.placement.modes.dispatch_order`); it must agree with the
  data flow (a split never before one whose result it reads).

What it does
------------
The VM runs ``main``'s bindings in order: GPU kernels are enqueued without waiting, CPU kernels
run on the host thread. So the order of the bindings decides when each processor can start a
kernel: an independent branch placed on the CPU runs beside a GPU branch only if its kernels come
after the GPU branch's kernels were enqueued and before the GPU's results are waited for.

Within each binding block, the bindings are re-emitted in a topological order where:

- the bindings of the splits in ``order`` come as one group per split, in that order (within a
  split, in their order before); an epilogue merged into a split (a binding of a part after
  its first, e.g. the residual add and, in a split, the slice of the add's other operand to
  the part's rows) that reads a split ordered later comes as soon as that result is computed,
  so a residual add fused after a shortcut conv never holds the conv back;
- every other binding (a concat joining branches, a reshape, a split not named) comes as early as
  its inputs allow, in its order before.

Variables keep their identity and names, so the record stays valid. A block whose order would
not change is returned as it was.
"""

from __future__ import annotations

from collections.abc import Sequence, Set

import tvm
from tvm import relax

from codl_tvm.core.errors import PlanError

from .parts import collect_parts

__all__ = ["OrderSplits", "order_bindings"]


def order_bindings(
    bindings: Sequence[relax.Binding],
    groups: dict[relax.Var, str],
    order: Sequence[str],
    heads: Set[relax.Var] = frozenset(),
) -> list[relax.Binding]:
    """``bindings`` (one block) reordered: the splits ``groups`` maps variables to, in
    ``order``; the rest as early as their inputs allow (see the module docstring).

    ``heads``: the first binding of each part of each split (the one reading the split's
    input). A later binding of a part that reads a result the order puts later belongs to an
    epilogue and waits for that result; a head that does is an order against the data flow.
    """
    defined = {b.var for b in bindings}
    deps = {
        b.var: {v for v in relax.analysis.free_vars(b.value) if v in defined and v is not b.var}
        for b in bindings
    }
    members: dict[str, list[relax.Binding]] = {}
    for b in bindings:
        if groups.get(b.var) in order:
            members.setdefault(groups[b.var], []).append(b)
    done: set = set()
    out: list[relax.Binding] = []
    rest = [b for b in bindings if groups.get(b.var) not in members]

    def drain() -> None:
        # every binding outside the ordered splits whose inputs are computed, repeatedly
        progress = True
        while progress:
            progress = False
            for b in rest:
                if b.var not in done and deps[b.var] <= done:
                    out.append(b)
                    done.add(b.var)
                    progress = True

    drain()
    for split in (s for s in order if s in members):
        group = members[split]
        inside = {b.var for b in group}
        for b in group:
            missing = deps[b.var] - done
            # a split's epilogue slices the residual add's other operand to each part's rows
            # first: that slice reads no result of the split, but it is no part's head either
            epilogue = bool(deps[b.var] & inside) or (bool(heads) and b.var not in heads)
            if missing and epilogue:
                # an epilogue PartitionOperators merged into this split that also reads a
                # later split's result (a residual add after a shortcut conv): the operator
                # is issued in order, the epilogue as soon as both its inputs are computed
                rest.append(b)
                continue
            if missing:
                var = next(iter(missing))
                other = groups.get(var)
                why = f"split {other}" if other is not None else "a binding that depends on it"
                raise PlanError(
                    f"order: split {split} reads {var.name}, computed by {why} that the order "
                    "puts later"
                )
            out.append(b)
            done.add(b.var)
        drain()
    if len(out) != len(bindings):  # cannot happen for a well-formed block
        raise PlanError("order: the bindings of main do not form a data-flow order")
    return out


@tvm.transform.module_pass(opt_level=0, name="codl.OrderSplits")
class OrderSplits:
    """Order ``main``'s bindings so the splits run in ``order`` (see the module docstring).

    Parameters
    ----------
    order
        Split (plan entry) names, in the order their kernels should be issued.
    """

    def __init__(self, order: Sequence[str]) -> None:
        self.order = tuple(order)
        if len(set(self.order)) != len(self.order):
            raise PlanError(f"order: a split appears twice in {list(self.order)}")

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        try:
            splits = collect_parts(mod)
        except ValueError as exc:
            raise PlanError(f"order: {exc}") from None
        names = {s.name for s in splits}
        unknown = [s for s in self.order if s not in names]
        if unknown:
            raise PlanError(
                f"order: main has no split {unknown[0]!r} (it has: {', '.join(sorted(names))})"
            )
        groups: dict[relax.Var, str] = {}
        heads = {part.bindings[0] for s in splits for part in s.parts if part.bindings}
        for s in splits:
            for part in s.parts:
                for var in part.bindings:
                    groups[var] = s.name
            groups[s.output] = s.name  # the concat merging the parts
        func = mod["main"]
        blocks = []
        changed = False
        for block in func.body.blocks:
            old = list(block.bindings)
            new = order_bindings(old, groups, self.order, heads)
            changed |= any(a is not b for a, b in zip(old, new, strict=True))
            kind = (
                relax.DataflowBlock
                if isinstance(block, relax.DataflowBlock)
                else relax.BindingBlock
            )
            blocks.append(kind(new))
        if not changed:
            return mod
        body = relax.BlockBuilder().normalize(relax.SeqExpr(blocks, func.body.body))
        new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
        out = mod.clone()
        out.update_func(mod.get_global_var("main"), new_func)
        return out
