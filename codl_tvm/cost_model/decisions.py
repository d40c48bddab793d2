"""How good the splits a cost model picks are, against measurements (``cost-model decisions``).

For every partitionable operator of the benchmark models in a dataset (records named
``MODEL/OPERATOR``), the candidates are the partitions measured for it on both processors (each
(dim, ratio) whose CPU and GPU parts were profiled) plus the whole operator on either processor.
The cost model picks the candidate with the least predicted co-execution latency (CoDL's Eq. 2,
:meth:`~codl_tvm.cost_model.CostModel.predict_coexec_many`); the oracle (a
:class:`~codl_tvm.cost_model.measured.MeasuredModel` fitted on the same measurements) gives every
candidate's measured latency by the same Eq. 2; CoDL's analytical model and the FLOPs line,
fitted on the same records, pick too. Reported: the share of operators whose pick
measures within ``tolerance`` (5%) of the measured best, and per benchmark model the loss of the
picks, ``sum(measured pick) / sum(measured best) - 1`` over its operators (chains and the
operators outside the plan left out: this scores the per-operator choice only).

With ``lomo`` the model's recipe is refitted without each benchmark model's records before it
picks that model's splits (the model never saw the operators it decides), as for the
leave-one-model-out accuracy.

With ``margin`` the model picks as the planner does (:func:`~codl_tvm.cost_model.uncertainty.\
split_margin`): its best split only where the predicted gain over its best whole placement
exceeds the expected error, the ``quantiles[0]`` of the leave-one-model-out error
(``quantiles[1]`` for an operator outside the data, :class:`~codl_tvm.cost_model.uncertainty.\
DataRanges`). Under ``lomo`` the error for a benchmark model's decisions is read from the other
folds only (each fold's held-out parts predicted by its refitted recipe), so no decision is held
to a margin that measured its own operators; otherwise from the model's
``meta["lomo_error"]`` (computed here where absent). CoDL's model and the FLOPs line pick
without a margin.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from codl_tvm.cost_model.analytical import CodlModel, infer_preset
from codl_tvm.cost_model.assessment import REFERENCES, model_of, refit_like
from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.dataset import DatasetError, OpRecord
from codl_tvm.cost_model.evaluate import training_split
from codl_tvm.cost_model.features import PROCESSORS, OpParams, Partition, op_features
from codl_tvm.cost_model.flops import FlopsModel
from codl_tvm.cost_model.uncertainty import (
    QUANTILES,
    DataRanges,
    LomoError,
    compute_lomo_error,
    relative_errors,
    split_margin,
    uncertainty_of,
)

__all__ = ["DecisionReport", "OpDecision", "decide", "format_decisions"]


@dataclass(frozen=True)
class OpDecision:
    """One operator: the model's pick and the measured best, with their measured latencies."""

    model: str
    name: str
    picked: Partition
    best: Partition
    picked_ms: float
    best_ms: float
    candidates: int

    @property
    def loss(self) -> float:
        """Measured latency of the pick over the best, minus 1."""
        return self.picked_ms / self.best_ms - 1.0


@dataclass
class DecisionReport:
    """Per operator decisions and their summary (see the module docstring)."""

    tolerance: float
    ops: list[OpDecision]
    skipped: list[str]
    lomo: bool
    #: The same decisions taken by CoDL's model and by the FLOPs line (and, with ``margin``,
    #: by the model without the margin: ``no_margin``).
    references: dict[str, list[OpDecision]] = field(default_factory=dict)
    #: Whether the model's picks were held to the split margin.
    margin: bool = False
    #: Which picks (``PlannerConfig.split_margin``): ``novel``, ``lomo`` or ``none``.
    margin_mode: str = "none"

    def _within(self, ops: list[OpDecision]) -> float:
        if not ops:
            return float("nan")
        return float(np.mean([d.loss <= self.tolerance + 1e-12 for d in ops]))

    @property
    def within(self) -> float:
        """Share of operators whose pick measures within ``tolerance`` of the best."""
        return self._within(self.ops)

    def reference_within(self) -> dict[str, float]:
        """:attr:`within` of CoDL's model and of the FLOPs line."""
        return {k: self._within(v) for k, v in self.references.items()}

    def per_model(self, who: str = "model") -> dict[str, dict[str, float]]:
        """Per benchmark model: operators, share within tolerance, summed measured latency of
        the picks and of the best, and the loss; of ``who`` (``model``, ``codl`` or
        ``flops``)."""
        decisions = self.ops if who == "model" else self.references[who]
        out = {}
        for name in sorted({d.model for d in decisions}):
            ds = [d for d in decisions if d.model == name]
            picked = sum(d.picked_ms for d in ds)
            best = sum(d.best_ms for d in ds)
            out[name] = {
                "ops": len(ds),
                "within": float(np.mean([d.loss <= self.tolerance + 1e-12 for d in ds])),
                "picked_ms": picked,
                "best_ms": best,
                "loss": picked / best - 1.0,
            }
        return out

    def to_json(self) -> dict:
        return {
            "tolerance": self.tolerance,
            "lomo": self.lomo,
            "margin": self.margin,
            "margin_mode": self.margin_mode,
            "ops": len(self.ops),
            "within": self.within,
            "models": self.per_model(),
            "references": {
                k: {"within": self._within(v), "models": self.per_model(k)}
                for k, v in self.references.items()
            },
            "skipped": self.skipped,
            "decisions": [
                {
                    "model": d.model,
                    "name": d.name,
                    "picked": d.picked.to_json(),
                    "best": d.best.to_json(),
                    "picked_ms": d.picked_ms,
                    "best_ms": d.best_ms,
                    "candidates": d.candidates,
                }
                for d in self.ops
            ],
        }


def _candidates(recs: Sequence[OpRecord]) -> list[Partition]:
    seen: dict[tuple[str, float], set[str]] = {}
    for r in recs:
        seen.setdefault((r.partition.dim, r.partition.ratio), set()).add(r.processor)
    out = [Partition("none", 0.0), Partition("none", 1.0)]
    for (dim, ratio), procs in sorted(seen.items()):
        if dim != "none" and set(PROCESSORS) <= procs:
            out.append(Partition(dim, ratio))
    return out


def _impls(recs: Sequence[OpRecord]) -> dict[str, str]:
    out = {}
    for proc in PROCESSORS:
        names = Counter(r.impl for r in recs if r.processor == proc)
        if names:
            out[proc] = names.most_common(1)[0][0]
    return out


def _coexec_ms(model: CostModel, params: OpParams, parts: list[Partition], impl) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallbacks and unmeasured parts are the point here
        return np.array([c.total_ms for c in model.predict_coexec_many(params, parts, impl)])


def _fold_lomo(
    pickers: dict[str, dict[str, CostModel]],
    by_op: dict[tuple[str, str], list[OpRecord]],
    quantiles: Sequence[float],
) -> dict[str, LomoError]:
    """Per benchmark model, the leave-one-model-out error of the other folds: each fold's
    held-out parts predicted by its own refitted recipe."""
    errors: dict[str, tuple[list[OpRecord], np.ndarray]] = {}
    for bench in pickers:
        held = [r for (b, _), recs in by_op.items() if b == bench for r in recs]
        errors[bench] = (held, relative_errors(pickers[bench]["model"], held))
    out = {}
    for bench in pickers:
        others = [b for b in errors if b != bench]
        recs = [r for b in others for r in errors[b][0]]
        errs = np.concatenate([errors[b][1] for b in others]) if others else np.zeros(0)
        out[bench] = LomoError.summarise(recs, errs, others, quantiles)
    return out


def _margin_pick(
    model: CostModel,
    lomo: LomoError,
    ranges: DataRanges,
    params: OpParams,
    impl: dict[str, str],
    parts: list[Partition],
    predicted: np.ndarray,
    quantiles: tuple[float, float],
    novel_only: bool = False,
) -> int:
    """The planner's rule: the best whole placement unless the best split beats it by more
    than :func:`split_margin` (with ``novel_only``, as ``split_margin="novel"``: held to it only
    where the operator lies outside the model's data)."""
    wholes = [i for i, p in enumerate(parts) if p.dim == "none"]
    splits = [i for i, p in enumerate(parts) if p.dim != "none"]
    whole = min(wholes, key=lambda i: predicted[i])
    if not splits:
        return whole
    split = min(splits, key=lambda i: predicted[i])
    if predicted[split] >= predicted[whole]:
        return whole
    proc = "gpu" if parts[whole].ratio >= 1.0 else "cpu"
    novel = bool(ranges.novelty(params)) or not all(
        model.covers(op_features(params, p, impl[p])) for p in PROCESSORS
    )
    if novel_only and not novel:
        return split
    m = split_margin(
        lomo,
        params,
        impl,
        proc,
        float(predicted[whole]),
        float(predicted[split]),
        quantiles[1] if novel else quantiles[0],
    )
    if math.isfinite(m.margin_ms) and predicted[whole] - predicted[split] <= m.margin_ms:
        return whole
    return split


def decide(
    model: CostModel,
    oracle: CostModel,
    records: Sequence,
    tolerance: float = 0.05,
    lomo: bool = False,
    margin: bool | str = False,
    quantiles: tuple[float, float] = (QUANTILES[0], QUANTILES[1]),
) -> DecisionReport:
    """Score the splits ``model`` picks against ``oracle``'s measurements (module docstring).
    ``margin``: the planner's ``split_margin`` rule (``"novel"``, ``"lomo"``; True is
    ``"lomo"``, False or ``"none"`` none); the picks without it are kept too, as the reference
    ``no_margin``."""
    mode = {True: "lomo", False: "none"}.get(margin, margin) if isinstance(margin, bool) else margin
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    records = list(records)
    by_op: dict[tuple[str, str], list[OpRecord]] = {}
    for r in records:
        if isinstance(r, OpRecord) and model_of(r) is not None:
            by_op.setdefault((model_of(r), r.name.split("/", 1)[1]), []).append(r)
    if not by_op:
        raise DatasetError(
            "no records of benchmark models (named MODEL/OPERATOR) to take decisions on"
        )
    # who picks each benchmark model's splits: the model (or its recipe refitted without that
    # benchmark model), and CoDL's model and the FLOPs line fitted on the same records
    preset = infer_preset(records)
    fitters: dict[str, Callable[[list], CostModel]] = {
        "model": lambda recs: refit_like(model, recs),
        "codl": lambda recs: _quiet_fit(CodlModel(preset), recs),
        "flops": lambda recs: _quiet_fit(FlopsModel(), recs),
    }
    benches = sorted({m for m, _ in by_op})
    pickers: dict[str, dict[str, CostModel]] = {}
    ranges: dict[str, DataRanges] = {}
    if lomo:
        drop = float(model.meta.get("drop_inconsistent", 3.0))
        for name in benches:
            rest = [r for r in records if not (isinstance(r, OpRecord) and model_of(r) == name)]
            rest, _, _ = training_split(rest, 0.0, 0, drop)
            pickers[name] = {k: fit(rest) for k, fit in fitters.items()}
            ranges[name] = DataRanges.of(rest)
    else:
        whole = {"model": model, **{k: fitters[k](records) for k in REFERENCES}}
        pickers = {name: whole for name in benches}
        ranges = dict.fromkeys(benches, DataRanges.of(records))
    errors: dict[str, LomoError] = {}
    # a table's picks are measured, as planned
    margin = mode in ("lomo", "novel") and model.kind != "measured"
    if margin:
        if lomo:
            errors = _fold_lomo(pickers, by_op, quantiles)
        else:
            stored, _ = uncertainty_of(model)
            errors = dict.fromkeys(benches, stored or compute_lomo_error(model, records))
    ops: list[OpDecision] = []
    refs: dict[str, list[OpDecision]] = {k: [] for k in REFERENCES}
    if margin:
        refs["no_margin"] = []
    skipped: list[str] = []
    for (bench, name), recs in sorted(by_op.items()):
        params = recs[0].params
        impl = _impls(recs)
        parts = _candidates(recs)
        if len(impl) < len(PROCESSORS) or len(parts) < 3:
            skipped.append(f"{bench}/{name}: not measured whole on both processors and split")
            continue
        measured = _coexec_ms(oracle, params, parts, impl)
        ok = np.isfinite(measured)
        if ok.sum() < 2:
            skipped.append(f"{bench}/{name}: the oracle covers {int(ok.sum())} of its candidates")
            continue
        parts = [p for p, good in zip(parts, ok) if good]
        measured = measured[ok]
        best = int(np.argmin(measured))
        picks = {}
        for who in ("model", *REFERENCES):
            predicted = _coexec_ms(pickers[bench][who], params, parts, impl)
            picks[who] = int(np.argmin(predicted))
            if who == "model" and margin:
                picks["no_margin"] = picks[who]
                picks[who] = _margin_pick(
                    pickers[bench][who],
                    errors[bench],
                    ranges[bench],
                    params,
                    impl,
                    parts,
                    predicted,
                    quantiles,
                    novel_only=mode == "novel",
                )
        for who, pick in picks.items():
            (ops if who == "model" else refs[who]).append(
                OpDecision(
                    bench,
                    name,
                    parts[pick],
                    parts[best],
                    float(measured[pick]),
                    float(measured[best]),
                    len(parts),
                )
            )
    return DecisionReport(tolerance, ops, skipped, lomo, refs, margin, mode if margin else "none")


_NAMES = {"codl": "CoDL's model", "flops": "FLOPs line", "no_margin": "without the margin"}


def _quiet_fit(model: CostModel, records: list) -> CostModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small groups fall back to FLOPs; not the point here
        return model.fit(records)


def _part(p: Partition) -> str:
    if p.dim == "none":
        return "gpu" if p.ratio >= 1.0 else "cpu"
    return f"{p.dim}:{p.ratio:g}"


def format_decisions(report: DecisionReport, worst: int = 10) -> str:
    """The decisions as text: the summary, per benchmark model, the worst picks."""
    tol = f"{100 * report.tolerance:g}%"
    how = " (each model's splits picked by the recipe refitted without it)" if report.lomo else ""
    if report.margin:
        held = "novel operators' splits" if report.margin_mode == "novel" else "splits"
        how += f" ({held} held to the LOMO-error margin)"
    lines = [
        f"split decisions{how}: {len(report.ops)} operators, {100 * report.within:.1f}% of picks "
        f"measure within {tol} of the measured best"
        + "".join(f"; {_NAMES[k]}: {100 * w:.1f}%" for k, w in report.reference_within().items()),
        f"  {'model':<16} {'ops':>4} {'within':>7} {'picked ms':>10} {'best ms':>9} {'loss':>7}"
        + "".join(f" {k + ' loss':>11}" for k in report.references),
    ]
    refs = {k: report.per_model(k) for k in report.references}
    for name, s in report.per_model().items():
        lines.append(
            f"  {name:<16} {s['ops']:4d} {100 * s['within']:6.1f}% {s['picked_ms']:10.3f} "
            f"{s['best_ms']:9.3f} {100 * s['loss']:6.1f}%"
            + "".join(f" {100 * r[name]['loss']:10.1f}%" for r in refs.values() if name in r)
        )
    bad = sorted(report.ops, key=lambda d: -d.loss)[:worst]
    bad = [d for d in bad if d.loss > report.tolerance and math.isfinite(d.loss)]
    if bad:
        lines.append("worst picks (operator: picked -> best, measured loss):")
        lines += [
            f"  {d.model}/{d.name}: {_part(d.picked)} -> {_part(d.best)}, +{100 * d.loss:.1f}%"
            for d in bad
        ]
    if report.skipped:
        lines.append(f"{len(report.skipped)} operators skipped, e.g. {report.skipped[0]}")
    return "\n".join(lines)
