"""CoDL's partition planner (sections 4.1 and 4.2) and the baseline planners.

The planner reads the partitionable operators of a Relax module and a cost model; it never
rewrites the IR. It returns a :class:`~codl_tvm.core.plan.PartitionPlan` and a
:class:`~codl_tvm.planner.report.PlanReport`.

1. **Per operator** (hybrid-dimension partitioning, CoDL 4.1): every dimension the operator can
   be split along (H, OC) and every GPU share ``rho`` of the grid strictly between 0 and 1 is
   predicted with :meth:`CostModel.predict_coexec` (``chained=False``: Eq. 2 with the data-sharing
   costs of the operator's input and output). The best split is kept when it beats running the
   operator whole on the faster processor by more than ``min_gain_ms``; otherwise the operator
   runs whole there (ratio 0: CPU, 1: GPU). A grid point whose cut gives one processor nothing
   is not a split and is skipped.
2. **Chains** (CoDL Algorithm 1): walking the operators in order, a chain starts at a head with
   the head's split (dim, rho) and grows one operator at a time while the operators are
   consecutive in the data flow and each one's output feeds only the next (the rule
   ``codl.PartitionOperators`` enforces, checked with its own analysis). For each length the best
   ``rho`` within ``chain_delta`` of the head's is searched; each operator's parts are predicted
   with the shapes the halo geometry gives (input rows grow backwards through the chain), data is
   shared only at the chain's entry and exit, and each processor runs its parts back to back, so
   the chain takes ``sharing + max(sum of CPU parts, sum of GPU parts)``. The gain is against the
   same operators planned one by one; the chain grows while its gain improves and is kept when the
   gain exceeds ``min_gain_ms`` and ``chain_min_gain`` of the one-by-one latency (a margin for
   the cost model's error; the report's notes name every chain it turned down).

Predicted totals cover the partitionable operators only (the other operators, e.g. elementwise
ones, are the same in every plan). Switching a whole operator between processors costs nothing
in Eq. 2 and so costs nothing here either.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from codl_tvm.core.errors import PlannerError
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
from codl_tvm.cost_model.features import (
    FeatureError,
    OpParams,
    Partition,
    PartShape,
    op_features,
    part_shape,
)
from codl_tvm.planner.report import Decision, PlanReport, PlanSummary
from codl_tvm.planner.split.part_shapes import chain_parts, op_params

__all__ = [
    "DEFAULT_RATIOS",
    "MODES",
    "PlannerConfig",
    "PlannerError",
    "ideal_latency",
    "plan_all",
    "plan_model",
]

DEFAULT_RATIOS: tuple[float, ...] = tuple(i / 10 for i in range(11))
MODES: tuple[str, ...] = (
    "codl",
    "codl_no_chain",
    "h_only",
    "oc_only",
    "ulayer_like",
    "cpu_only",
    "gpu_only",
)
_SHARING_KINDS = ("transform", "map", "presync")
_NO_SHARING = "has no data-sharing measurements"


@dataclass(frozen=True)
class PlannerConfig:
    """Search space and thresholds of the planner.

    Parameters
    ----------
    ratios
        GPU shares tried (0 and 1, if present, are ignored for splits: they are the whole-op
        options, which are always considered).
    dims
        Partition dimensions tried (``"H"``, ``"OC"``).
    chains
        Search operator chains (CoDL Algorithm 1).
    chain_delta
        A chain's ``rho`` is searched within this distance of its head's ``rho`` (CoDL: 0.3).
    max_chain_len
        Longest chain tried.
    min_gain_ms
        A split (chain) must beat the best single processor (no-chain) by more than this.
    impls
        ``(op kind, processor, impl)`` triples naming the implementation the cost model should
        predict (op kinds of the cost model: ``conv2d``, ``dense``, ``pool``). Unlisted: the
        fastest predicted implementation the model covers for the operator, or ``direct``.
    dtype_bytes
        Bytes per element for the sharing costs.
    chain_min_gain
        A chain is kept only when its predicted gain exceeds this fraction of its operators'
        predicted latency planned one by one (besides ``min_gain_ms``). Predicted chain gains
        are small (0.6-12% per chain, 0.2-3.8% per model on the benchmark models) against the
        cost model's ~20% per-part error, and on the emulated SoC the unchained plan ran faster
        than the chained one on 4 of 5 models in one run and 5 of 5 in the next (0.87-0.92x).
        As the 1.08x fallback margin does for co-execution itself, the margin keeps only chains
        predicted to gain clearly; 0 is Algorithm 1 as published.
    switch_costs
        A whole operator placed away from the plan's home processor (the one predicted faster
        for the whole model, where the data of the kernels outside the plan lives) pays the
        sharing costs of its input and output, as a split's part would. Without them the
        planner scatters single operators to the other processor for gains smaller than the
        switch (Inception v1 on the H100: a quarter of its convs whole on the CPU, 3x slower
        than the GPU alone).
    processor_scale
        ``(cpu, gpu)`` factors on every predicted compute latency of that processor
        (:meth:`~codl_tvm.cost_model.CostModel.scaled`): a calibration to a whole model's
        measured single-processor latencies, which differ from the sum of its operators measured
        one by one (caches, the kernels outside the plan). ``compile --verify`` re-plans with
        ``measured / predicted`` of each processor alone. (1, 1): the cost model as fitted.
    weight_gbps
        ``(cpu, gpu)`` weight-streaming rates inside a model, GB/s
        (:meth:`~codl_tvm.cost_model.CostModel.streaming`): every part, and every operator
        run whole, is predicted no faster than its weights' bytes over its processor's rate.
        Measured from timelines (``scripts/plan_vs_timeline.py``); at k = 12 batch-1 dense
        parts ran a median 2.9x (CPU) and 1.6x (GPU) slower inside the models than profiled
        alone. None: off.
    cpu, gpu
        The schedule configs of the build (:class:`~codl_tvm.schedules.CPUConfig`,
        :class:`~codl_tvm.schedules.OpenCLConfig`, as :func:`~codl_tvm.schedules.cpu_config`
        returns them for the targets): the planner predicts the implementation they select
        (:func:`expected_impl`: Winograd, packed convs) where the cost model has data for it,
        and names in the report's notes the operators it could not. None: the direct and GEMM
        kernels of the presets.
    """

    ratios: tuple[float, ...] = DEFAULT_RATIOS
    dims: tuple[str, ...] = ("H", "OC")
    chains: bool = True
    chain_delta: float = 0.3
    max_chain_len: int = 8
    min_gain_ms: float = 0.0
    chain_min_gain: float = 0.10
    impls: tuple[tuple[str, str, str], ...] = ()
    dtype_bytes: int = 4
    switch_costs: bool = True
    processor_scale: tuple[float, float] = (1.0, 1.0)
    weight_gbps: tuple[float, float] | None = None
    cpu: Any = None
    gpu: Any = None

    def __post_init__(self) -> None:
        ratios = tuple(sorted({float(r) for r in self.ratios}))
        if not ratios or any(math.isnan(r) or not 0.0 <= r <= 1.0 for r in ratios):
            raise PlannerError(f"planner: ratios must be numbers in [0, 1], got {self.ratios!r}")
        object.__setattr__(self, "ratios", ratios)
        dims = tuple(PartitionDim.parse(d, "planner config").value for d in self.dims)
        object.__setattr__(self, "dims", dims)
        if not 0.0 <= self.chain_delta <= 1.0:
            raise PlannerError(f"planner: chain_delta must be in [0, 1], got {self.chain_delta!r}")
        if self.max_chain_len < 1:
            raise PlannerError(f"planner: max_chain_len must be >= 1, got {self.max_chain_len!r}")
        if self.min_gain_ms < 0:
            raise PlannerError(f"planner: min_gain_ms must be >= 0, got {self.min_gain_ms!r}")
        if not 0.0 <= self.chain_min_gain < 1.0:
            raise PlannerError(
                f"planner: chain_min_gain must be in [0, 1), got {self.chain_min_gain!r}"
            )
        if self.weight_gbps is not None:
            w = self.weight_gbps
            rates = tuple(w) if isinstance(w, (tuple, list)) else ()
            if len(rates) != 2 or not all(
                isinstance(r, (int, float)) and 0 < r < math.inf for r in rates
            ):
                raise PlannerError(
                    f"planner: weight_gbps must be two positive rates in GB/s (cpu, gpu), got {w!r}"
                )
            object.__setattr__(self, "weight_gbps", (float(rates[0]), float(rates[1])))
        for triple in self.impls:
            if len(triple) != 3 or triple[1] not in ("cpu", "gpu"):
                raise PlannerError(
                    f"planner: impls entries are (op kind, 'cpu'|'gpu', impl), got {triple!r}"
                )

    @property
    def split_ratios(self) -> tuple[float, ...]:
        return tuple(r for r in self.ratios if 0.0 < r < 1.0)


def ideal_latency(cpu_ms: float, gpu_ms: float) -> float:
    """CoDL's ideal co-execution bound ``T* = 1 / (1/Tcpu + 1/Tgpu)``."""
    if cpu_ms <= 0 or gpu_ms <= 0:
        return min(cpu_ms, gpu_ms)
    return 1.0 / (1.0 / cpu_ms + 1.0 / gpu_ms)


# ---------------------------------------------------------------------------------------------
# Predictions.


@dataclass
class _Op:
    info: OpInfo
    params: OpParams | None
    problem: str = ""
    impl: dict[str, str] = field(default_factory=dict)
    cpu_ms: float = 0.0
    gpu_ms: float = 0.0

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class _Split:
    dim: str
    ratio: float
    total_ms: float
    cpu_ms: float
    gpu_ms: float
    sharing_ms: float


def _covered_impls(model: CostModel, op: str, proc: str) -> list[str]:
    keys = getattr(model, "groups", None) or getattr(model, "boosters", None) or {}
    return sorted({k[2] for k in keys if isinstance(k, tuple) and k[:2] == (op, proc)})


def expected_impl(params: OpParams, processor: str, config=None) -> str:
    """The implementation codl-tvm's schedule rules give an operator on a processor.

    The same choice the built kernels record (``codl_tvm.cost_model.dispatch``): a conv that
    :func:`codl_tvm.schedules.winograd_reason` accepts under the processor's ``config`` (a
    :class:`~codl_tvm.schedules.CPUConfig` or ``OpenCLConfig``; None: no Winograd) is
    ``winograd`` (the build rewrites it when its weight is a constant, as in imported models);
    a CPU conv that :func:`codl_tvm.schedules.packed_reason` accepts is ``packed`` (on in no
    preset by default; the shipped cost models have no such group);
    otherwise on the CPU a depthwise conv gets the depthwise rule, a 1x1 stride-1 conv the GEMM
    rule, others the direct rule; OpenCL convs are direct; dense is a matmul, or a reduction
    (GEMV) on the GPU below ``dense_gemm_min_m`` rows (the cost-model groups of the OpenCL dense
    rule's ``gemm`` / ``gemv``); pooling is pooling. The planner predicts that kernel, never a
    faster-looking one the build would not produce. The choice is made for the whole operator;
    a co-execution part whose own shape falls below the config's thresholds (e.g. an OC part
    with fewer than ``winograd_min_channels`` channels) is built with the direct rule.
    """
    if params.op == "pool":
        return "pool"
    if params.op == "dense":
        # OpenCLDense records gemv / gemm; the cost model groups them as reduction / matmul
        # (codl_tvm.cost_model.features.IMPL_GROUPS)
        from codl_tvm.schedules.config import OPENCL_GENERIC

        min_m = 2  # dlight: GEMV / Reduction for one row
        if getattr(config, "dense", False):
            min_m = getattr(config, "dense_gemm_min_m", None) or OPENCL_GENERIC.dense_gemm_min_m
        return "reduction" if processor == "gpu" and params.h < min_m else "matmul"
    if config is not None and params.op == "conv2d":
        # deferred: the schedules need TVM's compiler; the planner (through artifacts) is
        # imported where TVM is runtime-only
        from codl_tvm.schedules.packed import packed_reason
        from codl_tvm.schedules.winograd import conv2d_shape_info, winograd_reason

        try:
            info = conv2d_shape_info(
                (1, params.ic, params.h, params.w),
                (params.oc, params.ic // max(1, params.groups), params.kernel, params.kernel),
                (params.stride, params.stride),
                params.padding,
                (params.dilation, params.dilation),
                params.groups,
            )
        except ValueError:
            info = None
        if info is not None and winograd_reason(info, config) is None:
            return "winograd"
        if info is not None and processor == "cpu" and packed_reason(info, config) is None:
            return "packed"
    if processor == "gpu":
        return "direct"
    if params.groups > 1 and params.groups == params.ic == params.oc:
        return "depthwise"
    if params.kernel == 1 and params.stride == 1 and params.groups == 1:
        return "gemm"
    return "direct"


class _Predictor:
    """Cached predictions of one cost model for the operators of one module."""

    def __init__(self, model: CostModel, config: PlannerConfig):
        self.model = model
        self.config = config
        self._parts: dict[tuple, float] = {}
        self._splits: dict[tuple, _Split | None] = {}
        self._chains: dict[tuple, _Split | None] = {}

    def part_ms(self, op: _Op, proc: str, partition: Partition, shape: PartShape) -> float:
        if shape.empty:
            return 0.0
        key = (op.name, proc, op.impl[proc], partition, shape)
        hit = self._parts.get(key)
        if hit is None:
            feats = op_features(op.params, proc, op.impl[proc], partition, part=shape, name=op.name)
            hit = self._parts[key] = self.model.predict(feats)
        return hit

    def whole(self, op: _Op, proc: str) -> float:
        part = Partition("none", 1.0 if proc == "gpu" else 0.0)
        return self.part_ms(op, proc, part, part_shape(op.params, part, proc))

    def sharing_ms(self, nbytes: int) -> float:
        return sum(self.model.predict_sharing(k, nbytes) for k in _SHARING_KINDS)

    def split(self, op: _Op, dim: str, ratio: float) -> _Split | None:
        """Eq. 2 of one operator split alone (None when one processor gets nothing)."""
        key = (op.name, dim, ratio)
        if key not in self._splits:
            self.prefetch_splits(op, [(dim, ratio)])
        return self._splits[key]

    def prefetch_splits(self, op: _Op, candidates: Sequence[tuple[str, float]]) -> None:
        """Predict every ``(dim, ratio)`` split of ``op`` not cached yet, in one model call."""
        todo = []
        for dim, ratio in candidates:
            if (op.name, dim, ratio) in self._splits:
                continue
            partition = Partition(dim, ratio)
            if any(part_shape(op.params, partition, p).empty for p in ("cpu", "gpu")):
                self._splits[(op.name, dim, ratio)] = None
            else:
                todo.append(partition)
        if not todo:
            return
        lats = self.model.predict_coexec_many(
            op.params,
            todo,
            op.impl,
            chained=False,
            name=op.name,
            dtype_bytes=self.config.dtype_bytes,
        )
        for partition, lat in zip(todo, lats, strict=True):
            share = lat.transform_ms + lat.map_ms + lat.presync_ms
            self._splits[(op.name, partition.dim, partition.ratio)] = _Split(
                partition.dim, partition.ratio, lat.total_ms, lat.cpu_ms, lat.gpu_ms, share
            )

    def prefetch_parts(self, requests: Sequence[tuple[_Op, str, Partition, PartShape]]) -> None:
        """Predict the ``(op, processor, partition, part shape)`` parts not cached yet, in one
        model call (a chain candidate's parts on both processors)."""
        keys, feats = [], []
        for op, proc, partition, shape in requests:
            key = (op.name, proc, op.impl[proc], partition, shape)
            if shape.empty or key in self._parts or key in keys:
                continue
            keys.append(key)
            feats.append(
                op_features(op.params, proc, op.impl[proc], partition, part=shape, name=op.name)
            )
        if feats:
            for key, ms in zip(keys, self.model.predict_many(feats), strict=True):
                self._parts[key] = float(ms)

    def chain(self, ops: Sequence[_Op], dim: str, ratio: float) -> _Split | None:
        """A chain's latency (None when a cut is empty or reads only padding)."""
        key = (tuple(o.name for o in ops), dim, ratio)
        if key in self._chains:
            return self._chains[key]
        result = None
        try:
            parts = chain_parts(
                [o.info for o in ops], [o.params for o in ops], PartitionDim(dim), ratio
            )
        except ValueError:
            parts = None
        if parts is not None and parts.gpu is not None and parts.cpu is not None:
            partition = Partition(dim, ratio)
            self.prefetch_parts(
                [
                    (o, proc, partition, shape)
                    for proc, shapes in (("cpu", parts.cpu), ("gpu", parts.gpu))
                    for o, shape in zip(ops, shapes, strict=True)
                ]
            )
            sums = {}
            for proc, shapes in (("cpu", parts.cpu), ("gpu", parts.gpu)):
                sums[proc] = sum(
                    self.part_ms(o, proc, partition, s) for o, s in zip(ops, shapes, strict=True)
                )
            first, last = parts.cpu[0], parts.cpu[-1]
            nbytes = self.config.dtype_bytes * (
                first.in_h * first.in_w * first.ic + last.out_h * last.out_w * last.oc
            )
            share = self.sharing_ms(nbytes)
            total = share + max(sums["cpu"], sums["gpu"])
            result = _Split(dim, ratio, total, sums["cpu"], sums["gpu"], share)
        self._chains[key] = result
        return result


# ---------------------------------------------------------------------------------------------
# The planner.


class _Chainable:
    """Whether operators can form a chain, by the partitioning pass's own analysis."""

    def __init__(self, mod):
        from codl_tvm.passes.partition import _Analysis  # deferred: needs TVM's compiler

        self._analysis = _Analysis(mod)
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


def _entry_dim(op: _Op, config: PlannerConfig) -> str:
    dims = [d.value for d in op.info.dims]
    for d in config.dims:
        if d in dims:
            return d
    return dims[0]


def _whole(op: _Op, prefer: str | None = None) -> tuple[str, float]:
    proc = prefer or ("gpu" if op.gpu_ms <= op.cpu_ms else "cpu")
    return proc, (op.gpu_ms if proc == "gpu" else op.cpu_ms)


def _parts(s: _Split) -> dict[str, float]:
    """A split's predicted parts, as :class:`Decision` records them."""
    return {"cpu_part_ms": s.cpu_ms, "gpu_part_ms": s.gpu_ms, "sharing_ms": s.sharing_ms}


def _op_decision(
    op: _Op,
    dim: str,
    ratio: float,
    coexec_ms: float,
    split_ms: float | None,
    gain_ms: float,
    reason: str,
    parts: _Split | None = None,
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


def _fmt_split(s: _Split) -> str:
    return (
        f"{s.dim}@{s.ratio:g} {s.total_ms:.3f} ms (cpu part {s.cpu_ms:.3f}, gpu part "
        f"{s.gpu_ms:.3f}, sharing {s.sharing_ms:.3f})"
    )


class _Planner:
    def __init__(self, mod, model: CostModel, config: PlannerConfig, mode: str):
        self.mod = mod
        self.config = config
        self.mode = mode
        self.pred = _Predictor(model, config)
        # (processor, impl the build uses, impl predicted instead) -> operators
        self.uncovered: dict[tuple[str, str, str], list[str]] = {}
        self.infos = partitionable_ops(mod)
        self.ops = [self._prepare(i) for i in self.infos]
        self.chain_notes: list[str] = []  # chains the chain_min_gain margin turned down

    def _prepare(self, info: OpInfo) -> _Op:
        if not info.dims:
            return _Op(info, None, f"not partitionable: {info.reason}")
        try:
            params = op_params(info)
        except FeatureError as exc:
            return _Op(info, None, f"not modelled: {exc}")
        op = _Op(info, params)
        overrides = {(k, p): i for k, p, i in self.config.impls}
        for proc in ("cpu", "gpu"):
            if (params.op, proc) in overrides:
                op.impl[proc] = overrides[(params.op, proc)]
                continue
            covered = _covered_impls(self.pred.model, params.op, proc)
            schedule_config = self.config.cpu if proc == "cpu" else self.config.gpu
            impl = expected_impl(params, proc, schedule_config)
            if covered and impl not in covered:
                # The model never saw the kernel the schedules pick: the closest it has.
                closest = "direct" if "direct" in covered else covered[0]
                if impl in ("winograd", "packed"):
                    self.uncovered.setdefault((proc, impl, closest), []).append(info.name)
                impl = closest
            op.impl[proc] = impl
        op.cpu_ms = self.pred.whole(op, "cpu")
        op.gpu_ms = self.pred.whole(op, "gpu")
        return op

    # -- single operators ----------------------------------------------------------------------
    def best_split(self, op: _Op, dims: Sequence[str]) -> _Split | None:
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
        return best

    def switch_ms(self, op: _Op, dim: str) -> float:
        """Sharing costs of moving a whole operator's input and output between processors."""
        nbytes = shared_nbytes(op.params, Partition(dim, 0.0), self.config.dtype_bytes)
        return self.pred.sharing_ms(nbytes)

    def decide(self, op: _Op, home: str | None = None) -> tuple[Decision, _Split | None]:
        dim0 = _entry_dim(op, self.config)
        proc, whole_ms = _whole(op)
        switch = ""
        if home is not None and self.config.switch_costs:
            away = "cpu" if home == "gpu" else "gpu"
            moved = self.switch_ms(op, dim0)
            cost = {home: _whole(op, home)[1], away: _whole(op, away)[1] + moved}
            proc = min(cost, key=cost.get)
            whole_ms = cost[proc]
            if proc == away:
                switch = f", {moved:.3f} ms of it moving data from/to the {home.upper()}"
            elif _whole(op)[0] == away:
                switch = (
                    f"; the {away.upper()} alone is faster but not by the "
                    f"{moved:.3f} ms of moving data from/to the {home.upper()}"
                )
        split = self.best_split(op, self.config.dims)
        ratio = 1.0 if proc == "gpu" else 0.0
        if split is not None and split.total_ms < whole_ms - self.config.min_gain_ms:
            gain = whole_ms - split.total_ms
            reason = (
                f"split {_fmt_split(split)} beats whole on {proc.upper()} "
                f"({whole_ms:.3f} ms{switch}) by {gain:.3f} ms"
            )
            d = _op_decision(
                op, split.dim, split.ratio, split.total_ms, split.total_ms, gain, reason, split
            )
        else:
            if split is None:
                why = f"no split along {list(self.config.dims)} gives both processors work"
            else:
                why = f"best split {_fmt_split(split)} does not gain"
            reason = f"whole on {proc.upper()} ({whole_ms:.3f} ms{switch}): {why}"
            split_ms = None if split is None else split.total_ms
            d = _op_decision(op, dim0, ratio, whole_ms, split_ms, 0.0, reason)
        return d, split

    # -- chains --------------------------------------------------------------------------------
    def chains(
        self, ops: list[_Op], singles: dict[str, tuple[Decision, _Split | None]]
    ) -> list[tuple[list[_Op], _Split, float]]:
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
                gain = nochain - top.total_ms
                if best is not None and gain <= best[2]:
                    break  # Algorithm 1: stop growing when the gain stops improving
                best = (j, top, gain, nochain)
            if best is None or best[2] <= cfg.min_gain_ms:
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

    # -- the plan ------------------------------------------------------------------------------
    def run(self, forced: str | None = None, chooser: _Planner | None = None):
        modelled = [o for o in self.ops if o.params is not None]
        # Kernels outside the plan whose inputs do not decide run on the processor predicted
        # faster for the whole model (CoDL's GPU when it is the faster one).
        home = forced or (
            "cpu" if sum(o.cpu_ms for o in modelled) < sum(o.gpu_ms for o in modelled) else "gpu"
        )
        singles: dict[str, tuple[Decision, _Split | None]] = {}
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
                    f"gpu parts {s.gpu_ms:.3f}, sharing at entry/exit {s.sharing_ms:.3f}) vs "
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
                    )
                )
                plan_chains.append(ChainPlan(names, s.dim, s.ratio))
                continue
            d = singles[op.name][0]
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

    def _decide_by(self, op: _Op, chooser: _Planner) -> Decision:
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


def _flops_model(model: CostModel) -> CostModel:
    if model.kind == "flops":
        return model
    if model.fallback is not None and model.fallback.kind == "flops":
        return model.fallback
    raise PlannerError(
        f"ulayer_like needs a FLOPs-linear model: the {model.kind} cost model has no embedded "
        "FLOPs fallback (fit it with CostModel.fit, which adds one)"
    )


def _summary(ops: list[_Op], rows: list[Decision], home: str) -> PlanSummary:
    modelled = [o for o in ops if o.params is not None]
    cpu = sum(o.cpu_ms for o in modelled)
    gpu = sum(o.gpu_ms for o in modelled)
    predicted = sum(d.coexec_ms for d in rows if d.coexec_ms is not None)
    singles = [d for d in rows if not d.is_chain and d.ratio is not None]
    split = [d for d in singles if 0.0 < d.ratio < 1.0]
    return PlanSummary(
        predicted_ms=predicted,
        cpu_only_ms=cpu,
        gpu_only_ms=gpu,
        ideal_ms=ideal_latency(cpu, gpu),
        n_ops=len(ops),
        n_split_h=sum(d.dim == "H" for d in split)
        + sum(len(d.ops) for d in rows if d.is_chain and d.dim == "H"),
        n_split_oc=sum(d.dim == "OC" for d in split)
        + sum(len(d.ops) for d in rows if d.is_chain and d.dim == "OC"),
        n_whole_cpu=sum(d.ratio == 0.0 for d in singles),
        n_whole_gpu=sum(d.ratio == 1.0 for d in singles),
        chain_lengths=tuple(len(d.ops) for d in rows if d.is_chain),
        n_unmodelled=sum(o.params is None for o in ops),
        home=home,
    )


def calibrated_model(cost_model: CostModel, config: PlannerConfig) -> tuple[CostModel, list[str]]:
    """``cost_model`` with ``config``'s processor scales and weight-streaming floors applied,
    and the report notes that say so (shared by every planner mode)."""
    notes: list[str] = []
    if tuple(config.processor_scale) != (1.0, 1.0):
        cpu_scale, gpu_scale = config.processor_scale
        try:
            cost_model = cost_model.scaled(cpu=cpu_scale, gpu=gpu_scale)
        except ValueError as exc:
            raise PlannerError(f"PlannerConfig.processor_scale: {exc}") from None
        notes.append(
            f"predictions calibrated: CPU x{cpu_scale:.3g}, GPU x{gpu_scale:.3g} (measured / "
            "predicted latency of the model on each processor alone)"
        )
    if config.weight_gbps is not None:  # checked by PlannerConfig
        cost_model = cost_model.streaming(*config.weight_gbps)
        notes.append(
            f"parts predicted no faster than their weights stream: CPU "
            f"{config.weight_gbps[0]:g} GB/s, GPU {config.weight_gbps[1]:g} GB/s"
        )
    return cost_model, notes


def plan_model(
    mod,
    cost_model: CostModel,
    mode: str = "codl",
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> tuple[PartitionPlan, PlanReport]:
    """Plan the co-execution of ``mod`` with ``cost_model``.

    Parameters
    ----------
    mod
        The Relax module as imported (the plan names its partitionable operators).
    cost_model
        A fitted :class:`~codl_tvm.cost_model.CostModel`.
    mode
        ``codl`` (the full planner), ``codl_no_chain``, ``h_only``, ``oc_only`` (CoDL restricted
        to one dimension, chains included), ``ulayer_like`` (an OC split of every operator, its
        ratio chosen by the cost model's FLOPs-linear model, no chains), ``cpu_only``,
        ``gpu_only``.
    config
        Search space and thresholds (:class:`PlannerConfig`).
    model_name
        Recorded in the report.

    Returns
    -------
    (PartitionPlan, PlanReport)
        The plan (every modelled operator appears, ratio 0 or 1 for a whole operator) and the
        report of every decision; all predicted times come from ``cost_model``.
    """
    if not isinstance(cost_model, CostModel):
        raise PlannerError(f"plan_model needs a fitted CostModel, got {type(cost_model).__name__}")
    if mode not in MODES:
        raise PlannerError(f"unknown planner mode {mode!r} (known: {', '.join(MODES)})")
    config = config or PlannerConfig()
    if mode == "codl_no_chain":
        config = replace(config, chains=False)
    elif mode == "h_only":
        config = replace(config, dims=("H",))
    elif mode == "oc_only":
        config = replace(config, dims=("OC",))
    elif mode == "ulayer_like":
        config = replace(config, dims=("OC",), chains=False)
    cost_model, notes = calibrated_model(cost_model, config)
    if cost_model.sharing is None and mode not in ("cpu_only", "gpu_only"):
        notes.append(
            f"the {cost_model.kind} cost model has no data-sharing measurements: sharing costs "
            "are taken as 0, which favours splits"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=f".*{_NO_SHARING}")
        planner = _Planner(mod, cost_model, config, mode)
        forced = {"cpu_only": "cpu", "gpu_only": "gpu"}.get(mode)
        chooser = None
        if mode == "ulayer_like":
            chooser = _Planner(mod, _flops_model(cost_model), config, mode)
        plan, rows = planner.run(forced, chooser)
    plan.validate(mod)
    notes.extend(planner.chain_notes)
    for (proc, impl, closest), names in planner.uncovered.items():
        notes.append(
            f"the {proc.upper()} build uses {impl} kernels for {len(names)} operator(s) "
            f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}); the cost model has no "
            f"{impl} data, so they are predicted as {closest} (profile them: `codl-tvm profile "
            f"--{impl}`)"
        )
    notes.extend(dict.fromkeys(str(w.message) for w in caught))  # once each, in order
    report = PlanReport(
        mode=mode,
        cost_model=cost_model.kind,
        decisions=tuple(rows),
        summary=_summary(planner.ops, rows, plan.home),
        notes=tuple(notes),
        model=model_name,
    )
    return plan, report


def plan_all(
    mod,
    cost_model: CostModel,
    modes: Sequence[str] = MODES,
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> dict[str, tuple[PartitionPlan, PlanReport]]:
    """:func:`plan_model` for several modes (the baselines of CoDL's evaluation)."""
    return {m: plan_model(mod, cost_model, m, config, model_name) for m in modes}


def comparison_table(results: Mapping[str, tuple[Any, PlanReport]]) -> str:
    """One line per mode: predicted latency, speedup over the best single processor, T* share."""
    lines = [f"{'mode':<14} {'predicted ms':>12} {'vs best single':>14} {'of T*':>7}"]
    for mode, (_, rep) in results.items():
        s = rep.summary
        lines.append(
            f"{mode:<14} {s.predicted_ms:>12.3f} {s.speedup_vs_best_single:>13.2f}x "
            f"{s.efficiency:>7.0%}"
        )
    return "\n".join(lines)
