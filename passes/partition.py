"""codl.PartitionOperators: split the operators and chains of a plan between GPU and CPU.

Preconditions
-------------
- Runs on the Relax module as imported (e.g. from ONNX), **before** LegalizeOps or any fusion:
  ``main`` is in normal form, with static shapes, and the plan's operator names are those of
  :func:`codl_tvm.core.plan.partitionable_ops` on the module given to the pass.
- conv2d in NCHW/OIHW, pools in NCHW, matmul with its weight as the second operand (``(..., K,
  N)``, split along N). The plan is validated first (:meth:`PartitionPlan.validate`).
- ``main`` is not partitioned yet (no ``"codl_parts"`` attribute): apply one plan, once.
- Every operator of a chain must read the output of the previous one (after its followers), and
  that output must have no other use; otherwise :class:`~codl_tvm.core.plan.PlanError` says which.

What is emitted
---------------
For every plan entry (an :class:`~codl_tvm.core.plan.OpPartition` is a chain of one operator) the
chain's last output, of extent ``E`` along the split axis (H: axis 2; OC: axis 1, or the last
axis for matmul), is cut at ``n = round(ratio * E)`` (for a grouped conv, at whole groups): the
GPU part produces ``[0, n)``, the CPU part ``[n, E)``. A part with nothing to produce is not
created, so ratio 0 or 1 gives one part and no concat. Each part is a run of ordinary Relax
ops, all bound to fresh variables named ``codl{K}_{gpu|cpu}_...``::

    codlK_gpu_in   = R.strided_slice(x, axes=[2], begin=[a], end=[b])   # rows it reads (+ halo)
    codlK_gpu_0_conv2d = R.nn.conv2d(codlK_gpu_in, w, padding=[pt', l, pb', r], ...)
    codlK_gpu_1_add    = R.add(codlK_gpu_0_conv2d, bias)                # follower
    codlK_gpu_2_relu   = R.nn.relu(codlK_gpu_1_add)                     # follower
    ...                                                                  # next chain ops
    (the same for cpu)
    codlK_out = R.concat((codlK_gpu_<last>, codlK_cpu_<last>), axis=2)   # the merge

H parts read their input rows plus the halo (:func:`codl_tvm.core.geometry.chain_row_spans`): the
slice is clamped to the image and the clamped amounts become the part's own top/bottom padding, so
every part is exact; in a chain each part computes the halo rows it needs from its own data
(redundant compute at the part border, CoDL Eq. 1 and Fig. 12). OC parts slice the weights (and
per-channel operands: bias, batch-norm parameters) along the output channels; constant weights
(also through reshape/permute_dims of a constant) are sliced here, at compile time, into new
constants; others get a ``strided_slice`` in the part. Grouped and depthwise convs are split by
whole groups and read only their groups' input channels. Followers (unary elementwise ops, binary
elementwise ops such as bias or residual add, batch_norm + ``[0]``) are absorbed while their input
has a single use; their other operand is sliced to the part's rows/channels unless it broadcasts
along the split axis. A join of two split chains' outputs (ResNet's projection block) goes to one
of them, the later one unless only the earlier continues past it. Matmul OC cuts fall on whole
vectors of ``MATMUL_OC_ALIGN`` features. Slices that would cover the whole axis are not emitted.
Other bindings a part may hold, in emission order: ``codlK_<p>_<j>_w`` (a non-constant weight
sliced for OC), ``codlK_<p>_<j>_arg<k>`` / ``codlK_<p>_<j>_bn<k>`` (a non-constant follower operand
sliced), ``codlK_<p>_<j>_trim`` (a grouped conv's whole groups cut back to the channels needed).
The GPU part is emitted first, then the CPU part, then the merge. The variables of the original
operators and followers inside the split disappear (including unused batch_norm mean/var outputs);
the merge variable takes the place of the last one.

With ``channel_blocks=True``, the channel-local block that reads a split's merged output
(InstanceNorm as imported: mean and variance over H and W, elementwise ops, the affine, an
activation or a residual add) becomes a split of its own along channels at that split's ratio,
named ``<split>+channels``: each part normalises its channels of the merged output. Its GPU
share is the plan's ``block_ratio`` (the planner's whole-model balance), else the split's ratio;
after an operator kept whole on one processor the block stays there.

With ``row_blocks=True``, the row-local block that reads an H split's merged output (LRN as
``LRNWindowSum`` writes it: channel pads and slices and elementwise ops) becomes a split of its
own along rows at that split's ratio, named ``<split>+rows``: each part computes the block on
its rows of the merged output.

``main`` gets a ``"codl_parts"`` attribute recording, for each split, which variables belong to
which processor, which output region each part writes and which input region it reads, and which
of them are computed from constants alone (``foldable``: the slices of a weight the graph computes,
e.g. by ConstantOfShape, which FoldConstant later turns into constants);
:func:`codl_tvm.passes.parts.collect_parts` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from codl_tvm.core.geometry import (
    ChannelMap,
    PartSpan,
    SlidingWindow,
    Span,
    chain_channel_spans,
    chain_row_spans,
    oc_granularity,
    split_point,
)
from codl_tvm.core.plan import (
    ChainPlan,
    PartitionDim,
    PartitionPlan,
    PlanError,
    iter_main_bindings,
    partitionable_bindings,
)

from .parts import PARTS_ATTR, Processor

__all__ = ["PartitionOperators"]

# Plan errors raised inside the pass reach the caller as PlanError, not as a generic RuntimeError.
tvm_ffi.register_error("PlanError", PlanError)

_UNARY = frozenset(
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
_BINARY = frozenset(
    f"relax.{n}" for n in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
)
#: Reductions that keep the channel axis (``keepdims``) and reduce others: channel-local.
_REDUCE = frozenset(f"relax.{n}" for n in ("mean", "variance", "sum", "max", "min"))
#: Suffix of the name of a channel block's split (its plan entry is the split it follows).
CHANNEL_BLOCK = "+channels"
#: Suffix of the name of a row block's split (the H split it follows; see ``row_block``).
ROW_BLOCK = "+rows"
#: Ops a row block may hold besides elementwise ones, when they leave the rows (axis 2) alone.
_ROW_LOCAL = frozenset(("relax.nn.pad", "relax.strided_slice"))


@dataclass
class _Step:
    """One binding of a chain: an anchor operator or a follower."""

    var: relax.Var
    value: relax.Expr
    role: str  # "anchor", "unary", "binary", "batch_norm", "getitem", "local"
    kind: str  # anchor kind (conv2d, ...) or the op name
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


@dataclass
class _Chain:
    entry: ChainPlan
    steps: list[_Step]
    input: relax.Expr
    axis: int
    dropped: list[relax.Var] = field(default_factory=list)

    @property
    def name(self) -> str:
        ops = self.entry.ops
        return ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]}"


def _shape(expr) -> tuple[int, ...]:
    ty = expr.ty
    return tuple(int(v) for v in ty.shape.values)


def _int_fields(expr) -> list[int] | None:
    """The integers of a tuple argument (``strided_slice``'s axes), or None."""
    fields = getattr(expr, "fields", None)
    if fields is None:
        return None
    try:
        return [int(getattr(f, "value", f)) for f in fields]
    except (TypeError, ValueError):
        return None


def _op_name(value) -> str | None:
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return value.op.name
    return None


def _channel_extent(expr) -> int:
    """Extent of a tensor along the channel axis of a 4-D NCHW tensor it broadcasts with."""
    shape = _shape(expr)
    k = 1 - (4 - len(shape))
    return shape[k] if 0 <= k < len(shape) else 1


class _Analysis:
    """Bindings and uses of ``main``, and the chains of a plan resolved to bindings."""

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
            op = _op_name(value)
            if op == "relax.reshape":
                src = self.const_array(value.args[0])
                return None if src is None else src.reshape(_shape(expr))
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

    def chain(self, entry: ChainPlan) -> _Chain:
        where = f"chain {list(entry.ops)}" if len(entry.ops) > 1 else f"op {entry.ops[0]}"
        steps: list[_Step] = []
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
                _Step(
                    binding.var,
                    binding.value,
                    "anchor",
                    info.kind,
                    _shape(data),
                    _shape(binding.var),
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
        return _Chain(entry, steps, first_input, axis, dropped)

    def channel_block(
        self, chain: _Chain, taken: set[relax.Var], ratio: float | None = None
    ) -> _Chain | None:
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
        shape = _shape(v)
        if len(shape) != 4:
            return None
        channels = shape[1]
        inside: dict[relax.Var, _Step] = {}

        def operand_ok(a) -> bool:
            if not isinstance(a, relax.Var):
                return not isinstance(a.ty, relax.TensorType) or _channel_extent(a) in (1, channels)
            if a.same_as(v) or a in inside:
                return True
            return _channel_extent(a) in (1, channels) and self._outside_block(a, v)

        def local_step(u) -> _Step | None:
            if not isinstance(u.ty, relax.TensorType) or _channel_extent(u) != channels:
                return None
            found = self._block_candidate(u, v, inside, taken, operand_ok)
            if found is None:
                return None
            value, op, args, ins = found
            if op in _REDUCE:
                axes = value.attrs.axis
                rank = len(_shape(args[0]))
                if axes is None or not bool(value.attrs.keepdims):
                    return None
                if 1 in {int(a) % rank for a in axes}:
                    return None
            elif op not in _UNARY and op not in _BINARY:
                return None
            return _Step(u, value, "local", op, _shape(ins[0]), _shape(u))

        steps = self._grow_block(v, inside, local_step, _REDUCE)
        if steps is None:
            return None
        ratio = chain.entry.ratio if ratio is None else ratio
        entry = ChainPlan((chain.name + CHANNEL_BLOCK,), PartitionDim.OC, ratio)
        return _Chain(entry, steps, v, 1)

    def row_block(self, chain: _Chain, taken: set[relax.Var]) -> _Chain | None:
        """The row-local block that reads an H split's merged output, as an H split at the
        split's ratio, or None.

        LRN as :class:`~codl_tvm.passes.lrn.LRNWindowSum` writes it squares its input, pads it
        along channels, adds channel slices of it and divides the input by the result: it
        reads its input twice, so it is no follower, and left whole one processor runs it while
        the other waits (AlexNet's two LRNs: 1.8 ms of its CPU lane at k = 12). Every output row
        of such a block depends on the same input row only, so each processor can compute the
        block on its rows of the merged output. The block: the closure of the users of the
        output that are unary or binary elementwise ops, channel pads or channel slices (any op
        of ``_ROW_LOCAL`` that leaves axis 2 alone), keeping the output's rows, whose other
        tensor operands are bound before it and broadcast along rows or span them all; it
        holds at least one pad or slice (otherwise its ops would have been followers) and ends
        in one variable of the output's shape.
        """
        v = chain.steps[-1].var
        shape = _shape(v)
        if len(shape) != 4:
            return None
        rows = shape[2]
        inside: dict[relax.Var, _Step] = {}

        def operand_ok(a) -> bool:
            if not isinstance(a.ty, relax.TensorType):
                return True  # attributes passed as arguments (a slice's axes, begin, end)
            if isinstance(a, relax.Var) and (a.same_as(v) or a in inside):
                return True
            extent = _shape(a)
            local = 2 - (4 - len(extent))
            if local >= 0 and extent[local] not in (1, rows):
                return False
            return self._outside_block(a, v)

        def local_step(u) -> _Step | None:
            if not isinstance(u.ty, relax.TensorType) or len(_shape(u)) != 4:
                return None
            if _shape(u)[2] != rows:
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
                axes = _int_fields(args[1]) if len(args) > 1 else None
                if axes is None or 2 in {a % 4 for a in axes}:
                    return None
            elif op not in _UNARY and op not in _BINARY:
                return None
            return _Step(u, value, "local", op, _shape(ins[0]), _shape(u))

        steps = self._grow_block(v, inside, local_step, _ROW_LOCAL)
        if steps is None:
            return None
        entry = ChainPlan((chain.name + ROW_BLOCK,), PartitionDim.H, chain.entry.ratio)
        return _Chain(entry, steps, v, 2)

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
        op = _op_name(value)
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
        if len(exits) != 1 or _shape(exits[0]) != _shape(v):
            return None
        steps = sorted(inside.values(), key=lambda s: self.order[s.var])
        return steps if steps[-1].var.same_as(exits[0]) else None

    def _absorb(self, steps: list[_Step], dropped: list[relax.Var]) -> None:
        """Append the elementwise followers of ``steps[-1]`` while each has a single use."""
        chain_vars = {s.var for s in steps}
        while True:
            cur = steps[-1].var
            user = self.single_user(cur)
            if user is None:
                return
            value = self.value_of[user]
            op = _op_name(value)
            shape = _shape(cur)
            if (
                op in _UNARY
                and value.args[0].same_as(cur)
                and not any(isinstance(a, relax.Var) for a in value.args[1:])
                and _shape(user) == shape
            ):
                steps.append(_Step(user, value, "unary", op, shape, shape))
            elif (
                op in _BINARY and _shape(user) == shape and any(a.same_as(cur) for a in value.args)
            ):
                others = [a for a in value.args if not a.same_as(cur)]
                if any(isinstance(a, relax.Var) and a in chain_vars for a in others):
                    return
                steps.append(_Step(user, value, "binary", op, shape, shape))
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
                if main_out is None or _shape(main_out) != shape:
                    return
                steps.append(_Step(user, value, "batch_norm", op, shape, shape))
                steps.append(
                    _Step(main_out, self.value_of[main_out], "getitem", "getitem", shape, shape)
                )
                dropped.extend(side)
            else:
                return
            chain_vars.add(steps[-1].var)


def _share_followers(analysis: _Analysis, chains: list[_Chain]) -> list[_Chain]:
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
        result.append(_Chain(chain.entry, steps, chain.input, chain.axis, dropped))
    return result


def _window(step: _Step) -> SlidingWindow:
    a = step.value.attrs
    if step.kind == "conv2d":
        kernel = _shape(step.value.args[1])[2]
        ceil = False
    else:
        kernel = int(a.pool_size[0])
        ceil = bool(a.ceil_mode)
    pad = [int(p) for p in a.padding]
    return SlidingWindow(
        step.in_shape[2], kernel, int(a.strides[0]), int(a.dilation[0]), pad[0], pad[2], ceil
    )


def _channel_map(step: _Step) -> ChannelMap | None:
    if step.kind == "conv2d":
        w = _shape(step.value.args[1])
        return ChannelMap(step.in_shape[1], w[0], int(step.value.attrs.groups))
    if step.kind == "matmul":
        return ChannelMap(step.in_shape[-1], step.out_shape[-1], 1)
    return None  # pools: channel-wise


@mutator
class _Rewriter(PyExprMutator):
    """Re-emits ``main`` with every planned chain replaced by its parts and their merge."""

    def __init__(self, mod: tvm.IRModule, analysis: _Analysis, chains: list[_Chain]):
        super().__init__(mod)
        self._an = analysis
        self._by_last = {c.steps[-1].var: c for c in chains}
        self._skip = set()
        for c in chains:
            self._skip.update(s.var for s in c.steps[:-1])
            self._skip.update(c.dropped)
        self._next_id = 0
        self._used = {p.name for p in mod["main"].params}
        self._used.update(v.name for v in analysis.value_of)
        self.records: list[dict] = []

    # -- the visitor ---------------------------------------------------------------------------
    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self._skip:
            return
        chain = self._by_last.get(var)
        if chain is None:
            super().visit_var_binding_(binding)
            return
        self.set_var_remap(var, self._emit_chain(chain))

    # -- helpers -------------------------------------------------------------------------------
    def _fresh(self, name: str) -> str:
        candidate, k = name, 1
        while candidate in self._used:
            candidate, k = f"{name}_{k}", k + 1
        self._used.add(candidate)
        return candidate

    def _emit(self, expr: relax.Expr, name: str, bindings: list, output: bool = False):
        if output and self.builder_.current_block_is_dataflow():
            var = self.builder_.emit_output(expr, self._fresh(name))
        else:
            var = self.builder_.emit(expr, self._fresh(name))
        bindings.append(var)
        return var

    def _slice(self, orig: relax.Expr, axis: int, span: Span, name: str, bindings: list):
        """``orig`` restricted to ``span`` along ``axis``: a new constant, a slice, or itself."""
        full = _shape(orig)[axis]
        if span.start == 0 and span.stop == full:
            return self.visit_expr(orig)
        arr = self._an.const_array(orig)
        if arr is not None:
            index = [slice(None)] * arr.ndim
            index[axis] = slice(span.start, span.stop)
            return relax.const(np.ascontiguousarray(arr[tuple(index)]), str(arr.dtype))
        sliced = relax.op.strided_slice(
            self.visit_expr(orig),
            axes=[axis],
            begin=[span.start],
            end=[span.stop],
            assume_inbound=True,
        )
        return self._emit(sliced, name, bindings)

    def _slice_operand(
        self,
        orig: relax.Expr,
        chain_rank: int,
        axis: int,
        full: int,
        span: Span,
        name: str,
        bindings: list,
        where: str,
    ):
        """A broadcasting operand of a follower, restricted to the part's rows/channels."""
        if not isinstance(orig.ty, relax.TensorType):
            return self.visit_expr(orig)
        shape = _shape(orig)
        local = axis - (chain_rank - len(shape))
        if local < 0 or shape[local] == 1:
            return self.visit_expr(orig)
        if shape[local] != full:
            raise PlanError(
                f"{where}: operand of shape {shape} does not match extent {full} along axis {axis}"
            )
        return self._slice(orig, local, span, name, bindings)

    def _input_name(self, orig: relax.Expr) -> str | None:
        """Name of the (remapped) variable the chain reads, or None for a constant."""
        new = self.visit_expr(orig)
        return new.name if isinstance(new, relax.Var) else None

    # -- one chain -----------------------------------------------------------------------------
    def _emit_chain(self, chain: _Chain):
        sid = self._next_id
        self._next_id += 1
        steps, axis, dim = chain.steps, chain.axis, chain.entry.dim
        extent = steps[-1].out_shape[axis]
        if dim == PartitionDim.H:
            geoms = [_window(s) if s.role == "anchor" else None for s in steps]
            spans_of = chain_row_spans
            gran = 1
        else:
            geoms = [_channel_map(s) if s.role == "anchor" else None for s in steps]
            spans_of = chain_channel_spans
            last = next((g for g in reversed(geoms) if g is not None), None)
            matmul = any(s.kind == "matmul" for s in steps if s.role == "anchor")
            gran = oc_granularity(extent, last.granularity if last is not None else 1, matmul)
        cut = split_point(extent, chain.entry.ratio, gran)
        regions = [(Processor.GPU, Span(0, cut)), (Processor.CPU, Span(cut, extent))]
        regions = [(p, s) for p, s in regions if len(s) > 0]
        is_output = not isinstance(steps[-1].var, relax.DataflowVar)
        single = len(regions) == 1
        parts, outs = [], []
        for proc, region in regions:
            try:
                spans = spans_of(geoms, region)
            except ValueError as exc:
                where = f"chain {chain.name}" if len(steps) > 1 else f"op {chain.name}"
                raise PlanError(f"{where}, {proc.value} part {region.as_tuple()}: {exc}") from None
            bindings: list = []
            out = self._emit_part(chain, sid, proc, spans, bindings, single and is_output)
            outs.append(out)
            parts.append(
                {
                    "processor": proc.value,
                    "region": [region.start, region.stop],
                    "input_region": list(spans[0].inp.as_tuple()),
                    "bindings": [v.name for v in bindings],
                }
            )
        if single:
            merged = outs[0]
        else:
            merged = self._emit(
                relax.op.concat(outs, axis=axis), f"codl{sid}_out", [], output=is_output
            )
        self.records.append(
            {
                "name": chain.name,
                "ops": list(chain.entry.ops),
                "dim": dim.value,
                "axis": axis,
                "ratio": chain.entry.ratio,
                "input": self._input_name(chain.input),
                "output": merged.name,
                "parts": parts,
            }
        )
        return merged

    def _emit_part(
        self,
        chain: _Chain,
        sid: int,
        proc: Processor,
        spans: list[PartSpan],
        bindings: list,
        last_is_output: bool,
    ):
        prefix = f"codl{sid}_{proc.value}"
        axis = chain.axis
        cur = self._slice(chain.input, axis, spans[0].inp, f"{prefix}_in", bindings)
        prev = chain.input
        env = {chain.input: cur}  # a channel block's variables -> this part's
        for j, (step, ps) in enumerate(zip(chain.steps, spans)):
            where = f"{chain.name} step {j} ({step.kind})"
            tag = step.kind.rsplit(".", 1)[-1]
            if step.role == "local":
                expr = self._local_expr(step, env, ps, axis, f"{prefix}_{j}", bindings, where)
            else:
                expr = self._step_expr(step, prev, ps, cur, chain, f"{prefix}_{j}", bindings, where)
            prev = step.var
            trim = ps.computed is not None and ps.computed != ps.out
            final = j == len(chain.steps) - 1 and not trim
            cur = self._emit(expr, f"{prefix}_{j}_{tag}", bindings, last_is_output and final)
            if trim:
                lo = ps.out.start - ps.computed.start
                sliced = relax.op.strided_slice(
                    cur, axes=[axis], begin=[lo], end=[lo + len(ps.out)], assume_inbound=True
                )
                final = j == len(chain.steps) - 1
                cur = self._emit(sliced, f"{prefix}_{j}_trim", bindings, last_is_output and final)
            env[step.var] = cur
        return cur

    def _local_expr(
        self, step: _Step, env: dict, ps: PartSpan, axis: int, prefix: str, bindings, where
    ):
        """A channel (row) block's op on this part's channels (rows): block variables become
        the part's, other operands spanning the split axis are sliced to its share."""
        value = step.value
        args = []
        for k, a in enumerate(value.args):
            if isinstance(a, relax.Var) and a in env:
                args.append(env[a])
            else:
                full = step.out_shape[axis]
                name = f"{prefix}_arg{k}"
                args.append(self._slice_operand(a, 4, axis, full, ps.out, name, bindings, where))
        return relax.Call(value.op, args, value.attrs, value.ty_args)

    def _step_expr(
        self,
        step: _Step,
        prev: relax.Expr,
        ps: PartSpan,
        x,
        chain: _Chain,
        prefix: str,
        bindings: list,
        where: str,
    ):
        value, axis, dim = step.value, chain.axis, chain.entry.dim
        if step.role == "anchor":
            return self._anchor_expr(step, ps, x, dim, axis, prefix, bindings)
        if step.role == "getitem":
            return relax.TupleGetItem(x, value.index)
        if step.role == "unary":
            args = [x, *(self.visit_expr(a) for a in value.args[1:])]
            return relax.Call(value.op, args, value.attrs, value.ty_args)
        full = step.in_shape[axis]
        if step.role == "binary":
            args = []
            for k, a in enumerate(value.args):
                if a.same_as(prev):
                    args.append(x)
                else:
                    args.append(
                        self._slice_operand(
                            a,
                            len(step.in_shape),
                            axis,
                            full,
                            ps.out,
                            f"{prefix}_arg{k}",
                            bindings,
                            where,
                        )
                    )
            return relax.Call(value.op, args, value.attrs, value.ty_args)
        # batch_norm: per-channel parameters follow an OC split
        params = []
        for k, a in enumerate(value.args[1:], start=1):
            if dim == PartitionDim.OC:
                params.append(self._slice(a, 0, ps.out, f"{prefix}_bn{k}", bindings))
            else:
                params.append(self.visit_expr(a))
        return relax.Call(value.op, [x, *params], value.attrs, value.ty_args)

    @staticmethod
    def _keep_ceil_width(step: _Step, pad, a) -> list[int]:
        """Right padding that gives a part without ``ceil_mode`` the pool's ceil-mode width.

        ``ceil_mode`` acts on both axes; an H part that drops it (only the part holding the
        last row keeps it) would lose the last column when the width rounds up. Extra right
        padding restores it exactly for max pooling and for average pooling that does not
        count padding; average pooling that counts padding cannot be emulated.
        """
        pad = [int(p) for p in pad]
        w_in, w_out = int(step.in_shape[3]), int(step.out_shape[3])
        k, s, d = int(a.pool_size[1]), int(a.strides[1]), int(a.dilation[1])
        span = d * (k - 1) + 1

        def floor_width(extra: int) -> int:
            return (w_in + pad[1] + pad[3] + extra - span) // s + 1

        if floor_width(0) == w_out:
            return pad
        if step.kind != "max_pool2d" and bool(a.count_include_pad):
            raise PlanError(
                f"{step.var.name}: an average pool with ceil_mode and count_include_pad whose "
                f"width rounds up ({w_in} -> {w_out}) cannot be split along H"
            )
        extra = 0
        while floor_width(extra) < w_out:
            extra += 1
        pad[3] += extra
        return pad

    def _anchor_expr(
        self,
        step: _Step,
        ps: PartSpan,
        x,
        dim: PartitionDim,
        axis: int,
        prefix: str,
        bindings: list,
    ):
        value, a = step.value, step.value.attrs
        if step.kind == "matmul":
            w = value.args[1]
            w_axis = len(_shape(w)) - 1
            weight = self._slice(w, w_axis, ps.computed, f"{prefix}_w", bindings)
            return relax.op.matmul(x, weight, out_dtype=a.out_dtype)
        pad = [int(p) for p in a.padding]
        if dim == PartitionDim.H:
            pad = [ps.pad_before, pad[1], ps.pad_after, pad[3]]
        if step.kind == "conv2d":
            w = value.args[1]
            groups = int(a.groups)
            if dim == PartitionDim.OC:
                groups = _channel_map(step).part_groups(ps.computed)
                weight = self._slice(w, 0, ps.computed, f"{prefix}_w", bindings)
            else:
                weight = self.visit_expr(w)
            return relax.op.nn.conv2d(
                x,
                weight,
                strides=a.strides,
                padding=pad,
                dilation=a.dilation,
                groups=groups,
                data_layout=a.data_layout,
                kernel_layout=a.kernel_layout,
                out_layout=a.out_layout,
                out_dtype=a.out_dtype,
            )
        pool = relax.op.nn.max_pool2d if step.kind == "max_pool2d" else relax.op.nn.avg_pool2d
        ceil = ps.ceil_mode if dim == PartitionDim.H else bool(a.ceil_mode)
        if bool(a.ceil_mode) and not ceil:
            pad = self._keep_ceil_width(step, pad, a)
        return pool(
            x,
            pool_size=a.pool_size,
            strides=a.strides,
            padding=pad,
            dilation=a.dilation,
            ceil_mode=ceil,
            count_include_pad=a.count_include_pad,
            layout=a.layout,
            out_layout=a.out_layout,
        )


def _add_blocks(chains: list[_Chain], find) -> None:
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


def _constant_vars(func: relax.Function) -> set[str]:
    """Names of the bindings of ``func`` computed from constants alone (no parameter reaches
    them): FoldConstant may replace each by a constant and drop its binding."""
    const: set[relax.Var] = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            if all(v in const for v in relax.analysis.free_vars(binding.value)):
                const.add(binding.var)
    return {v.name for v in const}


def _mark_foldable(func: relax.Function, records: list[dict]) -> None:
    """Add to each record the ``"foldable"`` names: its variables computed from constants
    alone. A weight computed by the graph (ConstantOfShape, a constant times a constant) is
    sliced per part by a ``strided_slice`` of that computation; FoldConstant, which runs
    before PlaceParts, turns such a slice into a constant and removes its binding, which
    :func:`~codl_tvm.passes.parts.collect_parts` must then accept."""
    const = _constant_vars(func)
    for rec in records:
        names = [rec["input"], rec["output"], *(n for p in rec["parts"] for n in p["bindings"])]
        rec["foldable"] = sorted({n for n in names if n is not None and n in const})


@tvm.transform.module_pass(opt_level=0, name="codl.PartitionOperators")
class PartitionOperators:
    """Split the operators and chains of ``plan`` into a GPU part and a CPU part.

    Parameters
    ----------
    plan
        The partition plan; its operator names refer to the module this pass is applied to
        (see :mod:`codl_tvm.core.plan`). An empty plan leaves the module unchanged.
    channel_blocks
        Also split, along channels at the same ratio, the channel-local block (InstanceNorm)
        that reads a split's output (see ``_Analysis.channel_block``), at the plan's
        ``block_ratio``. FST on the emulated SoC: 0.86-0.96x the latency.
    row_blocks
        Also split, along rows at the split's ratio, the row-local block (LRN) that reads an H
        split's output (see ``_Analysis.row_block``). Off by default: AlexNet at k = 12 took
        1.04-1.07x the latency of its build with the LRN kept whole, PoCL's LRN
        rows being slower than the CPU's at the conv's ratio.

    See the module docstring for preconditions and the exact IR emitted.
    """

    def __init__(self, plan: PartitionPlan, channel_blocks: bool = True, row_blocks: bool = False):
        if not isinstance(plan, PartitionPlan):
            raise TypeError(f"PartitionOperators needs a PartitionPlan, got {type(plan).__name__}")
        self.plan = plan
        self.channel_blocks = channel_blocks
        self.row_blocks = row_blocks

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext):
        entries = self.plan.entries()
        if not entries:
            return mod
        main = mod["main"]
        if main.attrs is not None and PARTS_ATTR in main.attrs:
            raise PlanError(
                f"main is already partitioned (it has a '{PARTS_ATTR}' record); plans name the "
                "operators of the unpartitioned module, so apply one plan, once"
            )
        self.plan.validate(mod)
        analysis = _Analysis(mod)
        chains = _share_followers(analysis, [analysis.chain(e) for e in entries])
        if self.channel_blocks:
            _add_blocks(
                chains,
                lambda chain, taken: analysis.channel_block(chain, taken, self.plan.block_ratio),
            )
        if self.row_blocks:
            _add_blocks(
                chains,
                lambda chain, taken: (
                    analysis.row_block(chain, taken) if chain.entry.dim == PartitionDim.H else None
                ),
            )
        rewriter = _Rewriter(mod, analysis, chains)
        new_main = rewriter.visit_expr(main)
        _mark_foldable(new_main, rewriter.records)
        new_main = new_main.with_attr(PARTS_ATTR, json.dumps(rewriter.records))
        rewriter.builder_.update_func(mod.get_global_var("main"), new_main)
        return rewriter.builder_.get()
