"""Gradient-boosted trees per kernel implementation with dispatch features (the fine-grained SVM
paper, section 3.2): one xgboost regressor per (operator kind, processor, implementation) on the
named features of ``OpFeatures.numeric`` (hyper-parameters, partition, part shape, FLOPs,
OpenCL work-group size and count, CPU parallel blocks, vector width, threads; unknown = NaN,
which xgboost treats as missing).

The target is ``log(latency_ms)`` (relative error, latencies span decades). With
``GbdtConfig.analytical_base`` (the default) the trees start from CoDL's analytical model
(``analytical.CodlModel``, fitted on the same records and embedded in the file): its log
prediction is the base margin and the trees learn the residual, so the analytical structure
carries the extrapolation and the trees the corrections (on the device machine's data: held-out
MAPE 21.6% -> 19.7% on the emulated SoC, 29.9% -> 28.7% on the H100 pair). Boosters are stored
inside the model's JSON file as xgboost's own JSON model (``save_raw("json")``), so a reloaded
model predicts bit-identically. xgboost is imported only inside the functions that use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel, has_dispatch, infer_preset
from codl_tvm.cost_model.base import CostModel, CostModelFallbackWarning, records_by_kernel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, DispatchFeatures, OpFeatures

__all__ = [
    "FEATURE_NAMES",
    "GbdtConfig",
    "GbdtModel",
    "derived_features",
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


def _matrix(features: Sequence[OpFeatures]) -> np.ndarray:
    rows = []
    for f in features:
        n = f.numeric()
        rows.append([n[k] for k in _BASE_NAMES] + derived_features(f))
    return np.array(rows, dtype=np.float64)


class GbdtModel(CostModel):
    """One xgboost booster per (operator kind, processor, implementation)."""

    kind = "gbdt"

    def __init__(self, config: GbdtConfig | None = None) -> None:
        super().__init__()
        self.config = config or GbdtConfig()
        self.boosters: dict[tuple[str, str, str], object] = {}
        self._raw: dict[tuple[str, str, str], dict] = {}
        self._counts: dict[tuple[str, str, str], int] = {}
        self.base = None  # CoDL's model the trees start from (analytical_base)

    def _fit_ops(self, records: list[OpRecord]) -> None:
        import xgboost as xgb  # deferred: a heavy optional dependency, used only here

        by_key = records_by_kernel(records)
        self.boosters, self._raw, self._counts = {}, {}, {}
        self.base = None
        if self.config.analytical_base != "none":
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
            x = _matrix(feats)
            dtrain = xgb.DMatrix(x, label=y, feature_names=list(FEATURE_NAMES))
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
            x = _matrix(feats)
            pred = np.asarray(self.boosters[key].inplace_predict(x), dtype=np.float64)
            if self.base is not None:
                pred = pred + self._base_margin(feats)
            out[idx] = np.exp(pred)
        return out

    def _body_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "features": list(FEATURE_NAMES),
            "base": None if self.base is None else self.base.to_json(),
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

    def _load_body(self, body: dict) -> None:
        # files written before base_clamp existed were fitted on the unclamped base
        self.config = GbdtConfig(**{"base_clamp": 0.0, **body["config"]})
        self.base = None
        if body.get("base") is not None:
            self.base = CodlModel.from_json(body["base"], "(analytical base)")
        if list(body["features"]) != list(FEATURE_NAMES):
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
