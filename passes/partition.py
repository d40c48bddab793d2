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

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from codl_tvm.core.geometry import (
    PartSpan,
    Span,
    chain_channel_spans,
    chain_row_spans,
    oc_granularity,
    split_point,
)
from codl_tvm.core.plan import (
    PartitionDim,
    PartitionPlan,
    PlanError,
)

from .partition_analysis import (
    Chain,
    OperatorAnalysis,
    Step,
    add_blocks,
    channel_map,
    share_followers,
    sliding_window,
    tensor_shape,
)
from .parts import PARTS_ATTR, Processor

__all__ = ["PartitionOperators"]

# Plan errors raised inside the pass reach the caller as PlanError, not as a generic RuntimeError.
tvm_ffi.register_error("PlanError", PlanError)


@mutator
class _Rewriter(PyExprMutator):
    """Re-emits ``main`` with every planned chain replaced by its parts and their merge."""

    def __init__(self, mod: tvm.IRModule, analysis: OperatorAnalysis, chains: list[Chain]):
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
        full = tensor_shape(orig)[axis]
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
        shape = tensor_shape(orig)
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
    def _emit_chain(self, chain: Chain):
        sid = self._next_id
        self._next_id += 1
        steps, axis, dim = chain.steps, chain.axis, chain.entry.dim
        extent = steps[-1].out_shape[axis]
        if dim == PartitionDim.H:
            geoms = [sliding_window(s) if s.role == "anchor" else None for s in steps]
            spans_of = chain_row_spans
            gran = 1
        else:
            geoms = [channel_map(s) if s.role == "anchor" else None for s in steps]
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
        chain: Chain,
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
        self, step: Step, env: dict, ps: PartSpan, axis: int, prefix: str, bindings, where
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
        step: Step,
        prev: relax.Expr,
        ps: PartSpan,
        x,
        chain: Chain,
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
    def _keep_ceil_width(step: Step, pad, a) -> list[int]:
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
        step: Step,
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
            w_axis = len(tensor_shape(w)) - 1
            weight = self._slice(w, w_axis, ps.computed, f"{prefix}_w", bindings)
            return relax.op.matmul(x, weight, out_dtype=a.out_dtype)
        pad = [int(p) for p in a.padding]
        if dim == PartitionDim.H:
            pad = [ps.pad_before, pad[1], ps.pad_after, pad[3]]
        if step.kind == "conv2d":
            w = value.args[1]
            groups = int(a.groups)
            if dim == PartitionDim.OC:
                groups = channel_map(step).part_groups(ps.computed)
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
        that reads a split's output (see ``OperatorAnalysis.channel_block``), at the plan's
        ``block_ratio``. FST on the emulated SoC: 0.86-0.96x the latency.
    row_blocks
        Also split, along rows at the split's ratio, the row-local block (LRN) that reads an H
        split's output (see ``OperatorAnalysis.row_block``). Off by default: AlexNet at k = 12 took
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
        analysis = OperatorAnalysis(mod)
        chains = share_followers(analysis, [analysis.chain(e) for e in entries])
        if self.channel_blocks:
            add_blocks(
                chains,
                lambda chain, taken: analysis.channel_block(chain, taken, self.plan.block_ratio),
            )
        if self.row_blocks:
            add_blocks(
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
