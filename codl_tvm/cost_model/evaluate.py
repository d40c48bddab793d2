"""Fit and evaluate cost models (the library behind ``codl-tvm cost-model``).

Held-out split: a record is in the test part when a seeded hash of its key (``OpRecord.key``:
operator, shape, partition, processor, implementation, device) falls below the held-out fraction
(CoDL used 70/30). Membership depends on the record alone, so repeated measurements of one
configuration stay on one side, and appending to a dataset never moves a record from the test
part into the training part.

Metrics (CoDL Table 3/4, SVM paper Table 1): +-10% accuracy (share of predictions within 10% of
the measurement) and MAPE, overall, per processor and per (operator, processor,
implementation); model file size; prediction time per operator (``time.perf_counter``; reported,
never asserted). The FLOPs-linear baseline reported beside a model is the one embedded in it,
fitted on the same training part.

Commands (:mod:`codl_tvm.cli.cost_model`)::

    codl-tvm cost-model fit DATA.jsonl -o MODEL.json [--kind codl|gbdt|flops|measured]
        [--holdout 0.3] [--seed 0] [--preset NAME] [--trees N] [--drop-inconsistent 3]
    codl-tvm cost-model eval MODEL.json DATA.jsonl [--json] [--plot OUT.png] [--all]
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel, infer_preset
from codl_tvm.cost_model.base import CostModel, CostModelFallbackWarning
from codl_tvm.cost_model.dataset import (
    Dataset,
    DatasetError,
    OpRecord,
    SharingRecord,
    load_dataset,
)
from codl_tvm.cost_model.flops import FlopsModel
from codl_tvm.cost_model.gbdt import GbdtModel
from codl_tvm.cost_model.measured import MeasuredModel

__all__ = [
    "Accuracy",
    "EvalReport",
    "accuracy",
    "check_compatible",
    "drop_groups",
    "evaluate",
    "fit_model",
    "format_report",
    "inconsistent_records",
    "infer_preset",
    "load_datasets",
    "noise_floor",
    "part_identity",
    "plot_scatter",
    "split_records",
    "training_split",
]


def _in_test(key: str, holdout: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < holdout


def split_records(records: Iterable, holdout: float = 0.3, seed: int = 0) -> tuple[list, list]:
    """``(train, test)``: each record goes to test when its seeded key hash is < ``holdout``."""
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {holdout!r}")
    train, test = [], []
    for r in records:
        (test if _in_test(r.key(), holdout, seed) else train).append(r)
    return train, test


@dataclass(frozen=True)
class Accuracy:
    """``acc10``: share of |pred - meas| / meas <= 10%; ``mape``: mean |pred - meas| / meas in %."""

    n: int
    acc10: float
    mape: float


def accuracy(predicted: Sequence[float], measured: Sequence[float], tol: float = 0.10) -> Accuracy:
    """+-``tol`` accuracy and MAPE of predictions against measurements (all > 0)."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape:
        raise ValueError(f"{p.shape[0]} predictions for {m.shape[0]} measurements")
    if len(m) == 0:
        return Accuracy(0, float("nan"), float("nan"))
    if np.any(m <= 0):
        raise ValueError("measured latencies must be > 0 for relative errors")
    rel = np.abs(p - m) / m
    # The tiny slack keeps exact 10% errors (e.g. 1.1 vs 1.0) inside despite rounding.
    return Accuracy(len(m), float(np.mean(rel <= tol + 1e-12)), float(100.0 * np.mean(rel)))


@dataclass
class EvalReport:
    """Accuracy of a model (and its FLOPs baseline) on a set of records."""

    kind: str
    model_bytes: int
    n_eval: int
    split: str
    overall: Accuracy
    per_processor: dict[str, Accuracy]
    per_group: dict[str, Accuracy]
    baseline: dict[str, Accuracy]
    n_fallback: int
    predict_us_per_op: float
    predict_batch_us_per_op: float
    sharing: dict[str, Accuracy] = field(default_factory=dict)
    #: Kernels (``op/processor/impl``) the model never saw, with their record counts.
    unseen: dict[str, int] = field(default_factory=dict)
    predicted: list[float] = field(default_factory=list, repr=False)
    measured: list[float] = field(default_factory=list, repr=False)
    baseline_predicted: list[float] = field(default_factory=list, repr=False)
    labels: list[str] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = asdict(self)
        for k in ("predicted", "measured", "baseline_predicted", "labels"):
            out.pop(k)
        return out


def _by(labels: list[str], pred: np.ndarray, meas: np.ndarray) -> dict[str, Accuracy]:
    out = {}
    for label in sorted(set(labels)):
        sel = np.array([x == label for x in labels])
        out[label] = accuracy(pred[sel], meas[sel])
    return out


def evaluate(
    model: CostModel,
    records: Iterable,
    split: str = "all records",
    timing: bool = True,
) -> EvalReport:
    """Evaluate ``model`` (and its embedded FLOPs baseline) on ``records``."""
    records = list(records)
    ops = [r for r in records if isinstance(r, OpRecord)]
    shares = [r for r in records if isinstance(r, SharingRecord)]
    if not ops:
        raise ValueError("no operator records to evaluate on")
    feats = [r.features() for r in ops]
    meas = np.array([r.latency_ms for r in ops])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CostModelFallbackWarning)
        pred = model.predict_many(feats)
    n_fallback = sum(issubclass(w.category, CostModelFallbackWarning) for w in caught)
    unseen: dict[str, int] = {}
    for f in feats:
        if not model.covers(f):
            label = f"{f.op}/{f.processor}/{f.impl}"
            unseen[label] = unseen.get(label, 0) + 1
    baseline_model = model.fallback if model.fallback is not None else model
    base = baseline_model.predict_many(feats)

    per_op_us = batch_us = float("nan")
    if timing:
        sample = feats[: min(len(feats), 200)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CostModelFallbackWarning)
            t0 = time.perf_counter()
            for f in sample:
                model.predict(f)
            per_op_us = (time.perf_counter() - t0) / len(sample) * 1e6
            t0 = time.perf_counter()
            model.predict_many(feats)
            batch_us = (time.perf_counter() - t0) / len(feats) * 1e6

    procs = [f.processor for f in feats]
    groups = [f"{f.op}/{f.processor}/{f.impl}" for f in feats]
    sharing = {}
    if shares and model.sharing is not None:
        kinds = [r.kind for r in shares]
        sp = np.array([model.predict_sharing(r.kind, r.nbytes) for r in shares])
        sm = np.array([r.latency_ms for r in shares])
        keep = sm > 0
        sharing = _by([k for k, ok in zip(kinds, keep) if ok], sp[keep], sm[keep])
    return EvalReport(
        kind=model.kind,
        model_bytes=len(model.dumps().encode()),
        n_eval=len(ops),
        split=split,
        overall=accuracy(pred, meas),
        per_processor=_by(procs, pred, meas),
        per_group=_by(groups, pred, meas),
        baseline={"overall": accuracy(base, meas), **_by(procs, base, meas)},
        n_fallback=n_fallback,
        predict_us_per_op=per_op_us,
        predict_batch_us_per_op=batch_us,
        sharing=sharing,
        unseen=dict(sorted(unseen.items())),
        predicted=[float(x) for x in pred],
        measured=[float(x) for x in meas],
        baseline_predicted=[float(x) for x in base],
        labels=groups,
    )


def training_split(
    records: Iterable, holdout: float = 0.3, seed: int = 0, drop: float = 3.0
) -> tuple[list, list, list]:
    """The records ``cost-model fit`` trains on and the held-out ones it is evaluated on:
    :func:`split_records`, then the training records inconsistent by more than a factor ``drop``
    left out (:func:`inconsistent_records`; 0 keeps them).

    Returns
    -------
    tuple[list, list, list]
        ``(train, test, dropped)``.
    """
    train, test = split_records(records, holdout, seed)
    if not drop:
        return train, test, []
    bad = {id(r) for r in inconsistent_records(train, drop)}
    return [r for r in train if id(r) not in bad], test, [r for r in train if id(r) in bad]


def part_identity(r: OpRecord) -> tuple:
    """What makes two records the same built kernel: processor, implementation, the operator's
    parameters, the part's shape, whether it starts at row 0 (its padding), the dispatch features
    and the device. Records that agree here measured the same kernel, whatever partition (or
    model) they came from."""
    q = r.part
    return (
        r.processor,
        r.impl,
        r.params,
        (q.out_h, q.out_w, q.oc, q.in_h, q.in_w, q.ic, q.groups, q.row0 > 0),
        r.dispatch,
        json.dumps(dict(r.device), sort_keys=True),
    )


def noise_floor(records: Iterable) -> dict[str, dict[str, float]]:
    """How far apart repeated measurements of one identical part are, per processor and
    overall: the accuracy no model can beat on this data.

    Records are the same part when operator, processor, implementation, the full operator
    parameters, the part's shape, whether it starts at row 0 (its padding) and the dispatch
    features agree: one operator reached from different partitions (e.g. a grouped
    convolution whose groups split alike at several ratios) or from different models. For every
    ordered pair (a, b) of such records, b is taken as a prediction of a: ``acc10``/``mape`` as
    in ``accuracy``; ``log_sigma``: std of log(a/b) / sqrt(2), the noise of one measurement.
    """
    groups: dict[tuple, list[OpRecord]] = {}
    for r in records:
        if isinstance(r, OpRecord):
            groups.setdefault(part_identity(r), []).append(r)
    out = {}
    for proc in (None, "cpu", "gpu"):
        pred, meas, n_groups, n_records = [], [], 0, 0
        for key, recs in groups.items():
            if len(recs) < 2 or (proc is not None and key[0] != proc):
                continue
            n_groups += 1
            n_records += len(recs)
            for a in recs:
                for b in recs:
                    if a is not b:
                        pred.append(b.latency_ms)
                        meas.append(a.latency_ms)
        if not meas:
            continue
        acc = accuracy(pred, meas)
        logs = np.log(np.array(meas) / np.array(pred))
        out[proc or "overall"] = {
            "groups": n_groups,
            "records": n_records,
            "pairs": acc.n,
            "acc10": acc.acc10,
            "mape": acc.mape,
            "log_sigma": float(np.std(logs) / np.sqrt(2.0)),
        }
    return out


def inconsistent_records(
    records: Iterable, factor: float = 3.0, flops_slack: float = 1.25
) -> list[OpRecord]:
    """Operator records that contradict another measurement of the same operator on the same
    processor: a part with at most ``flops_slack`` times the FLOPs of another part (or of the
    whole operator) that took more than ``factor`` times as long. Such records are interference
    (a preempted thread, a busy host), not kernel behaviour; ``cost-model fit`` leaves them
    out of the training part (``--drop-inconsistent``), the held-out part keeps them."""
    if factor <= 1.0:
        raise ValueError(f"inconsistency factor must be > 1, got {factor!r}")
    by_op: dict[tuple, list[tuple[float, float, OpRecord]]] = {}
    for r in records:
        if isinstance(r, OpRecord):
            key = (r.params, r.processor, json.dumps(dict(r.device), sort_keys=True))
            by_op.setdefault(key, []).append((r.features().flops, r.latency_ms, r))
    out = []
    for recs in by_op.values():
        for flops, lat, r in recs:
            if any(
                f2 * flops_slack >= flops and lat > factor * l2
                for f2, l2, r2 in recs
                if r2 is not r
            ):
                out.append(r)
    return out


def fit_model(kind: str, records: Iterable, **options) -> CostModel:
    """Fit a model of ``kind`` (``codl``: option ``config`` = CodlConfig or preset name;
    ``gbdt``: option ``config`` = GbdtConfig)."""
    if kind == "codl":
        model = CodlModel(**options)
    elif kind == "gbdt":
        model = GbdtModel(**options)
    elif kind == "flops":
        model = FlopsModel(**options)
    elif kind == "measured":
        model = MeasuredModel(**options)
    else:
        raise ValueError(f"unknown cost model kind {kind!r} (codl, gbdt, flops, measured)")
    return model.fit(records)


def _fmt(a: Accuracy) -> str:
    return f"n={a.n:5d}  +-10%: {100 * a.acc10:5.1f}%  MAPE: {a.mape:6.2f}%"


def format_report(r: EvalReport) -> str:
    """Human-readable report."""
    lines = [
        f"cost model: {r.kind}   size: {r.model_bytes} bytes (FLOPs fallback included)",
        f"evaluated on: {r.split} ({r.n_eval} operator records)",
        f"  overall          {_fmt(r.overall)}",
    ]
    lines += [f"  {p:<16} {_fmt(a)}" for p, a in r.per_processor.items()]
    lines.append("per operator/processor/implementation:")
    lines += [f"  {g:<30} {_fmt(a)}" for g, a in r.per_group.items()]
    lines.append("FLOPs-linear baseline (same training data):")
    lines += [f"  {g:<16} {_fmt(a)}" for g, a in r.baseline.items()]
    if r.sharing:
        lines.append("data-sharing costs:")
        lines += [f"  {k:<16} {_fmt(a)}" for k, a in r.sharing.items()]
    if r.n_fallback:
        which = ", ".join(f"{k} ({n})" for k, n in r.unseen.items())
        lines.append(
            f"{r.n_fallback} operator records are of kernels the model never saw and used its "
            f"FLOPs fallback: {which}"
        )
    lines.append(
        f"prediction time: {r.predict_us_per_op:.1f} us per op one at a time, "
        f"{r.predict_batch_us_per_op:.1f} us per op in a batch (this machine)"
    )
    return "\n".join(lines)


def plot_scatter(report: EvalReport, path: str, title: str | None = None) -> None:
    """Predicted vs measured latency (log-log, +-10% band), the model beside the FLOPs baseline.

    matplotlib is imported here, with the Agg canvas (no display, no global backend change).
    """
    # deferred: matplotlib is a heavy optional dependency, needed only to draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    meas = np.array(report.measured)
    fig = Figure(figsize=(10, 4.6))
    FigureCanvasAgg(fig)
    lo, hi = meas.min() / 1.5, meas.max() * 1.5
    line = np.array([lo, hi])
    panels = (
        (
            report.predicted,
            f"{report.kind} (+-10%: {100 * report.overall.acc10:.0f}%, "
            f"MAPE {report.overall.mape:.1f}%)",
        ),
        (
            report.baseline_predicted,
            f"FLOPs baseline (+-10%: {100 * report.baseline['overall'].acc10:.0f}%, "
            f"MAPE {report.baseline['overall'].mape:.1f}%)",
        ),
    )
    for i, (pred, label) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        pred = np.array(pred)
        for group in sorted(set(report.labels)):
            sel = np.array([g == group for g in report.labels])
            ax.scatter(meas[sel], pred[sel], s=8, alpha=0.7, label=group)
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.25, lw=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted latency (ms)")
        ax.set_title(label, fontsize=9)
        if i == 0:
            ax.legend(fontsize=6, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------------------------------
# Datasets as the commands read them


def load_datasets(paths: Sequence[str]):
    """The records of several datasets in order (e.g. direct kernels and the algorithms of
    ``codl-tvm profile --winograd --packed``, measured on the same device)."""
    sets = [load_dataset(p) for p in paths]
    check_compatible(paths, sets)
    meta = dict(sets[0].meta)
    alone = {
        str(p): bool(d.meta.get("algorithms", {}).get("cpu_alone"))
        for p, d in zip(paths, sets)
        if d.meta.get("algorithms")
    }
    if len(set(alone.values())) > 1:
        # One booster per implementation: packed kernels of two settings would share one.
        raise DatasetError(
            "the algorithm datasets were built with different CPU kernel settings: "
            + ", ".join(f"{p} ({'CPU-alone' if a else 'preset'})" for p, a in alone.items())
            + "; fit one cost model per setting"
        )
    if any(alone.values()):
        meta["cpu_alone_settings"] = True
    return Dataset([r for d in sets for r in d.records], meta)


def _devices(data: Dataset) -> list[dict]:
    seen, out = set(), []
    for r in data.records:
        key = json.dumps(dict(r.device), sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(dict(r.device))
    return out


def _differing(a: dict, b: dict) -> str | None:
    """The first field both dicts state with different values."""
    for k in sorted(set(a) & set(b)):
        if a[k] != b[k]:
            return k
    return None


def check_compatible(paths: Sequence, sets: Sequence[Dataset]) -> None:
    """Refuse datasets that cannot be fitted together, naming the field that differs: another
    device (any field of the device descriptions, e.g. ``gpu``, ``compute_units``,
    ``cpu_threads``) or another timing protocol (``meta["timing"]``: warm-up, repeats, number,
    minimum repeat time), where both datasets state it. (Another schema version does not load:
    ``load_dataset`` names the version.)"""
    first_devices = None
    for path, data in zip(paths, sets):
        devices = _devices(data)
        if len(devices) > 1:
            k = _differing(devices[0], devices[1])
            raise DatasetError(
                f"{path}: holds measurements of {len(devices)} devices (device field {k!r} "
                f"differs: {devices[0].get(k)!r} vs {devices[1].get(k)!r}); fit one cost "
                "model per device"
            )
        if first_devices is None:
            first_devices = (path, devices)
        elif devices and first_devices[1]:
            k = _differing(first_devices[1][0], devices[0])
            if k is not None:
                raise DatasetError(
                    f"{path} was measured on another device than {first_devices[0]}: device "
                    f"field {k!r} is {devices[0][k]!r} there and {first_devices[1][0][k]!r} in "
                    f"{first_devices[0]}; fit one cost model per device"
                )
    timed = [(p, d.meta["timing"]) for p, d in zip(paths, sets) if d.meta.get("timing")]
    for path, timing in timed[1:]:
        k = _differing(timed[0][1], timing)
        if k is not None:
            raise DatasetError(
                f"{path} was measured with another timing protocol than {timed[0][0]}: "
                f"timing field {k!r} is {timing[k]!r} there and {timed[0][1][k]!r} in "
                f"{timed[0][0]}; profile both with the same protocol"
            )


def drop_groups(records: list, specs: Sequence[str]) -> tuple[list, int]:
    """``records`` without the operator records of the ``OP:PROCESSOR[:IMPL]`` groups (a
    kernel that changed since they were measured); with the number left out."""
    groups = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or parts[1] not in ("cpu", "gpu"):
            raise DatasetError(f"--drop {spec!r}: expected OP:PROCESSOR[:IMPL], e.g. dense:gpu")
        groups.append(parts)

    def dropped(r) -> bool:
        if not isinstance(r, OpRecord):
            return False
        return any(
            r.params.op == g[0] and r.processor == g[1] and (len(g) == 2 or r.impl == g[2])
            for g in groups
        )

    kept = [r for r in records if not dropped(r)]
    return kept, len(records) - len(kept)
