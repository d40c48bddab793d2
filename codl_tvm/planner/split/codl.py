"""CoDL's split planner (sections 4.1 and 4.2): per-operator splits and operator chains.

Owns :class:`SplitPlanner`, which decides for every partitionable operator of a module whether it
runs whole (on which processor) or split (on which dimension, at which GPU share), grows
operator chains (CoDL Algorithm 1) and assembles the :class:`~codl_tvm.core.plan.PartitionPlan`
with one :class:`~codl_tvm.planner.report.Decision` per operator or chain. The baselines that
force a processor (``cpu_only``, ``gpu_only``) or take their splits from another model's choice
(``ulayer_like``) are modes of its :meth:`SplitPlanner.run`; HOPE's operator graph
(:mod:`codl_tvm.planner.placement.graph`) reuses its predictions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from codl_tvm.core.plan import (
    ChainPlan,
    OpInfo,
    OpPartition,
    PartitionDim,
    PartitionPlan,
    PlanError,
    model_fingerprint,
    partitionable_ops,
)
from codl_tvm.cost_model.base import CostModel, shared_nbytes
from codl_tvm.cost_model.features import FeatureError, Partition, part_shape
from codl_tvm.planner.report import Decision, of_it_conversions
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.margin import Uncertainty
from codl_tvm.planner.split.part_shapes import chain_parts, op_params
from codl_tvm.planner.split.pixels import rounded_ratio
from codl_tvm.planner.split.predict import (
    OpEstimate,
    Predictor,
    SplitEstimate,
    covered_impls,
    expected_impl,
)

__all__ = ["SplitPlanner"]


class _Chainable:
    """Whether operators can form a chain, by the partitioning pass's own analysis."""

    def __init__(self, mod):
        # deferred: needs TVM's compiler
        from codl_tvm.passes.partition_analysis import OperatorAnalysis

        self._analysis = OperatorAnalysis(mod)
        self._cache: dict[tuple, bool] = {}

    def __call__(self, names: tuple[str, ...], dim: str) -> bool:
        key = (names, dim)
        if key not in self._cache:
            try:
                self._analysis.chain(ChainPlan(names, dim, 0.5))
                self._cache[key] = True
            except PlanError:
                self._cache[key] = False
        return self._cache[key]


def _entry_dim(op: OpEstimate, config: PlannerConfig) -> str:
    dims = [d.value for d in op.info.dims]
    for d in config.dims:
        if d in dims:
            return d
    return dims[0]


def _whole(op: OpEstimate, prefer: str | None = None) -> tuple[str, float]:
    proc = prefer or ("gpu" if op.gpu_ms <= op.cpu_ms else "cpu")
    return proc, (op.gpu_ms if proc == "gpu" else op.cpu_ms)


def _parts(s: SplitEstimate) -> dict[str, float]:
    """A split's predicted parts, as :class:`Decision` records them (the image conversions
    where the GPU parts are on images)."""
    parts = {"cpu_part_ms": s.cpu_ms, "gpu_part_ms": s.gpu_ms, "sharing_ms": s.sharing_ms}
    if s.conversion_ms is not None:
        parts["conversion_ms"] = s.conversion_ms
    return parts


def _op_decision(
    op: OpEstimate,
    dim: str,
    ratio: float,
    coexec_ms: float,
    split_ms: float | None,
    gain_ms: float,
    reason: str,
    parts: SplitEstimate | None = None,
) -> Decision:
    """The decision of one operator (not a chain): its whole-processor predictions beside the
    chosen partition's, and the split's predicted parts when ``parts`` is given."""
    return Decision(
        (op.name,),
        dim,
        ratio,
        op.cpu_ms,
        op.gpu_ms,
        coexec_ms,
        split_ms,
        None,
        gain_ms,
        reason,
        **(_parts(parts) if parts is not None else {}),
    )


def _dense_conv(op: OpEstimate) -> bool:
    """A convolution that is neither grouped nor depthwise: the GPU parts that compute on
    images (:class:`~codl_tvm.passes.texture_parts.PackGpuParts`)."""
    return op.params is not None and op.params.op == "conv2d" and op.params.groups == 1


def _fmt_split(s: SplitEstimate) -> str:
    return (
        f"{s.dim}@{s.ratio:g} {s.total_ms:.3f} ms (cpu part {s.cpu_ms:.3f}, gpu part "
        f"{s.gpu_ms:.3f}, sharing {s.sharing_ms:.3f}{of_it_conversions(s.conversion_ms)})"
    )


class SplitPlanner:
    """CoDL's split planner over one module and one (calibrated) cost model.

    Parameters
    ----------
    mod
        The Relax module (its partitionable operators are planned; the IR is never rewritten).
    model
        The cost model the predictions come from.
    config
        Search space and thresholds.
    mode
        The planner mode, named in the report's reasons.

    Attributes
    ----------
    ops
        One :class:`~codl_tvm.planner.split.predict.OpEstimate` per partitionable operator.
    uncovered
        ``(processor, impl the build uses, impl predicted instead) -> operators``.
    chain_notes
        The chains the ``chain_min_gain`` margin turned down.
    uncertainty
        The cost model's stored error, behind the split margin and each decision's provenance.
    """

    def __init__(self, mod, model: CostModel, config: PlannerConfig, mode: str):
        self.mod = mod
        self.config = config
        self.mode = mode
        self.pred = Predictor(model, config)
        self.uncertainty = Uncertainty(model, config)
        # (processor, impl the build uses, impl predicted instead) -> operators
        self.uncovered: dict[tuple[str, str, str], list[str]] = {}
        self.infos = partitionable_ops(mod)
        self.ops = [self._prepare(i) for i in self.infos]
        self.chain_notes: list[str] = []  # chains the chain_min_gain margin turned down
        # OC splits moved to whole image pixels for the GPU (gpu_channels), and those left
        # on the grid's cut because the rounded one was predicted too slow
        self.rounded: dict[str, str] = {}
        self.unrounded: dict[str, str] = {}

    def _prepare(self, info: OpInfo) -> OpEstimate:
        if not info.dims:
            return OpEstimate(info, None, f"not partitionable: {info.reason}")
        try:
            params = op_params(info)
        except FeatureError as exc:
            return OpEstimate(info, None, f"not modelled: {exc}")
        op = OpEstimate(info, params)
        overrides = {(k, p): i for k, p, i in self.config.impls}
        for proc in ("cpu", "gpu"):
            if (params.op, proc) in overrides:
                op.impl[proc] = overrides[(params.op, proc)]
                continue
            covered = covered_impls(self.pred.model, params.op, proc)
            schedule_config = self.config.cpu if proc == "cpu" else self.config.gpu
            impl = expected_impl(params, proc, schedule_config)
            if covered and impl not in covered:
                # The model never saw the kernel the schedules pick: the closest it has.
                closest = "direct" if "direct" in covered else covered[0]
                op.novel.append(f"no {impl} {proc.upper()} data (predicted as {closest})")
                if impl in ("winograd", "packed"):
                    self.uncovered.setdefault((proc, impl, closest), []).append(info.name)
                impl = closest
            op.impl[proc] = impl
        op.novel.extend(self.uncertainty.novelty(op))
        op.cpu_ms = self.pred.whole(op, "cpu")
        op.gpu_ms = self.pred.whole(op, "gpu")
        return op

    # -- single operators ----------------------------------------------------------------------
    def best_split(self, op: OpEstimate, dims: Sequence[str]) -> SplitEstimate | None:
        """The fastest predicted split of ``op`` along ``dims`` over the config's ratios (None
        where no split gives both processors work)."""
        best = None
        allowed = {d.value for d in op.info.dims}
        self.pred.prefetch_splits(
            op, [(d, r) for d in dims if d in allowed for r in self.config.split_ratios]
        )
        for dim in dims:
            if dim not in allowed:
                continue
            for ratio in self.config.split_ratios:
                s = self.pred.split(op, dim, ratio)
                if s is not None and (best is None or s.total_ms < best.total_ms):
                    best = s
        if best is None or best.dim != "OC" or not _dense_conv(op):
            return best

        def cut_of(r: float) -> int:
            return part_shape(op.params, Partition("OC", r), "gpu").oc

        return self._rounded(
            op.name,
            best,
            op.params.oc,
            cut_of,
            lambda ratios: [self.pred.split(op, "OC", r) for r in ratios],
            self.config.split_ratios,
        )

    def _rounded(self, name, best, extent, cut_of, predict, grid) -> SplitEstimate:
        """``best`` (an OC split of ``extent`` channels), or the best split at the shares
        ``grid`` rounded to whole image pixels (``config.gpu_channels`` channels,
        :func:`~codl_tvm.planner.split.pixels.rounded_ratio`; ``cut_of``: share -> the GPU's
        channels) where that is predicted within ``config.gpu_channels_slack`` of it;
        ``predict(ratios)`` gives the splits of ``ratios``. Recorded in :attr:`rounded` /
        :attr:`unrounded` under ``name``."""
        multiple = self.config.gpu_channels
        if multiple <= 1 or cut_of(best.ratio) % multiple == 0:
            return best
        ratios = sorted(
            {r for g in grid if (r := rounded_ratio(g, extent, cut_of, multiple)) is not None}
        )
        rounded = min(
            (s for s in predict(ratios) if s is not None),
            key=lambda s: s.total_ms,
            default=None,
        )
        was = f"{name} OC@{best.ratio:g} ({cut_of(best.ratio)} of {extent} GPU channels)"
        self.rounded.pop(name, None)
        self.unrounded.pop(name, None)
        if rounded is None:
            self.unrounded[name] = f"{was}: no cut of whole pixels gives both processors work"
            return best
        if rounded.total_ms > best.total_ms * (1.0 + self.config.gpu_channels_slack):
            self.unrounded[name] = (
                f"{was}: whole pixels predicted {rounded.total_ms:.3f} ms against "
                f"{best.total_ms:.3f} ms"
            )
            return best
        self.rounded[name] = f"{was} -> OC@{rounded.ratio:g} ({cut_of(rounded.ratio)})"
        return rounded

    def pixel_notes(self, plan: PartitionPlan) -> list[str]:
        """The report's notes on the OC splits of ``plan`` rounded to whole image pixels for
        the GPU (``config.gpu_channels``), and on those left on the grid's cut."""
        oc = PartitionDim.OC
        names = {o.op for o in plan.ops if o.dim == oc and 0.0 < o.ratio < 1.0}
        names |= {f"chain {c.ops[0]}..{c.ops[-1]}" for c in plan.chains if c.dim == oc}
        notes = []
        for found, words in ((self.rounded, "rounded to"), (self.unrounded, "not rounded to")):
            texts = [t for n, t in found.items() if n in names]
            if texts:
                notes.append(
                    f"{len(texts)} OC split(s) {words} whole image pixels for the GPU "
                    f"(multiples of {self.config.gpu_channels} channels): " + "; ".join(texts)
                )
        return notes

    def switch_ms(self, op: OpEstimate, dim: str, to: str = "cpu") -> float:
        """Sharing costs of moving a whole operator's input and output between processors
        (``to`` the GPU: with the image conversions of its input and output where the GPU
        parts are on images, :meth:`~codl_tvm.planner.split.predict.Predictor.\
whole_conversion_ms`)."""
        nbytes = shared_nbytes(op.params, Partition(dim, 0.0), self.config.dtype_bytes)
        conversion = self.pred.whole_conversion_ms(op) if to == "gpu" else None
        return self.pred.sharing_ms(nbytes) + (conversion or 0.0)

    def decide(
        self, op: OpEstimate, home: str | None = None
    ) -> tuple[Decision, SplitEstimate | None]:
        """``op``'s decision (whole on the faster processor, or its best split where that
        gains more than ``min_gain_ms``) and its best split; with ``home``, a whole operator
        placed away from it pays the switch's sharing costs (``config.switch_costs``)."""
        dim0 = _entry_dim(op, self.config)
        proc, whole_ms = _whole(op)
        switch = ""
        if home is not None and self.config.switch_costs:
            away = "cpu" if home == "gpu" else "gpu"
            moved = self.switch_ms(op, dim0, away)
            cost = {home: _whole(op, home)[1], away: _whole(op, away)[1] + moved}
            proc = min(cost, key=cost.get)
            whole_ms = cost[proc]
            converts = self.pred.whole_conversion_ms(op) if away == "gpu" else None
            if proc == away:
                switch = (
                    f", {moved:.3f} ms of it moving data from/to the {home.upper()}"
                    f"{of_it_conversions(converts)}"
                )
            elif _whole(op)[0] == away:
                switch = (
                    f"; the {away.upper()} alone is faster but not by the "
                    f"{moved:.3f} ms of moving data from/to the {home.upper()}"
                    f"{of_it_conversions(converts)}"
                )
        split = self.best_split(op, self.config.dims)
        ratio = 1.0 if proc == "gpu" else 0.0
        gains = split is not None and split.total_ms < whole_ms - self.config.min_gain_ms
        margin = self.uncertainty.margin(op, proc, whole_ms, split) if gains else None
        gain = 0.0 if split is None else whole_ms - split.total_ms
        margin_ms = None if margin is None else margin.margin_ms
        if gains and (margin is None or gain > margin.margin_ms):
            cleared = "" if margin is None else f", clearing the {margin.describe()}"
            reason = (
                f"split {_fmt_split(split)} beats whole on {proc.upper()} "
                f"({whole_ms:.3f} ms{switch}) by {gain:.3f} ms{cleared}"
            )
            d = _op_decision(
                op, split.dim, split.ratio, split.total_ms, split.total_ms, gain, reason, split
            )
        else:
            if split is None:
                why = f"no split along {list(self.config.dims)} gives both processors work"
            elif margin is not None and gains:
                why = (
                    f"best split {_fmt_split(split)}: predicted gain {gain:.3f} ms < "
                    f"{margin.describe()}"
                )
                self.uncertainty.held_whole.append((op.name, gain, margin.margin_ms))
            else:
                why = f"best split {_fmt_split(split)} does not gain"
            reason = f"whole on {proc.upper()} ({whole_ms:.3f} ms{switch}): {why}"
            split_ms = None if split is None else split.total_ms
            d = _op_decision(op, dim0, ratio, whole_ms, split_ms, 0.0, reason)
        d = replace(d, margin_ms=margin_ms)
        return d, split

    # -- chains --------------------------------------------------------------------------------
    def chains(
        self, ops: list[OpEstimate], singles: dict[str, tuple[Decision, SplitEstimate | None]]
    ) -> list[tuple[list[OpEstimate], SplitEstimate, float]]:
        """CoDL Algorithm 1 over ``ops`` in order, seeded by each head's decision in
        ``singles``: the chains kept, each with its predicted latency and gain."""
        chainable = _Chainable(self.mod)
        cfg = self.config
        found = []
        i = 0
        while i < len(ops):
            head = ops[i]
            head_dec, head_split = singles[head.name]
            seed = (
                (head_dec.dim, head_dec.ratio)
                if head_dec.split_ms is not None and head_dec.gain_ms > 0
                else (None if head_split is None else (head_split.dim, head_split.ratio))
            )
            if seed is None:
                i += 1
                continue
            dim, rho0 = seed
            rhos = [r for r in cfg.split_ratios if abs(r - rho0) <= cfg.chain_delta + 1e-9]
            best = None  # (end index, split, gain)
            for j in range(i + 1, min(len(ops), i + cfg.max_chain_len)):
                cand = ops[i : j + 1]
                if ops[j].info.index != ops[j - 1].info.index + 1:
                    break  # an unmodelled operator sits in between
                if not all(PartitionDim(dim) in o.info.dims for o in cand):
                    break
                if not chainable(tuple(o.name for o in cand), dim):
                    break
                nochain = sum(singles[o.name][0].coexec_ms for o in cand)
                top = None
                for r in rhos:
                    s = self.pred.chain(cand, dim, r)
                    if s is not None and (top is None or s.total_ms < top.total_ms):
                        top = s
                if top is None:
                    break
                if dim == "OC" and cfg.gpu_channels > 1 and any(_dense_conv(o) for o in cand):
                    top = self._rounded_chain(cand, top, rhos)
                gain = nochain - top.total_ms
                if best is not None and gain <= best[2]:
                    break  # Algorithm 1: stop growing when the gain stops improving
                best = (j, top, gain, nochain)
            margin = (
                None
                if best is None
                else self.uncertainty.chain_margin(ops[i : best[0] + 1], best[3])
            )
            if best is None or best[2] <= cfg.min_gain_ms:
                i += 1
            elif margin is not None and best[2] <= margin.margin_ms:
                self.chain_notes.append(
                    f"chain {ops[i].name}..{ops[best[0]].name} ({best[0] - i + 1} ops, "
                    f"{best[1].dim}@{best[1].ratio:g}) predicted to gain {best[2]:.3f} ms < "
                    f"{margin.describe()}: planned one by one"
                )
                i += 1
            elif best[2] <= cfg.chain_min_gain * best[3]:
                self.chain_notes.append(
                    f"chain {ops[i].name}..{ops[best[0]].name} ({best[0] - i + 1} ops, "
                    f"{best[1].dim}@{best[1].ratio:g}) predicted to gain {best[2]:.3f} ms "
                    f"({best[2] / best[3]:.1%}), not more than chain_min_gain "
                    f"{cfg.chain_min_gain:.0%} of {best[3]:.3f} ms: planned one by one"
                )
                i += 1
            else:
                found.append((ops[i : best[0] + 1], best[1], best[2]))
                i = best[0] + 1
        return found

    def _rounded_chain(
        self, cand: list[OpEstimate], top: SplitEstimate, rhos: Sequence[float]
    ) -> SplitEstimate:
        """An OC chain's best split ``top`` over the shares ``rhos``, rounded to whole image
        pixels as :meth:`_rounded` rounds an operator's."""
        infos, params = [o.info for o in cand], [o.params for o in cand]

        def cut_of(r: float) -> int:
            return chain_parts(infos, params, PartitionDim.OC, r).cut

        extent = chain_parts(infos, params, PartitionDim.OC, top.ratio).extent
        name = f"chain {cand[0].name}..{cand[-1].name}"
        return self._rounded(
            name,
            top,
            extent,
            cut_of,
            lambda ratios: [self.pred.chain(cand, "OC", r) for r in ratios],
            rhos,
        )

    # -- the plan ------------------------------------------------------------------------------
    def run(
        self, forced: str | None = None, chooser: SplitPlanner | None = None
    ) -> tuple[PartitionPlan, list[Decision]]:
        """The plan and one decision per operator or chain.

        Parameters
        ----------
        forced
            ``"cpu"`` or ``"gpu"``: every operator whole there (the single-processor baselines).
        chooser
            Another planner whose splits (OC only) this one predicts (the uLayer-like
            baseline: the chooser holds the FLOPs model).
        """
        modelled = [o for o in self.ops if o.params is not None]
        # Kernels outside the plan whose inputs do not decide run on the processor predicted
        # faster for the whole model (CoDL's GPU when it is the faster one).
        home = forced or (
            "cpu" if sum(o.cpu_ms for o in modelled) < sum(o.gpu_ms for o in modelled) else "gpu"
        )
        singles: dict[str, tuple[Decision, SplitEstimate | None]] = {}
        for op in modelled:
            if forced in ("cpu", "gpu"):
                ms = op.gpu_ms if forced == "gpu" else op.cpu_ms
                d = _op_decision(
                    op,
                    _entry_dim(op, self.config),
                    1.0 if forced == "gpu" else 0.0,
                    ms,
                    None,
                    0.0,
                    f"baseline {self.mode}: whole on {forced.upper()} ({ms:.3f} ms)",
                )
                singles[op.name] = (d, None)
            elif chooser is not None:
                singles[op.name] = (self._decide_by(op, chooser), None)
            else:
                singles[op.name] = self.decide(op, home)
        chains = self.chains(modelled, singles) if self.config.chains and not forced else []
        in_chain = {o.name: (ops, s, g) for ops, s, g in chains for o in ops}
        rows: list[Decision] = []
        plan_ops: list[OpPartition] = []
        plan_chains: list[ChainPlan] = []
        for op in self.ops:
            if op.params is None:
                rows.append(
                    Decision(
                        (op.name,),
                        None,
                        None,
                        None,
                        None,
                        None,
                        reason=op.problem + "; left out of the plan, runs unsplit",
                        provenance="unmodelled",
                    )
                )
                continue
            if op.name in in_chain:
                ops, s, gain = in_chain[op.name]
                if ops[0].name != op.name:
                    continue
                names = tuple(o.name for o in ops)
                nochain = sum(singles[n][0].coexec_ms for n in names)
                reason = (
                    f"chain {s.dim}@{s.ratio:g}: {s.total_ms:.3f} ms (cpu parts {s.cpu_ms:.3f}, "
                    f"gpu parts {s.gpu_ms:.3f}, sharing at entry/exit {s.sharing_ms:.3f}"
                    f"{of_it_conversions(s.conversion_ms)}) vs "
                    f"{nochain:.3f} ms planned one by one: gains {gain:.3f} ms"
                )
                rows.append(
                    Decision(
                        names,
                        s.dim,
                        s.ratio,
                        sum(o.cpu_ms for o in ops),
                        sum(o.gpu_ms for o in ops),
                        s.total_ms,
                        None,
                        nochain,
                        gain,
                        reason,
                        **_parts(s),
                        **self.uncertainty.provenance(list(ops), s.dim, s.ratio),
                    )
                )
                plan_chains.append(ChainPlan(names, s.dim, s.ratio))
                continue
            d = singles[op.name][0]
            d = replace(d, **self.uncertainty.provenance([op], d.dim, d.ratio))
            rows.append(d)
            plan_ops.append(OpPartition(op.name, d.dim, d.ratio))
        # Blocks outside the cost model (InstanceNorm split on channels) take the share that
        # balances the two processors over the whole model, not their conv's split ratio.
        cpu = sum(o.cpu_ms for o in modelled)
        gpu = sum(o.gpu_ms for o in modelled)
        plan = PartitionPlan(
            tuple(plan_ops),
            tuple(plan_chains),
            model_fingerprint(self.mod, self.infos),
            home=home,
            block_ratio=round(cpu / (cpu + gpu), 2) if cpu + gpu > 0 else None,
        )
        return plan, rows

    def _decide_by(self, op: OpEstimate, chooser: SplitPlanner) -> Decision:
        """uLayer-like: the chooser's (FLOPs) model picks an OC split; this model predicts it."""
        ch = next(o for o in chooser.ops if o.name == op.name)
        split = chooser.best_split(ch, ("OC",))
        if split is None:
            proc, _ = _whole(ch)
            _, ms = _whole(op, proc)
            return _op_decision(
                op,
                _entry_dim(op, self.config),
                1.0 if proc == "gpu" else 0.0,
                ms,
                None,
                0.0,
                f"uLayer-like: no OC split possible; whole on {proc.upper()} by the FLOPs model",
            )
        mine = self.pred.split(op, split.dim, split.ratio)
        return _op_decision(
            op,
            split.dim,
            split.ratio,
            mine.total_ms,
            mine.total_ms,
            min(op.cpu_ms, op.gpu_ms) - mine.total_ms,
            f"uLayer-like: OC@{split.ratio:g} chosen by the FLOPs model "
            f"({split.total_ms:.3f} ms there); this cost model predicts {_fmt_split(mine)}",
            mine,
        )
