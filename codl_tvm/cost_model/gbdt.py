"""Gradient-boosted trees per kernel implementation with dispatch features (the fine-grained SVM
paper, section 3.2): one xgboost regressor per (operator kind, processor, implementation) on the
named features of ``OpFeatures.numeric`` (hyper-parameters, partition, part shape, FLOPs,
OpenCL work-group size and count, CPU parallel blocks, vector width, threads; unknown = NaN,
which xgboost treats as missing).

The target is ``log(latency_ms)`` (relative error, latencies span decades). Boosters are stored
inside the model's JSON file as xgboost's own JSON model (``save_raw("json")``), so a reloaded
model predicts bit-identically. xgboost is imported only inside the functions that use it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OP_KINDS, PROCESSORS, OpFeatures

__all__ = ["FEATURE_NAMES", "GbdtConfig", "GbdtModel"]

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
)


@dataclass(frozen=True)
class GbdtConfig:
    """xgboost hyper-parameters (the SVM paper tuned these with Optuna; these are defaults).

    ``nthread=1`` keeps training deterministic; ``min_records`` is the smallest group trained
    (smaller groups use the FLOPs fallback).
    """

    n_estimators: int = 300
    max_depth: int = 6
    learning_rate: float = 0.1
    subsample: float = 1.0
    min_child_weight: float = 1.0
    reg_lambda: float = 1.0
    seed: int = 0
    nthread: int = 1
    min_records: int = 8

    def params(self) -> dict:
        return {
            "max_depth": self.max_depth,
            "eta": self.learning_rate,
            "subsample": self.subsample,
            "min_child_weight": self.min_child_weight,
            "lambda": self.reg_lambda,
            "seed": self.seed,
            "nthread": self.nthread,
            "objective": "reg:squarederror",
            "tree_method": "hist",
        }


def _matrix(features: Sequence[OpFeatures]) -> np.ndarray:
    rows = [f.numeric() for f in features]
    return np.array([[r[k] for k in FEATURE_NAMES] for r in rows], dtype=np.float64)


class GbdtModel(CostModel):
    """One xgboost booster per (operator kind, processor, implementation)."""

    kind = "gbdt"

    def __init__(self, config: GbdtConfig | None = None) -> None:
        super().__init__()
        self.config = config or GbdtConfig()
        self.boosters: dict[tuple[str, str, str], object] = {}
        self._raw: dict[tuple[str, str, str], dict] = {}
        self._counts: dict[tuple[str, str, str], int] = {}

    def _fit_ops(self, records: list[OpRecord]) -> None:
        import xgboost as xgb

        by_key: dict[tuple[str, str, str], list[OpRecord]] = {}
        for r in records:
            by_key.setdefault((r.op, r.processor, r.impl), []).append(r)
        self.boosters, self._raw, self._counts = {}, {}, {}
        for key, recs in sorted(by_key.items()):
            if len(recs) < self.config.min_records:
                warnings.warn(
                    f"gbdt cost model: only {len(recs)} records for {key} (needs "
                    f">= {self.config.min_records}); those operators will use the "
                    "FLOPs fallback",
                    stacklevel=3,
                )
                continue
            x = _matrix([r.features() for r in recs])
            y = np.log(np.array([r.latency_ms for r in recs]))
            dtrain = xgb.DMatrix(x, label=y, feature_names=list(FEATURE_NAMES))
            booster = xgb.train(
                self.config.params(), dtrain, num_boost_round=self.config.n_estimators
            )
            # Keep the JSON form and predict with a booster loaded from it, so a model predicts
            # the same before and after a save/load round trip.
            raw = json.loads(bytes(booster.save_raw(raw_format="json")))
            self._raw[key] = raw
            self.boosters[key] = self._booster_from(raw)
            self._counts[key] = len(recs)

    @staticmethod
    def _booster_from(raw: dict):
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(bytearray(json.dumps(raw).encode()))
        return booster

    def covers(self, features: OpFeatures) -> bool:
        return (features.op, features.processor, features.impl) in self.boosters

    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray:
        out = np.empty(len(features))
        by_key: dict[tuple[str, str, str], list[int]] = {}
        for i, f in enumerate(features):
            by_key.setdefault((f.op, f.processor, f.impl), []).append(i)
        for key, idx in by_key.items():
            x = _matrix([features[i] for i in idx])
            pred = self.boosters[key].inplace_predict(x)
            out[idx] = np.exp(np.asarray(pred, dtype=np.float64))
        return out

    def _body_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "features": list(FEATURE_NAMES),
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
        self.config = GbdtConfig(**body["config"])
        if list(body["features"]) != list(FEATURE_NAMES):
            raise ValueError(
                "the model's feature names differ from this codl-tvm's "
                f"({body['features']!r}); refit the model"
            )
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
