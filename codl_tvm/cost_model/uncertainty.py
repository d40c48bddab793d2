"""What a cost model knows of its own error: leave-one-model-out error and the data's reach.

Two facts are stored in a model's ``meta`` (``codl-tvm cost-model lomo MODEL DATA --write``) and
read by the planner (:mod:`codl_tvm.planner.split.margin`):

- ``meta["lomo_error"]`` (:class:`LomoError`): for every benchmark model named in the records
  (``"MODEL/OPERATOR"``), the model's recipe refitted without that model's records
  (:func:`~codl_tvm.cost_model.assessment.refit_like`, the leave-one-model-out folds of
  ``cost-model eval``) predicts its parts; the relative errors ``|predicted / measured - 1|``
  are summarised by quantiles (:data:`QUANTILES`) per processor and role (``whole`` operators,
  ``split`` parts, ``all``) and per kernel (:func:`kernel_key`: operator class, processor,
  implementation) and role. It is the error a prediction for an operator of a model the cost
  model never saw should be expected to have.
- ``meta["data_ranges"]`` (:class:`DataRanges`): per operator class (:func:`op_class`: dense
  and grouped, depthwise or dilated convolutions are different classes), the range of every
  shape feature (:data:`RANGE_FEATURES`) of the records. An operator of a class the data never
  had, or with a feature outside its class's range, is *novel* (:meth:`DataRanges.novelty`):
  the trees extrapolate there, and the planner holds its splits to a larger margin.

:func:`split_margin` is the margin rule both the planner and ``cost-model decisions`` apply: a
split is chosen over the best whole-operator placement only when its predicted gain exceeds the
larger of the two predictions' expected errors.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from codl_tvm.cost_model.assessment import model_of, refit_like
from codl_tvm.cost_model.base import CostModel, CostModelFallbackWarning
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.evaluate import training_split
from codl_tvm.cost_model.features import PROCESSORS, OpParams, Partition

__all__ = [
    "MIN_KIND_SAMPLES",
    "QUANTILES",
    "RANGE_FEATURES",
    "DataRanges",
    "ErrorStats",
    "LomoError",
    "Margin",
    "compute_lomo_error",
    "kernel_key",
    "lomo_fold_errors",
    "op_class",
    "part_role",
    "relative_errors",
    "split_margin",
    "uncertainty_of",
]

log = logging.getLogger(__name__)

#: The quantiles of the relative error stored: the planner's margin for an operator inside the
#: data (0.8) and for a novel one (0.9).
QUANTILES: tuple[float, ...] = (0.8, 0.9)

#: Fewest held-out parts of a kernel for its own quantiles to be used; below, the processor's.
MIN_KIND_SAMPLES = 30

#: The operator's shape features whose fitted range is stored (:class:`DataRanges`).
RANGE_FEATURES: tuple[str, ...] = ("h", "w", "ic", "oc", "kernel", "stride")

ROLES: tuple[str, ...] = ("whole", "split", "all")


def op_class(params: OpParams) -> str:
    """The operator's class for novelty and error lookups: ``dense``, ``pool``, ``conv2d``
    (dense convolution), ``conv2d-depthwise``, ``conv2d-grouped`` or ``conv2d-dilated``; the
    kernels and their costs differ between them, so one class's data does not cover another."""
    if params.op != "conv2d":
        return params.op
    if params.groups > 1 and params.groups == params.ic == params.oc:
        return "conv2d-depthwise"
    if params.groups > 1:
        return "conv2d-grouped"
    if params.dilation > 1:
        return "conv2d-dilated"
    return "conv2d"


def kernel_key(params: OpParams, processor: str, impl: str) -> str:
    """``class/processor/impl``: the finest slice :class:`LomoError` keeps."""
    return f"{op_class(params)}/{processor}/{impl}"


def part_role(partition: Partition) -> str:
    """``whole`` for an operator run whole on one processor, ``split`` for a part of a split."""
    return "whole" if partition.dim == "none" else "split"


def _qkey(q: float) -> str:
    return f"p{round(100 * q):d}"


@dataclass(frozen=True)
class ErrorStats:
    """Quantiles of ``|predicted / measured - 1|`` over ``n`` held-out parts."""

    n: int
    quantiles: dict[str, float]

    @classmethod
    def of(cls, errors: Sequence[float], quantiles: Sequence[float]) -> ErrorStats:
        e = np.asarray(errors, dtype=np.float64)
        return cls(len(e), {_qkey(q): float(np.quantile(e, q)) for q in quantiles})

    def to_json(self) -> dict:
        return {"n": self.n, **self.quantiles}

    @classmethod
    def from_json(cls, obj: Mapping) -> ErrorStats:
        qs = {k: float(v) for k, v in obj.items() if k.startswith("p")}
        if any(not (math.isfinite(v) and v >= 0) for v in qs.values()):
            raise ValueError(f"error quantiles must be finite and >= 0, got {qs!r}")
        return cls(int(obj["n"]), qs)


@dataclass(frozen=True)
class LomoError:
    """Leave-one-model-out relative error of a cost model's recipe (module docstring).

    Attributes
    ----------
    quantiles
        The quantiles stored (each :class:`ErrorStats` has ``p80``, ``p90``, ...).
    processors
        ``processor -> role -> stats`` (roles ``whole``, ``split``, ``all``).
    by_kind
        ``class/processor/impl -> role -> stats`` (:func:`kernel_key`).
    models
        The benchmark models held out, one fold each.
    note
        How the folds were fitted, where not as the model (e.g. fewer trees).
    """

    quantiles: tuple[float, ...]
    processors: dict[str, dict[str, ErrorStats]]
    by_kind: dict[str, dict[str, ErrorStats]]
    models: tuple[str, ...]
    note: str = ""

    def error(
        self, params: OpParams, processor: str, impl: str, role: str, quantile: float
    ) -> tuple[float, str]:
        """The ``quantile`` of the relative error of a ``role`` part of ``params`` on
        ``processor`` with ``impl``, and where it comes from: the kernel's own slice where it
        has :data:`MIN_KIND_SAMPLES` held-out parts, else the processor's."""
        key = _qkey(quantile)
        if quantile not in self.quantiles:
            raise ValueError(
                f"quantile {quantile!r} is not stored (stored: {list(self.quantiles)}); "
                "recompute with `codl-tvm cost-model lomo`"
            )
        kind = kernel_key(params, processor, impl)
        stats = self.by_kind.get(kind, {}).get(role)
        if stats is not None and stats.n >= MIN_KIND_SAMPLES:
            return stats.quantiles[key], f"{kind} {role}"
        for r in (role, "all"):
            stats = self.processors.get(processor, {}).get(r)
            if stats is not None and stats.n:
                return stats.quantiles[key], f"{processor} {r}"
        return math.nan, "no held-out parts"

    def to_json(self) -> dict:
        out: dict = {
            "quantiles": list(self.quantiles),
            "models": list(self.models),
            **{
                p: {r: s.to_json() for r, s in roles.items()}
                for p, roles in self.processors.items()
            },
            "by_kind": {
                k: {r: s.to_json() for r, s in roles.items()} for k, roles in self.by_kind.items()
            },
        }
        if self.note:
            out["note"] = self.note
        return out

    @classmethod
    def from_json(cls, obj: Mapping) -> LomoError:
        def roles(d: Mapping) -> dict[str, ErrorStats]:
            return {r: ErrorStats.from_json(s) for r, s in d.items() if r in ROLES}

        return cls(
            tuple(float(q) for q in obj["quantiles"]),
            {p: roles(obj[p]) for p in PROCESSORS if p in obj},
            {k: roles(v) for k, v in obj.get("by_kind", {}).items()},
            tuple(obj.get("models", ())),
            str(obj.get("note", "")),
        )

    @classmethod
    def summarise(
        cls,
        records: Sequence[OpRecord],
        errors: Sequence[float],
        models: Sequence[str],
        quantiles: Sequence[float] = QUANTILES,
        note: str = "",
    ) -> LomoError:
        """The quantiles of ``errors`` (one per record of ``records``) per slice."""
        procs: dict[str, dict[str, list[float]]] = {}
        kinds: dict[str, dict[str, list[float]]] = {}
        for r, e in zip(records, errors, strict=True):
            if not math.isfinite(e):
                continue
            role = part_role(r.partition)
            for slot in (
                procs.setdefault(r.processor, {}),
                kinds.setdefault(kernel_key(r.params, r.processor, r.impl), {}),
            ):
                slot.setdefault(role, []).append(e)
                slot.setdefault("all", []).append(e)

        def stats(d: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, ErrorStats]]:
            return {
                k: {r: ErrorStats.of(v[r], quantiles) for r in ROLES if r in v}
                for k, v in sorted(d.items())
            }

        return cls(tuple(quantiles), stats(procs), stats(kinds), tuple(models), note)


def relative_errors(model: CostModel, records: Sequence[OpRecord]) -> np.ndarray:
    """``|predicted / measured - 1|`` of ``model`` on every record."""
    if not records:
        return np.zeros(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostModelFallbackWarning)  # the fallback's error counts
        pred = np.asarray(model.predict_many([r.features() for r in records]), dtype=np.float64)
    meas = np.array([r.latency_ms for r in records])
    return np.abs(pred / meas - 1.0)


def lomo_fold_errors(
    model: CostModel, records: Sequence
) -> dict[str, tuple[list[OpRecord], np.ndarray]]:
    """Per benchmark model: its records and their relative errors under the recipe refitted on
    every other record (inconsistent parts dropped as the model's ``drop_inconsistent`` says)."""
    records = list(records)
    drop = float(model.meta.get("drop_inconsistent", 3.0))
    ops = [r for r in records if isinstance(r, OpRecord)]
    out = {}
    for name in sorted({m for m in map(model_of, ops) if m is not None}):
        held = [r for r in ops if model_of(r) == name]
        rest = [r for r in records if not (isinstance(r, OpRecord) and model_of(r) == name)]
        rest, _, _ = training_split(rest, 0.0, 0, drop)
        log.info("leave-one-model-out: refitting without %s (%d records)", name, len(rest))
        out[name] = (held, relative_errors(refit_like(model, rest), held))
    return out


def compute_lomo_error(
    model: CostModel,
    records: Sequence,
    quantiles: Sequence[float] = QUANTILES,
    note: str = "",
) -> LomoError:
    """``model``'s :class:`LomoError` on ``records`` (its datasets), one refit per benchmark
    model. Raises ValueError where fewer than two benchmark models are named."""
    folds = lomo_fold_errors(model, records)
    if len(folds) < 2:
        raise ValueError(
            "leave-one-model-out needs records of at least two benchmark models (named "
            f"MODEL/OPERATOR), got {sorted(folds) or 'none'}"
        )
    held = [r for recs, _ in folds.values() for r in recs]
    errors = np.concatenate([e for _, e in folds.values()])
    return LomoError.summarise(held, errors, tuple(folds), quantiles, note)


@dataclass(frozen=True)
class DataRanges:
    """Per operator class (:func:`op_class`), the range of each of :data:`RANGE_FEATURES` in a
    cost model's records."""

    classes: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable) -> DataRanges:
        seen: dict[str, dict[str, list[int]]] = {}
        for r in records:
            if not isinstance(r, OpRecord):
                continue
            slot = seen.setdefault(op_class(r.params), {})
            for f in RANGE_FEATURES:
                v = getattr(r.params, f)
                lo_hi = slot.setdefault(f, [v, v])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], v), max(lo_hi[1], v)
        return cls(
            {c: {f: (lo, hi) for f, (lo, hi) in fs.items()} for c, fs in sorted(seen.items())}
        )

    def novelty(self, params: OpParams) -> list[str]:
        """Why ``params`` lies outside the data (empty where inside)."""
        cls_ = op_class(params)
        ranges = self.classes.get(cls_)
        if ranges is None:
            return [f"no {cls_} operator in the cost model's data"]
        out = []
        for f in RANGE_FEATURES:
            lo, hi = ranges.get(f, (None, None))
            v = getattr(params, f)
            if lo is not None and not lo <= v <= hi:
                out.append(f"{f}={v} outside the data's {lo}-{hi}")
        return out

    def to_json(self) -> dict:
        return {c: {f: list(v) for f, v in fs.items()} for c, fs in self.classes.items()}

    @classmethod
    def from_json(cls, obj: Mapping) -> DataRanges:
        return cls({c: {f: (int(v[0]), int(v[1])) for f, v in fs.items()} for c, fs in obj.items()})


def uncertainty_of(model: CostModel) -> tuple[LomoError | None, DataRanges | None]:
    """The :class:`LomoError` and :class:`DataRanges` stored in ``model.meta`` (None where
    absent). Raises ValueError for a corrupt entry."""
    meta = model.meta or {}
    lomo = meta.get("lomo_error")
    ranges = meta.get("data_ranges")
    try:
        return (
            None if lomo is None else LomoError.from_json(lomo),
            None if ranges is None else DataRanges.from_json(ranges),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"cost model meta: corrupt lomo_error or data_ranges ({exc})") from None


@dataclass(frozen=True)
class Margin:
    """The gain a split must predict to be chosen over the whole operator (:func:`split_margin`).

    ``margin_ms`` is NaN where the stored errors do not cover the operator (no margin applied).
    ``error`` is the relative error behind it, ``quantile`` the quantile it is, ``basis``
    which prediction and slice it was read from."""

    margin_ms: float
    error: float
    quantile: float
    basis: str

    def describe(self) -> str:
        return (
            f"margin {self.margin_ms:.3f} ms (LOMO error {100 * self.error:.0f}%, "
            f"{_qkey(self.quantile)} of {self.basis} parts)"
        )


def split_margin(
    lomo: LomoError,
    params: OpParams,
    impl: Mapping[str, str],
    whole_processor: str,
    whole_ms: float,
    split_ms: float,
    quantile: float,
) -> Margin:
    """The expected error of comparing a split (predicted ``split_ms``) with the operator whole
    on ``whole_processor`` (``whole_ms``): the larger of the whole prediction's error (its
    processor's ``whole`` parts) and the split's (the larger of the two processors' ``split``
    parts), each the ``quantile`` of its leave-one-model-out relative error times its predicted
    latency. Errors of the two predictions of one operator are partly shared (the same shape,
    the same trees), so their sum would overstate the comparison's error; the larger of the two
    is what either one alone may be off by."""
    e_whole, src_whole = lomo.error(
        params, whole_processor, impl[whole_processor], "whole", quantile
    )
    split_errs = [lomo.error(params, p, impl[p], "split", quantile) for p in PROCESSORS]
    split_errs = [t for t in split_errs if math.isfinite(t[0])] or [(math.nan, "")]
    e_split, src_split = max(split_errs, key=lambda t: t[0])
    candidates = [
        (e_whole * whole_ms, e_whole, src_whole),
        (e_split * split_ms, e_split, src_split),
    ]
    candidates = [c for c in candidates if math.isfinite(c[0])]
    if not candidates:
        return Margin(math.nan, math.nan, quantile, "no held-out parts of this kernel")
    ms, err, basis = max(candidates, key=lambda c: c[0])
    return Margin(ms, err, quantile, basis)
