"""Gradient-boosted trees per kernel implementation with dispatch features (the fine-grained SVM
paper, section 3.2): one xgboost regressor per (operator kind, processor, implementation) on the
named features of ``OpFeatures.numeric`` (hyper-parameters, partition, part shape, FLOPs,
OpenCL work-group size and count, CPU parallel blocks, vector width, threads; unknown = NaN,
which xgboost treats as missing).

The feature code lives beside the model: :mod:`codl_tvm.cost_model.dispatch_shape` (the
dispatch-shape features) and :mod:`codl_tvm.cost_model.tiling_features` (the direct conv's tiling
and bounds checks).

The target is ``log(latency_ms)`` (relative error, latencies span decades). With
``GbdtConfig.analytical_base`` (the default) the trees start from CoDL's analytical model
(``analytical.CodlModel``, fitted on the same records and embedded in the file): its log
prediction is the base margin and the trees learn the residual, so the analytical structure
carries the extrapolation and the trees the corrections (held-out MAPE 21.6% -> 19.7% on the
emulated SoC (PoCL and TVM on a 16-core Xeon), 29.9% -> 28.7% on the H100 and its Xeon host).

``GbdtConfig.wave()`` (the recipe of the shipped ``device-h100`` and ``emulated-soc`` models) starts
instead from :class:`WaveBase`, a per-group latency fitted from the part's dispatch shape (launch,
the busiest work-item's multiply-adds in each wave of work-items over the GPU's compute units,
throughput, bytes), and adds the dispatch-shape features of
:func:`~codl_tvm.cost_model.dispatch_shape.shape_features`: on the H100
GPU's held-out parts 34% -> 50% within +-10%, on models never seen 23% -> 35% (docs/benchmarks.md).
Its ``"tir"`` feature set adds counts read from each built GPU part's kernel
(:data:`KERNEL_FEATURE_NAMES`, read by the model's ``kernel_reader``): on the H100 GPU 50% -> 54%
and 32% -> 37% over three seeds, not shipped because one split decision got worse; ``"tir-nv"``
adds what NVIDIA's compiler says of the kernel (:data:`NV_FEATURE_NAMES`, measured on an H100):
54% and 40%, within seed noise of ``"tir"`` on the random split, not shipped.
Its ``"dispatch-share"`` feature set (``cost-model fit --recipe wave-share``) adds the part's share
of its operator (:func:`part_share`): on the emulated SoC at k = 12 it picks the measured best
split (within 5%) for 79% of the benchmark operators leave-one-model-out, against 74% for the
shipped CoDL-based recipe and 77% for the wave recipe without it (docs/benchmarks.md).
Boosters are stored inside the model's JSON file as xgboost's own JSON model (``save_raw("json")``),
so a reloaded model predicts bit-identically. xgboost is imported only inside the functions that use
it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel, has_dispatch, infer_preset
from codl_tvm.cost_model.base import CostModel, CostModelFallbackWarning, records_by_kernel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.dispatch_shape import SHAPE_FEATURE_NAMES, dispatch_shape, shape_features
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, DispatchFeatures, OpFeatures
from codl_tvm.cost_model.linalg import nnls
from codl_tvm.cost_model.tiling_features import GUARD_FEATURE_NAMES, conv_guards, direct_settings

__all__ = [
    "FEATURE_NAMES",
    "FEATURE_SETS",
    "KERNEL_FEATURE_NAMES",
    "KERNEL_FEATURE_SETS",
    "NV_FEATURE_NAMES",
    "SHARE_FEATURE_NAMES",
    "GbdtConfig",
    "GbdtModel",
    "KernelReader",
    "WaveBase",
    "derived_features",
    "device_compute_units",
    "device_gpu_target",
    "part_share",
    "strip_training_stats",
]

FEATURE_NAMES: tuple[str, ...] = (
    "h",
    "w",
    "ic",
    "oc",
    "kernel",
    "stride",
    "pad_h",
    "pad_w",
    "dilation",
    "groups",
    "dim_h",
    "dim_oc",
    "ratio",
    "part_out_h",
    "part_out_w",
    "part_oc",
    "part_in_h",
    "part_ic",
    "part_groups",
    "flops",
    "wg_size",
    "wg_count",
    "cpu_parallel_blocks",
    "vector_width",
    "threads",
    "num_kernels",
    # Derived from the part shape and the dispatch features (see ``derived_features``).
    "out_elems",
    "in_elems",
    "reduction",
    "macs",
    "items",
    "outputs_per_item",
    "macs_per_item",
)
_BASE_NAMES = FEATURE_NAMES[:26]

#: What ``kernel_counts.kernel_counts`` reads from a GPU part's scheduled kernel, in order
#: (per-thread counts unless said otherwise), after the dispatch-shape features in the ``"tir"``
#: feature set.
KERNEL_FEATURE_NAMES: tuple[str, ...] = (
    "k_threads",  # work-items per work-group
    "k_groups",  # work-groups
    "k_global_loads",
    "k_shared_loads",
    "k_local_loads",
    "k_global_stores",
    "k_shared_stores",
    "k_local_stores",
    "k_flops",  # float add/sub/mul/div/min/max
    "k_guarded",  # block executions under a bounds-check predicate
    "k_guard_terms",  # comparisons in those predicates, per execution summed
    "k_compute_guard_terms",  # comparisons in the predicate of the reduction's update block
    "k_selects",  # if_then_else / select evaluations (padding)
    "k_serial_iters",  # serial loop iterations around the reduction's update block
    "k_unroll",  # largest product of unrolled loop extents around a store
    "k_shared_bytes",  # per work-group
    "k_local_bytes",  # per work-item
    "k_kernels",  # PrimFuncs
)

#: What NVIDIA's OpenCL compiler says of a GPU part's kernel (``ptxas`` through
#: ``-cl-nv-verbose`` and ``clGetKernelWorkGroupInfo``, measured on the NVIDIA GPU by
#: ``scripts/nv_kernel_info.py``; ``kernel_counts.nv_features``), after the kernel counts in the
#: ``"tir-nv"`` feature set. Over the part's kernels: the largest unless said otherwise.
NV_FEATURE_NAMES: tuple[str, ...] = (
    "nv_registers",  # per work-item
    "nv_spill_bytes",  # spill stores + loads, summed over the kernels
    "nv_stack_bytes",  # stack frame per work-item
    "nv_smem_bytes",  # static shared memory per work-group
    "nv_private_bytes",  # CL_KERNEL_PRIVATE_MEM_SIZE
    "nv_max_wg",  # CL_KERNEL_WORK_GROUP_SIZE, the smallest
    "nv_blocks_per_sm",  # resident work-groups per SM at the part's work-group size, the fewest
    "nv_occupancy",  # resident warps / the SM's 64, the lowest
)

#: The part's share of its operator (:func:`part_share`), after the dispatch-shape features in
#: the ``"dispatch-share"`` feature set.
SHARE_FEATURE_NAMES: tuple[str, ...] = ("share",)

#: Feature sets: ``"v1"`` (the files written before dispatch-shape features), ``"dispatch"`` (v1
#: plus :data:`~codl_tvm.cost_model.dispatch_shape.SHAPE_FEATURE_NAMES`), ``"guards"`` (dispatch
#: plus :data:`~codl_tvm.cost_model.tiling_features.GUARD_FEATURE_NAMES`; its wave base has the
#: row-guard term of :class:`WaveBase`) and ``"tir"`` (dispatch plus :data:`KERNEL_FEATURE_NAMES`,
#: read from the GPU part's scheduled kernel by a ``GbdtModel``'s ``kernel_reader``) and
#: ``"tir-nv"`` (tir plus :data:`NV_FEATURE_NAMES`, the reader joining the device's measured kernel
#: info); ``"dispatch-share"`` (dispatch plus :data:`SHARE_FEATURE_NAMES`).
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "v1": FEATURE_NAMES,
    "dispatch": FEATURE_NAMES + SHAPE_FEATURE_NAMES,
    "dispatch-share": FEATURE_NAMES + SHAPE_FEATURE_NAMES + SHARE_FEATURE_NAMES,
    "guards": FEATURE_NAMES + SHAPE_FEATURE_NAMES + GUARD_FEATURE_NAMES,
    "tir": FEATURE_NAMES + SHAPE_FEATURE_NAMES + KERNEL_FEATURE_NAMES,
    "tir-nv": FEATURE_NAMES + SHAPE_FEATURE_NAMES + KERNEL_FEATURE_NAMES + NV_FEATURE_NAMES,
}

#: The feature sets read from a built part's kernel by a ``GbdtModel``'s ``kernel_reader``.
KERNEL_FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "tir": KERNEL_FEATURE_NAMES,
    "tir-nv": KERNEL_FEATURE_NAMES + NV_FEATURE_NAMES,
}


@dataclass(frozen=True)
class GbdtConfig:
    """xgboost hyper-parameters (the SVM paper tuned these with Optuna; these are defaults).

    ``nthread=1`` keeps training deterministic; ``min_records`` is the smallest group trained
    (smaller groups use the FLOPs fallback). ``analytical_base``: a ``CodlConfig`` preset name
    whose model is the trees' starting point, ``"auto"`` for the preset of the records' device
    (``analytical.infer_preset``), ``"none"`` for plain trees. ``augment_blind``: train on every
    record twice, with and without its dispatch features, so the trees also predict parts
    nobody has built yet (the planner's features have no dispatch features; trees that never
    saw them missing send such rows down arbitrary default branches). ``base_clamp``: the
    analytical base is kept within this factor of its FLOPs line (0 = unclamped, as files
    written before the option): CoDL's formulas extrapolate to a kernel configuration missing
    from the training data by 30x and more, the trees cannot correct what they never saw.
    ``feature_set``: :data:`FEATURE_SETS` key. ``compute_units``: the GPU's compute units for
    the wave features (0: read from the records' device description, ``compute_units``).
    """

    n_estimators: int = 100
    max_depth: int = 4
    learning_rate: float = 0.1
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    min_child_weight: float = 3.0
    reg_lambda: float = 1.0
    seed: int = 0
    nthread: int = 1
    min_records: int = 8
    analytical_base: str = "auto"
    augment_blind: bool = True
    base_clamp: float = 3.0
    feature_set: str = "v1"
    compute_units: int = 0

    def __post_init__(self) -> None:
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(
                f"feature_set {self.feature_set!r} is not one of {sorted(FEATURE_SETS)}"
            )

    @classmethod
    def wave(cls, **overrides) -> GbdtConfig:
        """The dispatch-shape recipe: the wave/roofline base (:class:`WaveBase`), the
        ``"dispatch"`` feature set and deeper trees on ``log(latency / base)``;
        ``feature_set="guards"`` adds the direct conv's bounds checks
        (:func:`~codl_tvm.cost_model.tiling_features.conv_guards`) and the base's row-guard term
        (``cost-model fit --recipe wave-guards``); ``feature_set="tir"`` the counts read from each
        GPU part's scheduled kernel (``kernel_counts``; ``cost-model fit --recipe wave-tir``),
        ``feature_set="tir-nv"`` those and the compiler's registers, spills and occupancy
        (``--recipe wave-tir-nv``), ``feature_set="dispatch-share"`` the part's share of its
        operator (:func:`part_share`; ``--recipe wave-share``).

        On the H100 and the emulated SoC (k = 8) datasets it beat the CoDL-based recipe on both
        processors and both splits (docs/benchmarks.md, "How accurate are the cost models?");
        the SoC's model has 80 trees, to stay under 2 MB with its more kernel groups."""
        recipe = {
            # 150 trees scored 3 points more on the H100 GPU but made a 2.6 MB file
            "n_estimators": 100,
            "max_depth": 5,
            "min_child_weight": 1.0,
            "analytical_base": "wave",
            # "guards" (the direct conv's bounds checks) and "tir" (counts read from the built
            # kernel) scored better on the H100 GPU but each moved one of its 141 split
            # decisions off the best (docs/benchmarks.md)
            "feature_set": "dispatch",
            **overrides,
        }
        return cls(**recipe)

    def params(self) -> dict:
        return {
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "colsample_bytree": self.colsample_bytree,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "seed": self.seed,
            "nthread": self.nthread,
            "objective": "reg:squarederror",
            "tree_method": "hist",
        }


_TRAINING_STATS = ("loss_changes", "sum_hessian", "base_weights")


def strip_training_stats(raw: dict) -> dict:
    """Zero the per-node training statistics of an xgboost JSON model (split gains, hessian
    sums, node weights): prediction reads only the tree structure, split conditions and leaf
    values, and the file shrinks by ~20%. Returns ``raw``, changed in place."""
    for tree in raw["learner"]["gradient_booster"]["model"]["trees"]:
        for name in _TRAINING_STATS:
            tree[name] = [0.0] * len(tree[name])
    return raw


def part_share(f: OpFeatures) -> float:
    """The part's share of its operator along the split dimension: the GPU ratio for a GPU
    part, one minus it for a CPU part, 1 for a whole operator.

    The split decisions compare parts of one operator at several shares on both processors;
    the partition's ``ratio`` alone is the GPU's share, so a CPU part's share is a reflection
    the trees would have to learn separately in each CPU group. Its own feature lets a split
    on the share apply alike to both processors' parts and to whole operators (share 1)."""
    if f.partition.dim == "none":
        return 1.0
    return f.partition.ratio if f.processor == "gpu" else 1.0 - f.partition.ratio


def derived_features(f: OpFeatures) -> list[float]:
    """Work the part does and how the built kernel splits it: output and input elements,
    reduction length K, MACs, parallel items (GPU work-items = wg_size * wg_count, CPU parallel
    blocks; NaN when unknown), outputs and MACs per item (ceil)."""
    q, p, d = f.part, f.params, f.dispatch
    out = q.out_h * q.out_w * q.oc
    red = p.kernel * p.kernel if f.op == "pool" else (q.ic // max(q.groups, 1)) * p.kernel**2
    if f.processor == "gpu":
        items = d.wg_size * d.wg_count if d.wg_size and d.wg_count else None
    else:
        items = d.cpu_parallel_blocks
    nan = float("nan")
    per_item = -(-out // items) if items else None
    return [
        float(out),
        float(q.in_h * q.in_w * q.ic),
        float(red),
        float(out) * red,
        nan if items is None else float(items),
        nan if per_item is None else float(per_item),
        nan if per_item is None else float(per_item) * red,
    ]


#: Reads the :data:`KERNEL_FEATURE_NAMES` of a part's kernel built for a target (its JSON text)
#: under preset settings (``kernel_counts.part_kernel_counts``; NaN where it cannot).
KernelReader = Callable[[OpFeatures, str, Mapping[str, object]], list[float]]


def _matrix(
    features: Sequence[OpFeatures],
    feature_set: str = "v1",
    compute_units: int = 0,
    kernel_target: str = "",
    kernel_reader: KernelReader | None = None,
) -> np.ndarray:
    rows = []
    # DIRECT_TILINGS are the NVIDIA preset's settings; other devices' parts were built with
    # their preset as it is
    nvidia = bool(kernel_target) and json.loads(kernel_target).get("device") == "nvidia"
    for f in features:
        n = f.numeric()
        row = [n[k] for k in _BASE_NAMES] + derived_features(f)
        if feature_set in ("dispatch", "dispatch-share", "guards", "tir", "tir-nv"):
            row += shape_features(f, compute_units)
        if feature_set == "dispatch-share":
            row.append(part_share(f))
        if feature_set == "guards":
            row += conv_guards(f)
        if feature_set in KERNEL_FEATURE_SETS:
            if kernel_reader is not None:
                row += kernel_reader(f, kernel_target, direct_settings(f) if nvidia else {})
            elif f.processor == "gpu" and f.dispatch.wg_size and f.dispatch.wg_count:
                raise ValueError(
                    f"{f.params.describe()}: the {feature_set!r} features of a built part need "
                    "the model's kernel_reader (kernel_counts.part_kernel_counts)"
                )
            else:  # what the reader returns for parts nobody built (the planner's)
                row += [math.nan] * len(KERNEL_FEATURE_SETS[feature_set])
        rows.append(row)
    return np.array(rows, dtype=np.float64)


class WaveBase:
    """An analytical latency per kernel group from the part's dispatch shape, the trees'
    starting point with ``analytical_base="wave"``.

    ``latency_ms = a + b * per_unit_macs * ceil(waves) + c * macs + d * bytes``: a launch
    cost, the busiest unit's serial chain in each wave (a GPU runs its waves one after
    another; within a wave the slowest work-item finishes last), a throughput term and a memory term
    (:func:`~codl_tvm.cost_model.dispatch_shape.dispatch_shape`). Coefficients are non-negative
    least squares, weighted by 1/latency so that each part counts by its relative error. The trees
    then learn ``log(latency / base)``. With ``guards`` (the ``"guards"`` feature set) a fifth
    term, ``e * chain * guard_oh_not_oc``
    (:func:`~codl_tvm.cost_model.tiling_features.conv_guards`), prices the slower serial
    chain of a direct conv whose rows alone are bounds-checked.
    """

    def __init__(
        self,
        compute_units: int,
        coef: dict[tuple[str, str, str], list[float]],
        guards: bool = False,
    ):
        self.compute_units = compute_units
        self.coef = dict(coef)
        self.guards = guards

    @staticmethod
    def terms(f: OpFeatures, compute_units: int, guards: bool = False) -> list[float]:
        s = dispatch_shape(f, compute_units)
        chain = s.per_unit_macs * math.ceil(s.waves)
        out = [1.0, chain, s.macs, float(s.in_bytes + s.weight_bytes + s.out_bytes)]
        if guards:
            row_only = conv_guards(f)[3]
            out.append(chain if row_only == 1.0 else 0.0)
        return out

    @classmethod
    def fit(cls, records: Sequence[OpRecord], compute_units: int, guards: bool = False) -> WaveBase:
        coef = {}
        for key, recs in sorted(records_by_kernel(records).items()):
            a = np.array([cls.terms(r.features(), compute_units, guards) for r in recs])
            y = np.array([r.latency_ms for r in recs])
            # scale columns so NNLS is well conditioned; weights make errors relative
            scale = np.maximum(a.max(axis=0), 1e-30)
            w = 1.0 / y
            c = nnls(a / scale * w[:, None], y * w) / scale
            coef[key] = [float(v) for v in c]
        return cls(compute_units, coef, guards)

    def predict_many(self, features: Sequence[OpFeatures]) -> np.ndarray:
        """Latency in ms of each part (a group never fitted raises KeyError)."""
        out = np.empty(len(features))
        for i, f in enumerate(features):
            c = self.coef[(f.op, f.processor, f.impl)]
            out[i] = float(np.dot(c, self.terms(f, self.compute_units, self.guards)))
        # a group whose fit left every term at zero predicts nothing; 1 ns keeps the log finite
        return np.maximum(out, 1e-6)

    def to_json(self) -> dict:
        return {
            "compute_units": self.compute_units,
            "guards": self.guards,
            "groups": [
                {"op": k[0], "processor": k[1], "impl": k[2], "coef": v}
                for k, v in sorted(self.coef.items())
            ],
        }

    @classmethod
    def from_json(cls, obj: dict) -> WaveBase:
        coef = {}
        # files written before the guard term have none (and four coefficients)
        guards = bool(obj.get("guards", False))
        for g in obj["groups"]:
            c = [float(v) for v in g["coef"]]
            if len(c) != 4 + guards or not all(math.isfinite(v) and v >= 0 for v in c):
                raise ValueError(f"wave base coefficients of {g['op']}/{g['impl']}: {c!r}")
            coef[(g["op"], g["processor"], str(g["impl"]))] = c
        return cls(int(obj["compute_units"]), coef, guards)


def device_gpu_target(records: Iterable[OpRecord]) -> str:
    """The GPU target the records' parts were built for (the device description's
    ``gpu_target``, a target's JSON text); empty where none says."""
    for r in records:
        target = dict(r.device).get("gpu_target")
        if isinstance(target, str) and target:
            return target
    return ""


def device_compute_units(records: Iterable[OpRecord]) -> int:
    """The GPU's compute units from the records' device description (``compute_units``), 1
    where none says."""
    for r in records:
        cu = dict(r.device).get("compute_units")
        if isinstance(cu, int) and not isinstance(cu, bool) and cu > 0:
            return cu
    return 1


class GbdtModel(CostModel):
    """One xgboost booster per (operator kind, processor, implementation).

    ``kernel_reader`` (the ``"tir"`` feature set): reads a built part's kernel,
    ``kernel_counts.part_kernel_counts``; passed in by whoever fits or evaluates the model on
    recorded parts (the cost-model CLI), since reading a kernel schedules it with TVM
    (``cost_model.part_ir``), which the model itself never imports. Without it the model predicts
    parts without recorded dispatch (the planner's), whose kernel features are NaN either way.
    """

    kind = "gbdt"

    def __init__(
        self, config: GbdtConfig | None = None, kernel_reader: KernelReader | None = None
    ) -> None:
        super().__init__()
        self.config = config or GbdtConfig()
        self.kernel_reader = kernel_reader
        self.boosters: dict[tuple[str, str, str], object] = {}
        self._raw: dict[tuple[str, str, str], dict] = {}
        self._counts: dict[tuple[str, str, str], int] = {}
        self.base: CodlModel | WaveBase | None = None  # the trees' start (analytical_base)
        self.compute_units = self.config.compute_units  # of the wave features, resolved by fit
        # the target whose kernels the "tir" features read, resolved by fit
        self.kernel_target = ""

    def _fit_ops(self, records: list[OpRecord]) -> None:
        import xgboost as xgb  # deferred: a heavy optional dependency, used only here

        by_key = records_by_kernel(records)
        self.boosters, self._raw, self._counts = {}, {}, {}
        self.base = None
        self.compute_units = self.config.compute_units or device_compute_units(records)
        reads = self.config.feature_set in KERNEL_FEATURE_SETS
        self.kernel_target = device_gpu_target(records) if reads else ""
        if self.config.analytical_base == "wave":
            fitted = [r for rs in by_key.values() if len(rs) >= self.config.min_records for r in rs]
            guards = self.config.feature_set == "guards"
            self.base = WaveBase.fit(fitted, self.compute_units, guards)
        elif self.config.analytical_base != "none":
            preset = self.config.analytical_base
            if preset == "auto":
                preset = infer_preset(records)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # groups too small for it use its FLOPs line
                self.base = CodlModel(preset).fit(records)
        for key, recs in sorted(by_key.items()):
            if len(recs) < self.config.min_records:
                warnings.warn(
                    f"gbdt cost model: only {len(recs)} records for {key} (needs "
                    f">= {self.config.min_records}); those operators will use the "
                    "FLOPs fallback",
                    stacklevel=3,
                )
                continue
            feats = [r.features() for r in recs]
            y = np.log(np.array([r.latency_ms for r in recs]))
            if self.config.augment_blind and any(has_dispatch(f) for f in feats):
                feats = feats + [dataclasses.replace(f, dispatch=DispatchFeatures()) for f in feats]
                y = np.concatenate([y, y])
            x = self._x(feats)
            dtrain = xgb.DMatrix(x, label=y, feature_names=list(self.feature_names))
            if self.base is not None:
                dtrain.set_base_margin(self._base_margin(feats))
            params = self.config.params()
            if self.base is not None:
                # The trees' own bias is 0, so a prediction is trees(x) + margin without passing
                # the margin to xgboost (its base_margin input costs ~7 ms per call).
                params["base_score"] = 0.0
            booster = xgb.train(params, dtrain, num_boost_round=self.config.n_estimators)
            # Keep the JSON form and predict with a booster loaded from it, so a model predicts
            # the same before and after a save/load round trip.
            raw = strip_training_stats(json.loads(bytes(booster.save_raw(raw_format="json"))))
            self._raw[key] = raw
            self.boosters[key] = self._booster_from(raw)
            self._counts[key] = len(recs)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return FEATURE_SETS[self.config.feature_set]

    def _x(self, features: Sequence[OpFeatures]) -> np.ndarray:
        return _matrix(
            features,
            self.config.feature_set,
            self.compute_units,
            self.kernel_target,
            self.kernel_reader,
        )

    @staticmethod
    def _booster_from(raw: dict):
        import xgboost as xgb  # deferred: a heavy optional dependency, used only here

        booster = xgb.Booster()
        booster.load_model(bytearray(json.dumps(raw).encode()))
        # One prediction thread: the planner predicts a few parts at a time, where a thread pool
        # costs more than it saves (predictions are the same for any thread count).
        booster.set_param({"nthread": 1})
        return booster

    def _base_margin(self, features: Sequence[OpFeatures]) -> np.ndarray:
        if isinstance(self.base, WaveBase):
            return np.log(self.base.predict_many(features))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CostModelFallbackWarning)
            margin = np.log(self.base.predict_many(features))
            clamp = self.config.base_clamp
            if clamp > 1.0:
                # CoDL's formulas extrapolate wildly to a kernel configuration they never saw
                # (a padded stride-1 pooling predicted 35x too slow when no model with one was
                # in the training data); the FLOPs line is crude but never that far off.
                line = np.log(self.base.fallback.predict_many(features))
                margin = np.clip(margin, line - math.log(clamp), line + math.log(clamp))
            return margin

    def covers(self, features: OpFeatures) -> bool:
        return (features.op, features.processor, features.impl) in self.boosters

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        out = np.empty(len(features))
        by_key: dict[tuple[str, str, str], list[int]] = {}
        for i, f in enumerate(features):
            by_key.setdefault((f.op, f.processor, f.impl), []).append(i)
        for key, idx in by_key.items():
            feats = [features[i] for i in idx]
            x = self._x(feats)
            pred = np.asarray(self.boosters[key].inplace_predict(x), dtype=np.float64)
            if self.base is not None:
                pred = pred + self._base_margin(feats)
            out[idx] = np.exp(pred)
        return out

    def body_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "features": list(self.feature_names),
            "base": None if self.base is None else self.base.to_json(),
            "compute_units": self.compute_units,
            "kernel_target": self.kernel_target,
            "groups": [
                {
                    "op": k[0],
                    "processor": k[1],
                    "impl": k[2],
                    "n": self._counts[k],
                    "booster": self._raw[k],
                }
                for k in sorted(self._raw)
            ],
        }

    def load_body(self, body: dict) -> None:
        # files written before base_clamp existed were fitted on the unclamped base
        self.config = GbdtConfig(**{"base_clamp": 0.0, **body["config"]})
        self.base = None
        self.compute_units = int(body.get("compute_units", self.config.compute_units))
        self.kernel_target = str(body.get("kernel_target", ""))  # none before the "tir" set
        if body.get("base") is not None:
            if self.config.analytical_base == "wave":
                self.base = WaveBase.from_json(body["base"])
            else:
                self.base = CodlModel.from_json(body["base"], "(analytical base)")
        if list(body["features"]) != list(self.feature_names):
            raise ValueError(
                "the model's feature names differ from this codl-tvm's "
                f"({body['features']!r}); refit the model"
            )
        # deferred (a heavy optional dependency); checked here because a missing package is not
        # a corrupt file
        import xgboost  # noqa: F401

        self.boosters, self._raw, self._counts = {}, {}, {}
        for obj in body["groups"]:
            key = (obj["op"], obj["processor"], str(obj["impl"]))
            if key[0] not in OP_KINDS or key[1] not in PROCESSORS:
                raise ValueError(f"unknown operator kind/processor {key[0]!r}/{key[1]!r}")
            if not isinstance(obj["booster"], dict):
                raise ValueError(f"booster of {key} is not an xgboost JSON model")
            try:
                booster = self._booster_from(obj["booster"])
            except Exception as exc:  # xgboost raises its own XGBoostError
                raise ValueError(
                    f"xgboost cannot load the booster of {key}: {str(exc).splitlines()[0]}"
                ) from None
            self._raw[key] = obj["booster"]
            self.boosters[key] = booster
            self._counts[key] = int(obj["n"])
