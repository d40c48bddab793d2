"""The cost-model interface, its JSON file format and CoDL's Eq. 2 composition.

Every model (CoDL's analytical model, GBDT, FLOPs-linear) is a ``CostModel``:

- ``fit(records)`` learns from dataset records (``OpRecord`` for compute, ``SharingRecord`` for
  data-sharing costs; other records are ignored),
- ``predict(features) -> latency_ms`` for one operator part on one processor,
- ``save(path)`` / ``load(path)``: one JSON file (never pickle) with ``format``, ``version`` and
  ``kind``; a corrupt, foreign or version-mismatched file raises ``ModelFileError`` naming the
  file and the problem.

A model that does not cover an operator (operator kind, processor or implementation it never saw)
predicts it with its embedded FLOPs-linear model and emits a ``CostModelFallbackWarning`` naming
the operator.

``predict_coexec`` composes CoDL's Eq. 2,
``T = T_trans + T_map + T_psync + max(T_cpu, T_gpu)``, where the data-sharing terms are linear in
the bytes the CPU side shares (its input part plus its output part) and are added only when both
processors run a part and the operator is not inside a chain (``chained=False``): inside a chain
each processor reads data it produced itself (CoDL section 4.2). Unmap and post-sync are fitted
when measured but, as in CoDL, left out of Eq. 2 (they are ~50 us).
"""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from codl_tvm.core.errors import ModelFileError
from codl_tvm.cost_model.dataset import SHARING_KINDS, OpRecord, SharingRecord
from codl_tvm.cost_model.features import (
    PROCESSORS,
    DispatchFeatures,
    OpFeatures,
    OpParams,
    Partition,
    op_features,
    part_shape,
    weight_bytes,
    weight_floor_ms,
)
from codl_tvm.cost_model.linalg import nnls

if TYPE_CHECKING:
    from codl_tvm.cost_model.measured import MeasuredModel

__all__ = [
    "GPU_DATA_TYPE_META",
    "IMAGE_CONVERSION_KINDS",
    "IMAGE_SHARING_KINDS",
    "MODEL_FORMAT",
    "MODEL_KINDS",
    "MODEL_SHARING_KINDS",
    "MODEL_VERSION",
    "CoexecLatency",
    "CostModel",
    "CostModelFallbackWarning",
    "ModelFileError",
    "SharingModel",
    "finite_number",
    "load_model",
    "records_by_kernel",
    "shared_nbytes",
]

MODEL_FORMAT = "codl-tvm-cost-model"
MODEL_VERSION = 1
# kind -> "module:Class", resolved lazily (gbdt needs xgboost only when used).
MODEL_KINDS: dict[str, str] = {
    "codl": "codl_tvm.cost_model.analytical:CodlModel",
    "gbdt": "codl_tvm.cost_model.gbdt:GbdtModel",
    "flops": "codl_tvm.cost_model.flops:FlopsModel",
    "measured": "codl_tvm.cost_model.measured:MeasuredModel",
}


class CostModelFallbackWarning(UserWarning):
    """An operator the model does not cover was predicted with the FLOPs-linear fallback."""


def _model_class(kind: str) -> type[CostModel]:
    module, _, name = MODEL_KINDS[kind].partition(":")
    return getattr(import_module(module), name)


def finite_number(obj: Mapping, key: str) -> float:
    """``obj[key]`` as a float; ValueError unless it is a finite number (not a bool). Model
    files' numbers are read through it."""
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{key!r} must be a finite number, got {v!r}")
    return float(v)


# ---------------------------------------------------------------------------------------------
# Data-sharing costs (CoDL section 5.1).


#: The key of a cost model's ``meta`` where ``codl-tvm profile --data-type`` records the GPU
#: data type it measured and the image conversions' fit
#: (:data:`codl_tvm.profiling.data_type.META_KEY`).
GPU_DATA_TYPE_META = "gpu_data_type"

#: The image conversions of CoDL's hybrid data type, by direction, as sharing kinds: ``pack``
#: (an NCHW float32 buffer to an NCHW4c image, where a GPU part on images starts) and
#: ``unpack`` (back, where it ends); linear in the buffer's bytes. Measured by
#: ``codl-tvm profile --data-type`` (the record's ``"conversion"``), not by the sharing
#: profiler: :meth:`SharingModel.with_conversion` adds them to a model.
IMAGE_CONVERSION_KINDS: dict[str, str] = {"pack": "image_pack", "unpack": "image_unpack"}
IMAGE_SHARING_KINDS: tuple[str, ...] = tuple(IMAGE_CONVERSION_KINDS.values())

#: Every kind a :class:`SharingModel` predicts: the dataset's and the image conversions.
MODEL_SHARING_KINDS: tuple[str, ...] = (*SHARING_KINDS, *IMAGE_SHARING_KINDS)


@dataclass(frozen=True)
class _Linear:
    intercept_ms: float
    ms_per_byte: float
    n: int

    def __call__(self, nbytes: float) -> float:
        return self.intercept_ms + self.ms_per_byte * nbytes


def _fit_line(nbytes: Sequence[float], latency_ms: np.ndarray) -> _Linear:
    """``latency_ms ~ intercept + slope * nbytes``, non-negative (one sample: a constant)."""
    x = np.array(nbytes, dtype=np.float64)
    a = np.stack([np.ones_like(x), x], axis=1)
    coef = nnls(a, latency_ms) if len(x) > 1 else np.array([latency_ms[0], 0.0])
    return _Linear(float(coef[0]), float(coef[1]), len(x))


class SharingModel:
    """Data-sharing latency per kind: linear in bytes (transform, map, unmap, and the image
    conversions of :data:`IMAGE_SHARING_KINDS`) or a constant upper bound (pre-sync, post-sync:
    no pattern in bytes, CoDL Fig. 14b).

    Coefficients are non-negative (non-negative least squares).
    """

    CONSTANT_KINDS: ClassVar[tuple[str, ...]] = ("presync", "postsync")

    def __init__(
        self, linear: dict[str, _Linear] | None = None, constant_ms: dict[str, float] | None = None
    ) -> None:
        self.linear = dict(linear or {})
        self.constant_ms = dict(constant_ms or {})

    @classmethod
    def fit(cls, records: Iterable[SharingRecord], presync_quantile: float = 1.0) -> SharingModel:
        """Fit every kind present; ``presync_quantile`` picks the constant (1.0 = the measured
        upper bound, as CoDL does)."""
        by_kind: dict[str, list[SharingRecord]] = {}
        for r in records:
            by_kind.setdefault(r.kind, []).append(r)
        linear, constant = {}, {}
        for kind, recs in by_kind.items():
            y = np.array([r.latency_ms for r in recs])
            if kind in cls.CONSTANT_KINDS:
                constant[kind] = float(np.quantile(y, presync_quantile))
                continue
            linear[kind] = _fit_line([r.nbytes for r in recs], y)
        return cls(linear, constant)

    @classmethod
    def fit_samples(cls, samples: Mapping[str, Sequence[tuple[float, float]]]) -> SharingModel:
        """Fit linear kinds from ``kind -> [(nbytes, latency_ms), ...]`` (the image
        conversions, which no dataset record holds), as :meth:`fit` fits a linear kind:
        non-negative least squares, one sample giving a constant.

        Raises
        ------
        ValueError
            A kind that is not linear, or one without samples.
        """
        linear = {}
        for kind, pairs in samples.items():
            if kind not in MODEL_SHARING_KINDS or kind in cls.CONSTANT_KINDS or not pairs:
                raise ValueError(f"fit_samples: {kind!r} needs samples of a linear sharing kind")
            linear[kind] = _fit_line([b for b, _ in pairs], np.array([ms for _, ms in pairs]))
        return cls(linear)

    def with_conversion(self, conversion: Mapping[str, Mapping]) -> SharingModel:
        """A copy with the image conversions of ``conversion`` (a data-type record's
        ``"conversion"``: ``{"pack": {"intercept_ms", "ms_per_byte", "n"}, "unpack": ...}``,
        :data:`IMAGE_CONVERSION_KINDS`) as linear kinds; other keys are ignored.

        Raises
        ------
        ValueError
            A direction's fit is not finite numbers.
        """
        linear = dict(self.linear)
        for direction, kind in IMAGE_CONVERSION_KINDS.items():
            fit = conversion.get(direction)
            if fit is not None:
                linear[kind] = _Linear(
                    finite_number(fit, "intercept_ms"),
                    finite_number(fit, "ms_per_byte"),
                    int(fit["n"]),
                )
        return SharingModel(linear, self.constant_ms)

    def predict(self, kind: str, nbytes: float) -> float:
        """Latency in ms of one ``kind`` step sharing ``nbytes`` (0 where never measured)."""
        if kind not in MODEL_SHARING_KINDS:
            raise ValueError(f"sharing kind {kind!r} is not one of {MODEL_SHARING_KINDS}")
        if kind in self.constant_ms:
            return self.constant_ms[kind]
        if kind in self.linear:
            return self.linear[kind](nbytes)
        return 0.0

    def to_json(self) -> dict:
        return {
            "linear": {
                k: {"intercept_ms": v.intercept_ms, "ms_per_byte": v.ms_per_byte, "n": v.n}
                for k, v in sorted(self.linear.items())
            },
            "constant_ms": dict(sorted(self.constant_ms.items())),
        }

    @classmethod
    def from_json(cls, obj: dict) -> SharingModel:
        linear = {
            k: _Linear(
                finite_number(v, "intercept_ms"), finite_number(v, "ms_per_byte"), int(v["n"])
            )
            for k, v in obj["linear"].items()
        }
        for k in (*linear, *obj["constant_ms"]):
            if k not in MODEL_SHARING_KINDS:
                raise ValueError(f"unknown sharing kind {k!r}")
        return cls(linear, {k: finite_number(obj["constant_ms"], k) for k in obj["constant_ms"]})


def shared_nbytes(params: OpParams, partition: Partition, dtype_bytes: int = 4) -> int:
    """Bytes shared between the processors for one co-executed operator: the CPU part's input
    (its rows plus halo for H, all of it for OC) and its output part."""
    cpu = part_shape(params, partition, "cpu")
    if cpu.empty:
        return 0
    return dtype_bytes * (cpu.in_h * cpu.in_w * cpu.ic + cpu.out_h * cpu.out_w * cpu.oc)


@dataclass(frozen=True)
class CoexecLatency:
    """Eq. 2 terms of one co-executed operator (ms)."""

    total_ms: float
    cpu_ms: float
    gpu_ms: float
    transform_ms: float = 0.0
    map_ms: float = 0.0
    presync_ms: float = 0.0
    shared_nbytes: int = 0


# ---------------------------------------------------------------------------------------------
# The interface.


def records_by_kernel(records: Iterable[OpRecord]) -> dict[tuple[str, str, str], list[OpRecord]]:
    """``records`` grouped by kernel: ``(op, processor, impl)``, the unit a model fits one
    predictor to."""
    groups: dict[tuple[str, str, str], list[OpRecord]] = {}
    for r in records:
        groups.setdefault((r.op, r.processor, r.impl), []).append(r)
    return groups


def _per_processor(method: str, what: str, cpu: float, gpu: float) -> dict[str, float]:
    """``{"cpu": cpu, "gpu": gpu}`` as floats; ValueError naming ``method`` and the processor
    for a value that is not a positive finite number."""
    for name, value in (("cpu", cpu), ("gpu", gpu)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(
                f"{method}: the {name} {what} must be a positive number, got {value!r}"
            )
    return {"cpu": float(cpu), "gpu": float(gpu)}


class CostModel(ABC):
    """Predicts the latency of one operator part on one processor (see the module docstring).

    Subclasses implement ``_fit_ops``, ``covers``, ``_predict_covered``, :meth:`body_json` and
    :meth:`load_body`; fallback, sharing costs, Eq. 2 and the file format live here.
    """

    kind: ClassVar[str]

    def __init__(self) -> None:
        self.fallback: CostModel | None = None
        self.sharing: SharingModel | None = None
        self.meta: dict = {}
        self.presync_quantile = 1.0
        #: Factors on the predicted compute latency of each processor (:meth:`scaled`).
        self.processor_scale: dict[str, float] = {}
        #: Weight-streaming rate of each processor inside a model, GB/s (:meth:`streaming`).
        self.weight_gbps: dict[str, float] = {}
        #: Operators measured on the target, predicted by their measurements
        #: (:meth:`with_measurements`).
        self.measured_parts: MeasuredModel | None = None

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, records: Iterable) -> CostModel:
        """Fit on dataset records; returns ``self``."""
        records = list(records)
        ops = [r for r in records if isinstance(r, OpRecord)]
        shares = [r for r in records if isinstance(r, SharingRecord)]
        if not ops:
            raise ValueError(f"{self.kind} cost model: no operator records to fit")
        self._fit_ops(ops)
        if self.kind != "flops":
            self.fallback = _model_class("flops")().fit(ops)
        self.sharing = SharingModel.fit(shares, self.presync_quantile) if shares else None
        self.meta["n_train"] = len(ops)
        self.meta["n_train_sharing"] = len(shares)
        return self

    @abstractmethod
    def _fit_ops(self, records: list[OpRecord]) -> None: ...

    # -- prediction ----------------------------------------------------------------------------
    @abstractmethod
    def covers(self, features: OpFeatures) -> bool:
        """Whether the model has a sub-model for this operator kind/processor/implementation."""

    @abstractmethod
    def _predict_covered(self, features: Sequence[OpFeatures]) -> np.ndarray: ...

    def predict(self, features: OpFeatures) -> float:
        """Latency in ms of one part (falls back to FLOPs, with a warning, if not covered)."""
        return float(self.predict_many([features])[0])

    def predict_many(self, features: Sequence[OpFeatures]) -> np.ndarray:
        features = list(features)
        table = self.measured_parts
        if table is None:
            return self._predict_modelled(features)
        out = np.empty(len(features))
        mask = [table.holds_operator(f.params) for f in features]
        held = [i for i, ok in enumerate(mask) if ok]
        rest = [i for i, ok in enumerate(mask) if not ok]
        if held:
            out[held] = [table.measured_ms(features[i]) for i in held]
        if rest:
            out[rest] = self._predict_modelled([features[i] for i in rest])
        return out

    def _predict_modelled(self, features: list[OpFeatures]) -> np.ndarray:
        """:meth:`predict_many` by the model itself (its fallback, scales and floors)."""
        out = np.empty(len(features))
        mask = [self.covers(f) for f in features]
        covered = [i for i, ok in enumerate(mask) if ok]
        missing = [i for i, ok in enumerate(mask) if not ok]
        if covered:
            out[covered] = self._predict_covered([features[i] for i in covered])
        if missing:
            if self.fallback is None:
                raise ValueError(
                    f"{self.kind} cost model covers no sub-model for "
                    f"{features[missing[0]].describe()} and has no fallback"
                )
            for i in missing:
                warnings.warn(
                    CostModelFallbackWarning(
                        f"{self.kind} cost model has no sub-model for operator "
                        f"{features[i].describe()}; predicting it with the FLOPs-linear fallback"
                    ),
                    stacklevel=3,
                )
            out[missing] = self.fallback.predict_many([features[i] for i in missing])
        if self.processor_scale:
            out *= [self.processor_scale.get(f.processor, 1.0) for f in features]
        if self.weight_gbps:
            # No part runs faster than its weights stream from memory inside a model; the
            # profiler repeated each part alone, with its weights cached.
            for i, f in enumerate(features):
                rate = self.weight_gbps.get(f.processor)
                if rate:
                    nbytes = weight_bytes(f.op, f.part, f.params.kernel)
                    out[i] = max(out[i], weight_floor_ms(nbytes, rate))
        return out

    def scaled(self, cpu: float = 1.0, gpu: float = 1.0) -> CostModel:
        """This model with each processor's predicted compute latencies multiplied by a factor
        (sharing costs unchanged): a calibration of per-operator predictions to what a whole
        model measured on each processor alone (``compile --verify``). A shallow copy; ``self``
        is unchanged. The factors are a planning-time setting: :meth:`save` does not write
        them."""
        model = copy.copy(self)
        model.processor_scale = _per_processor("scaled", "factor", cpu, gpu)
        return model

    def streaming(self, cpu_gbps: float, gpu_gbps: float) -> CostModel:
        """This model with a floor on every part's predicted latency (an operator run whole
        included): the bytes of the part's weights (float32) over its processor's
        weight-streaming rate inside a model (GB/s).

        The profiler times each part alone and repeats it, so a part's weights stay cached;
        inside a model, each batch-1 dense reads its weights from memory, and in a split the
        other processor streams its own part's at the same time. Timelines of split parts
        measure the rates (``scripts/plan_vs_timeline.py`` reports them), so for an operator
        run whole, with the other processor idle, the floor errs on the slow side. A shallow
        copy and a planning-time setting, as :meth:`scaled`."""
        model = copy.copy(self)
        model.weight_gbps = _per_processor("streaming", "rate (GB/s)", cpu_gbps, gpu_gbps)
        return model

    def with_measurements(self, table: MeasuredModel) -> CostModel:
        """This model with the operators ``table`` holds whole on both processors
        (:meth:`~codl_tvm.cost_model.measured.MeasuredModel.holds_operator`: operators measured
        on the target, ``compile --tune``) predicted by their measurements alone, unscaled and
        unfloored; a part of them not measured (another share, a chain's part with its halo)
        is predicted infinitely slow, so the planner chooses only among what was measured.
        Sharing costs stay the model's. A shallow copy and a planning-time setting, as
        :meth:`scaled`."""
        model = copy.copy(self)
        model.measured_parts = table
        return model

    def predict_sharing(self, kind: str, nbytes: float) -> float:
        """Data-sharing latency in ms (0 for a kind that was never measured)."""
        return 0.0 if self.sharing is None else self.sharing.predict(kind, nbytes)

    def predict_coexec(
        self,
        params: OpParams,
        partition: Partition,
        impl: Mapping[str, str] | str,
        chained: bool = False,
        dispatch: Mapping[str, DispatchFeatures] | None = None,
        name: str | None = None,
        dtype_bytes: int = 4,
    ) -> CoexecLatency:
        """CoDL Eq. 2 for one operator under ``partition`` (see the module docstring).

        ``impl`` is the implementation per processor (or one name for both); ``dispatch`` the
        dispatch features per processor where known.
        """
        return self.predict_coexec_many(
            params, [partition], impl, chained, dispatch, name, dtype_bytes
        )[0]

    def predict_coexec_many(
        self,
        params: OpParams,
        partitions: Sequence[Partition],
        impl: Mapping[str, str] | str,
        chained: bool = False,
        dispatch: Mapping[str, DispatchFeatures] | None = None,
        name: str | None = None,
        dtype_bytes: int = 4,
    ) -> list[CoexecLatency]:
        """:meth:`predict_coexec` for several partitions of one operator, with one
        :meth:`predict_many` call for all their parts (the planner tries every dimension and
        ratio of an operator; one model call per part dominated planning time)."""
        impls = {p: impl for p in PROCESSORS} if isinstance(impl, str) else dict(impl)
        dispatch = dispatch or {}
        feats: list[OpFeatures] = []
        slots: list[tuple[int, str]] = []
        for k, partition in enumerate(partitions):
            for proc in PROCESSORS:
                if partition.dim == "none":
                    runs = (partition.ratio >= 1.0) == (proc == "gpu")
                else:
                    runs = (partition.ratio > 0.0) if proc == "gpu" else (partition.ratio < 1.0)
                if not runs:
                    continue
                if proc not in impls:
                    raise ValueError(f"{params.describe()}: no implementation given for {proc}")
                f = op_features(params, proc, impls[proc], partition, dispatch.get(proc), name=name)
                if not f.part.empty:
                    feats.append(f)
                    slots.append((k, proc))
        times = [dict.fromkeys(PROCESSORS, 0.0) for _ in partitions]
        if feats:
            for (k, proc), ms in zip(slots, self.predict_many(feats), strict=True):
                times[k][proc] = float(ms)
        return [
            self._eq2(params, partition, t, chained, dtype_bytes)
            for partition, t in zip(partitions, times, strict=True)
        ]

    def _eq2(
        self,
        params: OpParams,
        partition: Partition,
        times: Mapping[str, float],
        chained: bool,
        dtype_bytes: int,
    ) -> CoexecLatency:
        """Eq. 2 from the parts' predicted times: sharing costs (not inside a chain) plus the
        slower processor."""
        both = times["cpu"] > 0.0 and times["gpu"] > 0.0
        trans = mapping = presync = 0.0
        nbytes = 0
        if both and not chained:
            nbytes = shared_nbytes(params, partition, dtype_bytes)
            if self.sharing is None:
                warnings.warn(
                    f"{self.kind} cost model has no data-sharing measurements; "
                    f"T_trans, T_map and T_psync of {params.describe()} are taken as 0",
                    stacklevel=3,
                )
            trans = self.predict_sharing("transform", nbytes)
            mapping = self.predict_sharing("map", nbytes)
            presync = self.predict_sharing("presync", nbytes)
        total = trans + mapping + presync + max(times["cpu"], times["gpu"])
        return CoexecLatency(total, times["cpu"], times["gpu"], trans, mapping, presync, nbytes)

    # -- files ---------------------------------------------------------------------------------
    @abstractmethod
    def body_json(self) -> dict:
        """The model's own part of its file (the ``"model"`` field), as JSON-able data."""

    @abstractmethod
    def load_body(self, body: dict) -> None:
        """Restore the model from what :meth:`body_json` wrote (a fresh instance's state)."""

    def to_json(self) -> dict:
        return {
            "format": MODEL_FORMAT,
            "version": MODEL_VERSION,
            "kind": self.kind,
            "meta": self.meta,
            "model": self.body_json(),
            "fallback": None if self.fallback is None else self.fallback.to_json(),
            "sharing": None if self.sharing is None else self.sharing.to_json(),
        }

    def dumps(self) -> str:
        """The model file's text (compact JSON; floats round-trip exactly)."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False)

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.dumps() + "\n", encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, obj: dict, source: str = "<model>") -> CostModel:
        """Build a model from its JSON dict (raises ``ModelFileError`` naming ``source``)."""
        if not isinstance(obj, dict) or obj.get("format") != MODEL_FORMAT:
            raise ModelFileError(
                f'{source}: not a codl-tvm cost model file (expected "format": "{MODEL_FORMAT}")'
            )
        version = obj.get("version")
        if version != MODEL_VERSION:
            raise ModelFileError(
                f"{source}: cost model format version {version!r} is not "
                f"supported (this codl-tvm reads version {MODEL_VERSION}); "
                "refit the model with `codl-tvm cost-model fit`"
            )
        kind = obj.get("kind")
        if kind not in MODEL_KINDS:
            raise ModelFileError(
                f"{source}: unknown cost model kind {kind!r} (known: {sorted(MODEL_KINDS)})"
            )
        klass = _model_class(kind)
        if cls is not CostModel and not issubclass(klass, cls):
            raise ModelFileError(f"{source}: holds a {kind!r} model, not a {cls.kind!r} model")
        model = klass()
        try:
            model.meta = dict(obj.get("meta") or {})
            model.load_body(obj["model"])
            if obj.get("fallback") is not None:
                model.fallback = CostModel.from_json(obj["fallback"], f"{source} (fallback)")
            if obj.get("sharing") is not None:
                model.sharing = SharingModel.from_json(obj["sharing"])
        except ModelFileError:
            raise
        except ImportError as exc:  # e.g. a GBDT model where xgboost is not installed
            raise ModelFileError(
                f"{source}: a {kind!r} cost model needs the {exc.name!r} package, which cannot "
                f"be imported ({exc}); install it (pip install {exc.name})"
            ) from None
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ModelFileError(f"{source}: corrupt {kind!r} cost model ({what})") from None
        return model

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        """Load a model file (``CostModel.load`` accepts any kind; a subclass only its own)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ModelFileError(f"{path}: no such cost model file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"{path}: cannot read the cost model file ({exc})") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ModelFileError(
                f"{path}: corrupt cost model file, not valid JSON ({exc.msg} at "
                f"line {exc.lineno} column {exc.colno})"
            ) from None
        return cls.from_json(obj, str(path))


def load_model(path: str | os.PathLike) -> CostModel:
    """Load a cost model file of any kind."""
    return CostModel.load(path)
