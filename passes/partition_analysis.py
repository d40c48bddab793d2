"""What :class:`~codl_tvm.passes.partition.PartitionOperators` reads before it rewrites: the
plan's chains resolved to ``main``'s bindings, their followers and the blocks after them.

This module owns the analysis half of the partition pass; it rewrites nothing.
:class:`OperatorAnalysis` indexes ``main`` (bindings, uses, binding order, the partitionable
operators) and resolves each :class:`~codl_tvm.core.plan.ChainPlan` to a :class:`Chain` of
:class:`Step` s: the anchor operators with the elementwise followers absorbed after them
(``_absorb``), and, on request, the channel-local block (InstanceNorm) or the row-local block
(LRN) that reads a split's merged output (:meth:`OperatorAnalysis.channel_block`,
:meth:`OperatorAnalysis.row_block`). :func:`share_followers` gives a follower that joins two
chains to one of them; :func:`sliding_window` and :func:`channel_map` turn an anchor step into
the geometry (:mod:`codl_tvm.core.geometry`) that sizes its parts' halos and channel slices.
The planner reads the same analysis to see which chains a module allows.

Preconditions are the pass's: ``main`` in normal form with static shapes, not yet partitioned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from codl_tvm.core.geometry import ChannelMap, SlidingWindow
from codl_tvm.core.plan import (
    ChainPlan,
    PartitionDim,
    PlanError,
    iter_main_bindings,
    partitionable_bindings,
)

__all__ = [
    "BINARY_OPS",
    "CHANNEL_BLOCK",
    "REDUCE_OPS",
    "ROW_BLOCK",
    "ROW_LOCAL_OPS",
    "UNARY_OPS",
    "Chain",
    "OperatorAnalysis",
    "Step",
    "add_blocks",
    "channel_extent",
    "channel_map",
    "int_fields",
    "op_name",
    "share_followers",
    "sliding_window",
    "tensor_shape",
]

UNARY_OPS = frozenset(
    f"relax.{n}"
    for n in (
        "nn.relu",
        "clip",
        "sigmoid",
        "tanh",
        "nn.silu",
        "nn.gelu",
        "nn.gelu_tanh",
        "nn.leakyrelu",
        "nn.softplus",
        "nn.selu",
        "exp",
        "negative",
        "sqrt",
        "abs",
        "erf",
        "astype",
    )
)
BINARY_OPS = frozenset(
    f"relax.{n}" for n in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
)
#: Reductions that keep the channel axis (``keepdims``) and reduce others: channel-local.
REDUCE_OPS = frozenset(f"relax.{n}" for n in ("mean", "variance", "sum", "max", "min"))
#: Suffix of the name of a channel block's split (its plan entry is the split it follows).
CHANNEL_BLOCK = "+channels"
#: Suffix of the name of a row block's split (the H split it follows; see ``row_block``).
ROW_BLOCK = "+rows"
#: Ops a row block may hold besides elementwise ones, when they leave the rows (axis 2) alone.
ROW_LOCAL_OPS = frozenset(("relax.nn.pad", "relax.strided_slice"))


@dataclass
class Step:
    """One binding of a chain: an anchor operator or a follower."""

    var: relax.Var
    value: relax.Expr
    role: str  # "anchor", "unary", "binary", "batch_norm", "getitem", "local"
    kind: str  # anchor kind (conv2d, ...) or the op name
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


@dataclass
class Chain:
    entry: ChainPlan
    steps: list[Step]
    input: relax.Expr
    axis: int
    dropped: list[relax.Var] = field(default_factory=list)

    @property
    def name(self) -> str:
        ops = self.entry.ops
        return ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]}"


def tensor_shape(expr) -> tuple[int, ...]:
    ty = expr.ty
    return tuple(int(v) for v in ty.shape.values)


def int_fields(expr) -> list[int] | None:
    """The integers of a tuple argument (``strided_slice``'s axes), or None."""
    fields = getattr(expr, "fields", None)
    if fields is None:
        return None
    try:
        return [int(getattr(f, "value", f)) for f in fields]
    except (TypeError, ValueError):
        return None


def op_name(value) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def channel_extent(expr) -> int:
    """Extent of a tensor along the channel axis of a 4-D NCHW tensor it broadcasts with."""
    shape = tensor_shape(expr)
    k = 1 - (4 - len(shape))
    return shape[k] if 0 <= k < len(shape) else 1


class OperatorAnalysis:
    """Bindings and uses of ``main``, and the chains of a plan resolved to bindings.

    Parameters
    ----------
    mod : tvm.IRModule
        The module the plan names operators of (``main`` in normal form, static shapes).

    Attributes
    ----------
    anchors : dict[str, tuple[OpInfo, relax.VarBinding]]
        The partitionable operators by name (:func:`~codl_tvm.core.plan.partitionable_bindings`).
    value_of, uses, order, block_of : dict
        Each variable's bound value, its users (None: ``main``'s result), its binding position
        and its binding block.
    """

    def __init__(self, mod: tvm.IRModule):
        self.block_of: dict[relax.Var, int] = {}
        self.order: dict[relax.Var, int] = {}  # binding position in main
        self.value_of: dict[relax.Var, relax.Expr] = {}
        self.uses: dict[relax.Var, list[relax.Var | None]] = {}
        iter_main_bindings(mod)  # checks that main is a Relax function in normal form
        for bi, block in enumerate(mod["main"].body.blocks):
            for binding in block.bindings:
                var = binding.var
                self.block_of[var] = bi
                self.order[var] = len(self.order)
                self.value_of[var] = binding.value
                for used in relax.analysis.free_vars(binding.value):
                    self.uses.setdefault(used, []).append(var)
        for used in relax.analysis.free_vars(mod["main"].body.body):
            self.uses.setdefault(used, []).append(None)
        self.anchors = {info.name: (info, b) for info, b in partitionable_bindings(mod)}
        self.params = set(mod["main"].params)

    def const_array(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of ``expr`` when it is a constant, possibly reshaped or transposed."""
        if isinstance(expr, tvm.ir.Constant):
            return expr.value.numpy()
        if isinstance(expr, relax.Var) and expr in self.value_of:
            value = self.value_of[expr]
            op = op_name(value)
            if op == "relax.reshape":
                src = self.const_array(value.args[0])
                return None if src is None else src.reshape(tensor_shape(expr))
            if op == "relax.permute_dims":
                src = self.const_array(value.args[0])
                if src is None:
                    return None
                axes = value.attrs.axes
                return np.transpose(src, None if axes is None else [int(a) for a in axes])
        return None

    def single_user(self, var: relax.Var) -> relax.Var | None:
        users = self.uses.get(var, [])
        if (
            len(users) == 1
            and users[0] is not None
            and self.block_of[users[0]] == self.block_of[var]
        ):
            return users[0]
        return None

    def chain(self, entry: ChainPlan) -> Chain:
        where = f"chain {list(entry.ops)}" if len(entry.ops) > 1 else f"op {entry.ops[0]}"
        steps: list[Step] = []
        dropped: list[relax.Var] = []
        first_input = None
        for k, name in enumerate(entry.ops):
            info, binding = self.anchors[name]
            data = binding.value.args[0]
            if k == 0:
                first_input = data
            else:
                prev = steps[-1].var
                if not data.same_as(prev):
                    raise PlanError(
                        f"{where}: {name} does not read the output of "
                        f"{entry.ops[k - 1]} (and its followers); chained operators "
                        "must be consecutive"
                    )
                if self.single_user(prev) is None:
                    raise PlanError(
                        f"{where}: the output of {entry.ops[k - 1]} "
                        f"({prev.name}) is also used outside the chain; split "
                        "the chain there"
                    )
            steps.append(
                Step(
                    binding.var,
                    binding.value,
                    "anchor",
                    info.kind,
                    tensor_shape(data),
                    tensor_shape(binding.var),
                )
            )
            self._absorb(steps, dropped)
        kinds = {s.kind for s in steps if s.role == "anchor"}
        if "matmul" in kinds and len(kinds) > 1:
            raise PlanError(f"{where}: cannot chain matmul with {sorted(kinds - {'matmul'})}")
        if entry.dim == PartitionDim.H:
            axis = 2
        else:
            axis = len(steps[-1].out_shape) - 1 if "matmul" in kinds else 1
        blocks = {self.block_of[s.var] for s in steps}
        if len(blocks) != 1:
            raise PlanError(f"{where}: operators lie in different binding blocks of main")
        return Chain(entry, steps, first_input, axis, dropped)

    def channel_block(
        self, chain: Chain, taken: set[relax.Var], ratio: float | None = None
    ) -> Chain | None:
        """The channel-local block that reads ``chain``'s merged output, as an OC split at
        ``ratio`` (None: the chain's ratio), or None.

        InstanceNorm (imported as mean, variance and elementwise ops over the conv output),
        with its affine, activation and a residual add, reads its input several times, so it
        is no follower; left whole, one processor runs it while the other waits. Every output
        channel of such a block depends on the same input channel only, so both processors
        can each normalise a share of the channels of the merged output. The block: the
        closure of the users of the output that are unary or binary elementwise ops or
        reductions keeping the channel axis (``keepdims``), whose other operands are bound
        before it and broadcast along channels or span them all, holding at least one
        reduction and ending in one variable of the output's shape.
        """
        v = chain.steps[-1].var
        shape = tensor_shape(v)
        if len(shape) != 4:
            return None
        channels = shape[1]
        inside: dict[relax.Var, Step] = {}

        def operand_ok(a) -> bool:
            if not isinstance(a, relax.Var):
                return not isinstance(a.ty, relax.TensorType) or channel_extent(a) in (1, channels)
            if a.same_as(v) or a in inside:
                return True
            return channel_extent(a) in (1, channels) and self._outside_block(a, v)

        def local_step(u) -> Step | None:
            if not isinstance(u.ty, relax.TensorType) or channel_extent(u) != channels:
                return None
            found = self._block_candidate(u, v, inside, taken, operand_ok)
            if found is None:
                return None
            value, op, args, ins = found
            if op in REDUCE_OPS:
                axes = value.attrs.axis
                rank = len(tensor_shape(args[0]))
                if axes is None or not bool(value.attrs.keepdims):
                    return None
                if 1 in {int(a) % rank for a in axes}:
                    return None
            elif op not in UNARY_OPS and op not in BINARY_OPS:
                return None
            return Step(u, value, "local", op, tensor_shape(ins[0]), tensor_shape(u))

        steps = self._grow_block(v, inside, local_step, REDUCE_OPS)
        if steps is None:
            return None
        ratio = chain.entry.ratio if ratio is None else ratio
        entry = ChainPlan((chain.name + CHANNEL_BLOCK,), PartitionDim.OC, ratio)
        return Chain(entry, steps, v, 1)

    def row_block(self, chain: Chain, taken: set[relax.Var]) -> Chain | None:
        """The row-local block that reads an H split's merged output, as an H split at the
        split's ratio, or None.

        LRN as :class:`~codl_tvm.passes.lrn.LRNWindowSum` writes it squares its input, pads it
        along channels, adds channel slices of it and divides the input by the result: it
        reads its input twice, so it is no follower, and left whole one processor runs it while
        the other waits (AlexNet's two LRNs: 1.8 ms of its CPU lane at k = 12). Every output row
        of such a block depends on the same input row only, so each processor can compute the
        block on its rows of the merged output. The block: the closure of the users of the
        output that are unary or binary elementwise ops, channel pads or channel slices (any op
        of ``ROW_LOCAL_OPS`` that leaves axis 2 alone), keeping the output's rows, whose other
        tensor operands are bound before it and broadcast along rows or span them all; it
        holds at least one pad or slice (otherwise its ops would have been followers) and ends
        in one variable of the output's shape.
        """
        v = chain.steps[-1].var
        shape = tensor_shape(v)
        if len(shape) != 4:
            return None
        rows = shape[2]
        inside: dict[relax.Var, Step] = {}

        def operand_ok(a) -> bool:
            if not isinstance(a.ty, relax.TensorType):
                return True  # attributes passed as arguments (a slice's axes, begin, end)
            if isinstance(a, relax.Var) and (a.same_as(v) or a in inside):
                return True
            extent = tensor_shape(a)
            local = 2 - (4 - len(extent))
            if local >= 0 and extent[local] not in (1, rows):
                return False
            return self._outside_block(a, v)

        def local_step(u) -> Step | None:
            if not isinstance(u.ty, relax.TensorType) or len(tensor_shape(u)) != 4:
                return None
            if tensor_shape(u)[2] != rows:
                return None
            found = self._block_candidate(u, v, inside, taken, operand_ok)
            if found is None:
                return None
            value, op, args, ins = found
            if op == "relax.nn.pad":
                width = [int(w) for w in value.attrs.pad_width]
                if str(value.attrs.pad_mode) != "constant" or width[4:6] != [0, 0]:
                    return None
            elif op == "relax.strided_slice":
                axes = int_fields(args[1]) if len(args) > 1 else None
                if axes is None or 2 in {a % 4 for a in axes}:
                    return None
            elif op not in UNARY_OPS and op not in BINARY_OPS:
                return None
            return Step(u, value, "local", op, tensor_shape(ins[0]), tensor_shape(u))

        steps = self._grow_block(v, inside, local_step, ROW_LOCAL_OPS)
        if steps is None:
            return None
        entry = ChainPlan((chain.name + ROW_BLOCK,), PartitionDim.H, chain.entry.ratio)
        return Chain(entry, steps, v, 2)

    def _outside_block(self, a, v) -> bool:
        """Whether operand ``a`` of a block reading ``v`` does not depend on the block: a
        constant, a parameter, bound before ``v``, or a reshaped constant (an affine's scale)."""
        if not isinstance(a, relax.Var) or a in self.params:
            return True
        if a not in self.order:
            return False
        return self.order[a] < self.order[v] or self.const_array(a) is not None

    def _block_candidate(self, u, v, inside: dict, taken: set, operand_ok):
        """``(value, op, args, block operands)`` of ``u`` if it may join the block reading
        ``v`` (an op in ``v``'s dataflow block, not taken by a split, reading the block, with
        every operand ``operand_ok``), else None."""
        value = self.value_of.get(u)
        op = op_name(value)
        if op is None or u in taken or self.block_of[u] != self.block_of[v]:
            return None
        args = list(value.args)
        ins = [a for a in args if isinstance(a, relax.Var) and (a.same_as(v) or a in inside)]
        if not ins or not all(operand_ok(a) for a in args):
            return None
        return value, op, args, ins

    def _grow_block(self, v, inside: dict, local_step, required: frozenset) -> list | None:
        """Grow ``inside`` with every user of ``v`` or of ``inside`` that ``local_step`` takes,
        and return its steps in binding order when it holds an op of ``required`` and ends in
        one variable of ``v``'s shape, read outside it; else None. ``local_step`` sees
        ``inside`` as it grows (an op joins once all its block operands are in)."""
        grew = True
        while grew:
            grew = False
            for src in [v, *inside]:
                for u in self.uses.get(src, []):
                    if u is None or u in inside:
                        continue
                    step = local_step(u)
                    if step is not None:
                        inside[u] = step
                        grew = True
        if not any(s.kind in required for s in inside.values()):
            return None
        exits = [
            u for u in inside if any(w is None or w not in inside for w in self.uses.get(u, [None]))
        ]
        if len(exits) != 1 or tensor_shape(exits[0]) != tensor_shape(v):
            return None
        steps = sorted(inside.values(), key=lambda s: self.order[s.var])
        return steps if steps[-1].var.same_as(exits[0]) else None

    def _absorb(self, steps: list[Step], dropped: list[relax.Var]) -> None:
        """Append the elementwise followers of ``steps[-1]`` while each has a single use."""
        chain_vars = {s.var for s in steps}
        while True:
            cur = steps[-1].var
            user = self.single_user(cur)
            if user is None:
                return
            value = self.value_of[user]
            op = op_name(value)
            shape = tensor_shape(cur)
            if (
                op in UNARY_OPS
                and value.args[0].same_as(cur)
                and not any(isinstance(a, relax.Var) for a in value.args[1:])
                and tensor_shape(user) == shape
            ):
                steps.append(Step(user, value, "unary", op, shape, shape))
            elif (
                op in BINARY_OPS
                and tensor_shape(user) == shape
                and any(a.same_as(cur) for a in value.args)
            ):
                others = [a for a in value.args if not a.same_as(cur)]
                if any(isinstance(a, relax.Var) and a in chain_vars for a in others):
                    return
                steps.append(Step(user, value, "binary", op, shape, shape))
            elif (
                op == "relax.nn.batch_norm"
                and value.args[0].same_as(cur)
                and int(value.attrs.axis) == 1
                and len(shape) == 4
            ):
                getitems = self.uses.get(user, [])
                main_out = None
                side = []
                for g in getitems:
                    gv = self.value_of.get(g) if g is not None else None
                    if not isinstance(gv, relax.TupleGetItem):
                        return
                    if gv.index == 0 and main_out is None:
                        main_out = g
                    elif self.uses.get(g):
                        return  # mean/var outputs are used: keep batch_norm unsplit
                    else:
                        side.append(g)
                if main_out is None or tensor_shape(main_out) != shape:
                    return
                steps.append(Step(user, value, "batch_norm", op, shape, shape))
                steps.append(
                    Step(main_out, self.value_of[main_out], "getitem", "getitem", shape, shape)
                )
                dropped.extend(side)
            else:
                return
            chain_vars.add(steps[-1].var)


def share_followers(analysis: OperatorAnalysis, chains: list[Chain]) -> list[Chain]:
    """Give each follower to one chain.

    Two chains absorb the same follower when it joins their outputs and each output has no
    other use: ResNet's projection block adds its two split branches. The follower stays with
    the chain that has operators after it (it must, to stay one chain), else with the one that
    starts later, which then reads the other's merged output; the other chain ends before it.
    """
    claims: dict[relax.Var, list[int]] = {}
    for ci, chain in enumerate(chains):
        for step in chain.steps:
            if step.role != "anchor":
                claims.setdefault(step.var, []).append(ci)

    def anchors_after(ci: int, var: relax.Var) -> bool:
        steps = chains[ci].steps
        k = next(i for i, s in enumerate(steps) if s.var.same_as(var))
        return any(s.role == "anchor" for s in steps[k + 1 :])

    cut_at: dict[int, int] = {}
    for var, owners in claims.items():
        if len(owners) < 2:
            continue
        keep = max(
            owners,
            key=lambda ci: (anchors_after(ci, var), analysis.order[chains[ci].steps[0].var]),
        )
        for ci in owners:
            if ci == keep:
                continue
            if anchors_after(ci, var):
                raise PlanError(
                    f"chains {chains[ci].name} and {chains[keep].name} both continue through "
                    f"{var.name}; split one of them before it"
                )
            k = next(i for i, s in enumerate(chains[ci].steps) if s.var.same_as(var))
            cut_at[ci] = min(cut_at.get(ci, k), k)
    result = []
    for ci, chain in enumerate(chains):
        if ci not in cut_at:
            result.append(chain)
            continue
        steps = chain.steps[: cut_at[ci]]
        kept = {s.var for s in steps}
        dropped = [d for d in chain.dropped if analysis.value_of[d].tuple_value in kept]
        result.append(Chain(chain.entry, steps, chain.input, chain.axis, dropped))
    return result


def sliding_window(step: Step) -> SlidingWindow:
    a = step.value.attrs
    if step.kind == "conv2d":
        kernel = tensor_shape(step.value.args[1])[2]
        ceil = False
    else:
        kernel = int(a.pool_size[0])
        ceil = bool(a.ceil_mode)
    pad = [int(p) for p in a.padding]
    return SlidingWindow(
        step.in_shape[2], kernel, int(a.strides[0]), int(a.dilation[0]), pad[0], pad[2], ceil
    )


def channel_map(step: Step) -> ChannelMap | None:
    if step.kind == "conv2d":
        w = tensor_shape(step.value.args[1])
        return ChannelMap(step.in_shape[1], w[0], int(step.value.attrs.groups))
    if step.kind == "matmul":
        return ChannelMap(step.in_shape[-1], step.out_shape[-1], 1)
    return None  # pools: channel-wise


def add_blocks(chains: list[Chain], find) -> None:
    """Append to ``chains`` the block ``find(chain, taken)`` gives after each split chain, with
    ``taken`` the variables chains and earlier blocks already hold. A chain kept whole on one
    processor gets none: its block stays there, unsplit."""
    taken = {s.var for c in chains for s in c.steps}
    taken.update(d for c in chains for d in c.dropped)
    for chain in list(chains):
        if not 0.0 < chain.entry.ratio < 1.0:
            continue
        block = find(chain, taken)
        if block is not None:
            chains.append(block)
            taken.update(s.var for s in block.steps)
