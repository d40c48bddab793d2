"""The full accuracy assessment ``codl-tvm cost-model eval`` prints.

A random held-out split puts near-identical parts of one operator (the same layer at ratio 0.4
and 0.5) on both sides, so it measures interpolation. The assessment therefore scores a model
two ways:

- **random split**: the model's own held-out part (``meta["holdout"]``, ``meta["seed"]``); a
  model fitted on every record (``holdout`` 0, the shipped ones) is refitted with its recipe on
  a 70/30 split (seed 0) for this score, and the report says so;
- **leave-one-model-out**: for every benchmark model named in the records (``OpRecord.name`` is
  ``"MODEL/OPERATOR"``), the recipe is refitted on every record but that model's (sampled
  shapes without a name included) and predicts that model's parts.

Each score is broken down per processor, per kernel implementation (operator, processor,
implementation), per latency band of the measurement (:data:`LATENCY_BANDS`: launch-bound parts
below 0.1 ms, 0.1-1 ms, above 1 ms) and, on the GPU, per dispatch shape (work-groups per compute
unit, :data:`WAVE_BANDS`, and work-group size, :data:`WG_SIZE_BANDS`), with CoDL's analytical model
(:class:`~codl_tvm.cost_model.analytical.CodlModel`, the dataset's preset) and the FLOPs-linear
baseline fitted on the same training records beside it, and with the campaign's own repeatability
ceiling: the share of ordered pairs of repeated measurements of one identical part
(``evaluate.part_identity``) within +-10% of each other, the best any model can score against single
measurements of that slice (``None`` where the dataset repeats no part of it), and the data's
smoothness (:func:`smoothness`): how often a part is within +-10% of the interpolation between its
operator's neighbouring parts, what a model of the part's size alone can reach.

Operators whose kernel (operator, processor, implementation) the model has no sub-model for are
predicted by its FLOPs fallback; the report counts them and names the kernels.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel, infer_preset
from codl_tvm.cost_model.base import CostModel, CostModelFallbackWarning
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.evaluate import Accuracy, accuracy, part_identity, training_split
from codl_tvm.cost_model.flops import FlopsModel
from codl_tvm.cost_model.gbdt import GbdtModel

__all__ = [
    "LATENCY_BANDS",
    "WAVE_BANDS",
    "WG_SIZE_BANDS",
    "Assessment",
    "SliceScore",
    "assess",
    "band_of",
    "dispatch_labels",
    "format_assessment",
    "model_of",
    "refit_like",
    "repeatability",
    "slice_labels",
    "smoothness",
    "uncovered_kernels",
]

#: (label, lower bound, upper bound) in ms of the measured latency; the lower bound is inclusive.
LATENCY_BANDS: tuple[tuple[str, float, float], ...] = (
    ("<0.1ms", 0.0, 0.1),
    ("0.1-1ms", 0.1, 1.0),
    (">1ms", 1.0, math.inf),
)

#: (label, lower bound, upper bound) of a GPU part's work-groups per compute unit (an NVIDIA SM):
#: below one wave the GPU is not full; the lower bound is inclusive.
WAVE_BANDS: tuple[tuple[str, float, float], ...] = (
    ("wg/CU<1", 0.0, 1.0),
    ("wg/CU 1-4", 1.0, 4.0),
    ("wg/CU 4-16", 4.0, 16.0),
    ("wg/CU>=16", 16.0, math.inf),
)

#: (label, lower bound, upper bound) of a GPU part's work-group size (work-items); the upper
#: bound is inclusive.
WG_SIZE_BANDS: tuple[tuple[str, float, float], ...] = (
    ("wg<=64", 0.0, 64.0),
    ("wg 65-128", 64.0, 128.0),
    ("wg>128", 128.0, math.inf),
)

#: The scorers beside the assessed model: CoDL's analytical model and the FLOPs baseline.
REFERENCES: tuple[str, ...] = ("codl", "flops")


def band_of(latency_ms: float) -> str:
    """The :data:`LATENCY_BANDS` label of a measured latency."""
    for label, lo, hi in LATENCY_BANDS:
        if lo <= latency_ms < hi:
            return label
    raise ValueError(f"latency {latency_ms!r} ms is in no band")


def model_of(record: OpRecord) -> str | None:
    """The benchmark model a record's part belongs to (``name`` = ``"MODEL/OPERATOR"``), None
    for sampled shapes."""
    if record.name and "/" in record.name:
        return record.name.split("/", 1)[0]
    return None


def dispatch_labels(r: OpRecord) -> list[str]:
    """The dispatch-shape slices of a GPU record with known work-groups: its
    :data:`WAVE_BANDS` label (work-groups over the device's ``compute_units``; 1 where the
    device description does not say) and its :data:`WG_SIZE_BANDS` label; none otherwise."""
    d = r.dispatch
    if r.processor != "gpu" or not d.wg_size or not d.wg_count:
        return []
    cu = dict(r.device).get("compute_units")
    cu = cu if isinstance(cu, int) and not isinstance(cu, bool) and cu > 0 else 1
    per_cu = d.wg_count / cu
    wave = next(label for label, lo, hi in WAVE_BANDS if lo <= per_cu < hi)
    size = next(label for label, lo, hi in WG_SIZE_BANDS if lo < d.wg_size <= hi)
    return [f"gpu {wave}", f"gpu {size}"]


def slice_labels(r: OpRecord) -> list[str]:
    """The report slices a record falls in: ``overall``, its processor, its processor's
    latency band, its dispatch shape (GPU: :func:`dispatch_labels`) and its kernel
    implementation ``op/processor/impl``."""
    return [
        "overall",
        r.processor,
        f"{r.processor} {band_of(r.latency_ms)}",
        *dispatch_labels(r),
        f"{r.op}/{r.processor}/{r.impl}",
    ]


def refit_like(model: CostModel, records: Iterable) -> CostModel:
    """A fresh model of ``model``'s kind and configuration fitted on ``records`` (its recipe,
    for held-out folds)."""
    if isinstance(model, GbdtModel):
        fresh: CostModel = GbdtModel(model.config, model.kernel_reader)
    elif isinstance(model, CodlModel):
        fresh = CodlModel(model.config)
    elif isinstance(model, FlopsModel):
        fresh = FlopsModel()
    else:
        raise ValueError(
            f"a {model.kind!r} model cannot be refitted on held-out folds (a lookup table "
            "predicts only what it measured)"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small groups fall back; the report counts them
        return fresh.fit(records)


def _reference(kind: str, train: list, preset: str) -> CostModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "codl":
            return CodlModel(preset).fit(train)
        return FlopsModel().fit(train)


def _predict(model: CostModel, records: Sequence[OpRecord]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostModelFallbackWarning)
        return np.asarray(model.predict_many([r.features() for r in records]), dtype=np.float64)


def repeatability(records: Iterable) -> dict[str, dict[str, float]]:
    """The campaign's repeatability ceiling per report slice (:func:`slice_labels`): over every
    ordered pair of records of one identical part (``part_identity``), the share within +-10%
    of each other (``acc10``), with the number of ``pairs`` and of repeated ``parts``. A slice
    whose parts were never measured twice is absent."""
    groups: dict[tuple, list[OpRecord]] = {}
    for r in records:
        if isinstance(r, OpRecord):
            groups.setdefault(part_identity(r), []).append(r)
    pairs: dict[str, tuple[list[float], list[float], set]] = {}
    for key, recs in groups.items():
        if len(recs) < 2:
            continue
        for a in recs:
            for b in recs:
                if a is b:
                    continue
                for label in slice_labels(a):
                    pred, meas, parts = pairs.setdefault(label, ([], [], set()))
                    pred.append(b.latency_ms)
                    meas.append(a.latency_ms)
                    parts.add(key)
    out = {}
    for label, (pred, meas, parts) in pairs.items():
        acc = accuracy(pred, meas)
        out[label] = {"acc10": acc.acc10, "mape": acc.mape, "pairs": acc.n, "parts": len(parts)}
    return out


def smoothness(records: Iterable) -> dict[str, dict[str, float]]:
    """How smooth the measurements are in the part's size, per report slice: for every part
    with a smaller and a larger part of the same operator, processor, implementation and
    partition dimension, the log-log interpolation in FLOPs between those two neighbours is
    taken as its prediction; ``acc10`` is the share within +-10%. A model that sees only the
    part's shape cannot beat this much on parts between measured neighbours: where it is low,
    latency depends on more than the size (the kernel's tiling, launch jitter)."""
    groups: dict[tuple, list[OpRecord]] = {}
    for r in records:
        if isinstance(r, OpRecord):
            key = (r.params, r.processor, r.impl, r.partition.dim, json_device(r))
            groups.setdefault(key, []).append(r)
    hits: dict[str, list[bool]] = {}
    for recs in groups.values():
        pts = sorted(((math.log(r.features().flops), r) for r in recs), key=lambda t: t[0])
        for (fa, a), (fb, b), (fc, c) in zip(pts, pts[1:], pts[2:]):
            if not fa < fb < fc:
                continue
            t = (fb - fa) / (fc - fa)
            est = math.exp((1 - t) * math.log(a.latency_ms) + t * math.log(c.latency_ms))
            for label in slice_labels(b):
                hits.setdefault(label, []).append(abs(est / b.latency_ms - 1.0) <= 0.10 + 1e-12)
    return {k: {"acc10": float(np.mean(v)), "parts": len(v)} for k, v in hits.items()}


def json_device(r: OpRecord) -> str:
    """A record's device description as a canonical string (a grouping key)."""
    return json.dumps(dict(r.device), sort_keys=True)


def uncovered_kernels(model: CostModel, records: Iterable) -> dict[str, int]:
    """Kernels (``op/processor/impl``) of ``records`` the model has no sub-model for, with how
    many records each (they are predicted by the FLOPs fallback)."""
    out: dict[str, int] = {}
    for r in records:
        if isinstance(r, OpRecord) and not model.covers(r.features()):
            label = f"{r.op}/{r.processor}/{r.impl}"
            out[label] = out.get(label, 0) + 1
    return dict(sorted(out.items()))


@dataclass
class SliceScore:
    """Scores of the model and the references on one slice of the records."""

    n: int
    model: Accuracy
    references: dict[str, Accuracy]
    ceiling_acc10: float | None = None
    ceiling_pairs: int = 0
    smooth_acc10: float | None = None

    def to_json(self) -> dict:
        return {
            "n": self.n,
            "model": {"acc10": self.model.acc10, "mape": self.model.mape},
            **{k: {"acc10": a.acc10, "mape": a.mape} for k, a in self.references.items()},
            "ceiling_acc10": self.ceiling_acc10,
            "ceiling_pairs": self.ceiling_pairs,
            "smooth_acc10": self.smooth_acc10,
        }


@dataclass
class _Predictions:
    """Measured and predicted latencies of a set of records, by scorer."""

    records: list[OpRecord] = field(default_factory=list)
    by: dict[str, list[float]] = field(default_factory=dict)

    def add(self, records: Sequence[OpRecord], preds: dict[str, np.ndarray]) -> None:
        self.records.extend(records)
        for k, v in preds.items():
            self.by.setdefault(k, []).extend(float(x) for x in v)

    def slices(
        self, ceiling: dict[str, dict], smooth: dict[str, dict] | None = None
    ) -> dict[str, SliceScore]:
        labels = [slice_labels(r) for r in self.records]
        meas = np.array([r.latency_ms for r in self.records])
        names = sorted({x for ls in labels for x in ls}, key=_slice_order)
        out = {}
        for name in names:
            sel = np.array([name in ls for ls in labels])
            scores = {k: accuracy(np.array(v)[sel], meas[sel]) for k, v in self.by.items()}
            ceil = ceiling.get(name)
            out[name] = SliceScore(
                int(sel.sum()),
                scores["model"],
                {k: scores[k] for k in REFERENCES if k in scores},
                None if ceil is None else ceil["acc10"],
                0 if ceil is None else ceil["pairs"],
                (smooth or {}).get(name, {}).get("acc10"),
            )
        return out


def _slice_order(label: str) -> tuple:
    bands = [b[0] for b in LATENCY_BANDS]
    if label == "overall":
        return (0, "", 0)
    proc, _, band = label.partition(" ")
    if "/" in label and " " not in label:
        return (3, label, 0)
    if band in bands or not band:
        return (1, proc, 1 + bands.index(band) if band else 0)
    shapes = [b[0] for b in WAVE_BANDS + WG_SIZE_BANDS]
    return (2, proc, shapes.index(band))


@dataclass
class Assessment:
    """What :func:`assess` found (see the module docstring)."""

    kind: str
    model_bytes: int
    split: str
    random: dict[str, SliceScore]
    lomo: dict[str, SliceScore]
    lomo_models: dict[str, dict[str, SliceScore]]
    unseen: dict[str, int]
    unseen_examples: list[str]

    def to_json(self) -> dict:
        def table(slices: dict[str, SliceScore]) -> dict:
            return {k: v.to_json() for k, v in slices.items()}

        return {
            "kind": self.kind,
            "model_bytes": self.model_bytes,
            "random_split": {"how": self.split, "slices": table(self.random)},
            "leave_one_model_out": {
                "pooled": table(self.lomo),
                "models": {m: table(s) for m, s in self.lomo_models.items()},
            },
            "unseen": {"records": sum(self.unseen.values()), "kernels": self.unseen},
            "unseen_examples": self.unseen_examples,
        }


def _fold_predictions(
    model_like: Callable[[list], CostModel],
    train: list,
    test: list[OpRecord],
    preset: str,
) -> dict[str, np.ndarray]:
    out = {"model": _predict(model_like(train), test)}
    for kind in REFERENCES:
        out[kind] = _predict(_reference(kind, train, preset), test)
    return out


def assess(
    model: CostModel,
    records: Sequence,
    source: str = "the dataset",
    lomo: bool = True,
) -> Assessment:
    """Score ``model`` on ``records`` (its dataset) by random split and leave-one-model-out
    (see the module docstring). ``source`` names the data in the report."""
    records = list(records)
    ops = [r for r in records if isinstance(r, OpRecord)]
    if not ops:
        raise ValueError("no operator records to evaluate on")
    holdout = float(model.meta.get("holdout", 0.0))
    seed = int(model.meta.get("seed", 0))
    drop = float(model.meta.get("drop_inconsistent", 3.0))
    preset = infer_preset(records)
    ceiling = repeatability(records)
    smooth = smoothness(records)

    if holdout > 0:
        train, test, _ = training_split(records, holdout, seed, drop)
        split = f"held-out {holdout:.0%} of {source} (seed {seed})"

        def fitted(_train: list) -> CostModel:
            return model

    else:
        train, test, _ = training_split(records, 0.3, 0, drop)
        split = (
            f"held-out 30% of {source} (seed 0), the model's recipe refitted on the other 70% "
            "(the model itself saw every record)"
        )

        def fitted(tr: list) -> CostModel:
            return refit_like(model, tr)

    test_ops = [r for r in test if isinstance(r, OpRecord)]
    random = _Predictions()
    if test_ops and any(isinstance(r, OpRecord) for r in train):
        random.add(test_ops, _fold_predictions(fitted, train, test_ops, preset))
    else:
        split += ": too few records for both sides, not scored"

    pooled = _Predictions()
    per_model: dict[str, dict[str, SliceScore]] = {}
    names = sorted({m for m in map(model_of, ops) if m is not None})
    if lomo and len(names) > 1 and model.kind != "measured":
        for name in names:
            held = [r for r in ops if model_of(r) == name]
            rest = [r for r in records if not (isinstance(r, OpRecord) and model_of(r) == name)]
            rest, _, _ = training_split(rest, 0.0, 0, drop)
            fold = _Predictions()
            fold.add(held, _fold_predictions(lambda tr: refit_like(model, tr), rest, held, preset))
            pooled.add(fold.records, fold.by)
            # per model: overall and per processor, without a ceiling (the campaign's pairs
            # are not this model's)
            per_model[name] = {
                k: v
                for k, v in fold.slices({}).items()
                if k == "overall" or ("/" not in k and " " not in k)
            }

    unseen = uncovered_kernels(model, ops)
    examples = []
    for r in ops:
        if len(examples) >= 5:
            break
        if f"{r.op}/{r.processor}/{r.impl}" in unseen:
            examples.append(r.features().describe())
    return Assessment(
        model.kind,
        len(model.dumps().encode()),
        split,
        random.slices(ceiling, smooth) if random.records else {},
        pooled.slices(ceiling, smooth) if pooled.records else {},
        per_model,
        unseen,
        examples,
    )


def _row(label: str, s: SliceScore) -> str:
    cells = [f"  {label:<28} {s.n:5d}  {100 * s.model.acc10:5.1f}% {s.model.mape:6.1f}%"]
    for k in REFERENCES:
        a = s.references.get(k)
        cells.append("" if a is None else f"  {100 * a.acc10:5.1f}% {a.mape:6.1f}%")
    cells.append("       -" if s.smooth_acc10 is None else f"  {100 * s.smooth_acc10:5.1f}%")
    if s.ceiling_acc10 is None:
        cells.append("        -")
    else:
        cells.append(f"  {100 * s.ceiling_acc10:5.1f}% ({s.ceiling_pairs} pairs)")
    return "".join(cells)


_HEADER = (
    f"  {'slice':<28} {'n':>5}  {'model':>6} {'MAPE':>7}  {'codl':>6} {'MAPE':>7}  "
    f"{'flops':>6} {'MAPE':>7}  {'smooth':>6}  ceiling"
)


def format_assessment(a: Assessment) -> str:
    """The assessment as text tables (model, CoDL's model, FLOPs, ceiling per slice)."""
    lines = [
        "accuracy (share within +-10% and MAPE) of the model, CoDL's analytical model and the "
        "FLOPs-linear baseline fitted on the same records; ceiling: repeated measurements of "
        "identical parts within +-10% of each other in this campaign; smooth: parts within "
        "+-10% of the log-log interpolation between their operator's neighbouring parts",
        f"random split: {a.split}",
        _HEADER,
    ]
    lines += [_row(k, v) for k, v in a.random.items()]
    if a.lomo:
        lines.append(
            f"leave-one-model-out ({len(a.lomo_models)} models; each predicted by the recipe "
            "fitted on every other record):"
        )
        lines.append(_HEADER)
        lines += [_row(k, v) for k, v in a.lomo.items()]
        lines.append("  per held-out model:")
        for name, slices in a.lomo_models.items():
            lines += [_row(f"{name} {k}", v) for k, v in slices.items()]
    else:
        lines.append(
            "leave-one-model-out: skipped (fewer than two benchmark models named in the "
            "records, a lookup-table model, or --no-lomo)"
        )
    if a.unseen:
        n = sum(a.unseen.values())
        which = ", ".join(f"{k} ({v})" for k, v in a.unseen.items())
        lines.append(
            f"{n} operator records are of kernels the model never saw and used its FLOPs "
            f"fallback: {which}; e.g. {a.unseen_examples[0]}"
        )
    return "\n".join(lines)
