"""The plan report: one row per operator or chain with its predicted times and the reason."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Decision", "PlanReport", "PlanSummary", "of_it_conversions"]


def of_it_conversions(ms: float | None) -> str:
    """``, 0.120 of it image conversions`` where GPU work on images converts, else ``""``: the
    words every planner mode's reasons append to a cost that includes image conversions."""
    return "" if not ms else f", {ms:.3f} of it image conversions"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@dataclass(frozen=True)
class Decision:
    """Why one operator (or chain) got its partition.

    Attributes
    ----------
    ops
        The operators (one for a single operator, several for a chain).
    dim, ratio
        The chosen dimension and GPU share (``None`` for an operator the planner cannot model,
        which is left out of the plan and runs unsplit).
    cpu_ms, gpu_ms
        Predicted latency of the operator(s) run whole on the CPU / on the GPU.
    coexec_ms
        Predicted latency of the chosen partition (Eq. 2, sharing costs included; for a chain:
        sharing at its entry and exit plus the slower processor's sum of parts).
    split_ms
        Best predicted latency of a real split (both processors busy) for a single operator, or
        ``None`` when no split was possible.
    nochain_ms
        For a chain: the predicted latency of its operators planned one by one.
    gain_ms
        How much the decision gains on its alternative (best single processor for an operator,
        no-chain for a chain).
    reason
        The decision in words.
    cpu_part_ms, gpu_part_ms, sharing_ms
        For a split operator or a chain: the predicted time of the CPU's and the GPU's parts
        (summed over a chain's operators) and of the data sharing; ``None`` for an operator run
        whole. Timelines of the build give the same parts measured inside the model
        (``scripts/plan_vs_timeline.py``).
    provenance
        ``"measured"`` where every part the decision runs was looked up in a table of
        measurements (:class:`~codl_tvm.cost_model.measured.MeasuredModel`), ``"predicted"``
        otherwise; ``"unmodelled"`` for an operator left out of the plan.
    expected_error
        For a predicted decision, the relative error its prediction should be expected to
        have: the cost model's stored leave-one-model-out error of the parts it runs (the
        ``PlannerConfig.margin_quantiles`` quantile; a chain: its worst operator's). ``None``
        where the model stores none, or for a measured decision.
    novel
        Why the operator(s) lie outside the cost model's data (operator class, kernel, shape
        outside the fitted ranges); empty inside it.
    margin_ms
        The gain the operator's best split had to predict to be chosen
        (``PlannerConfig.split_margin``); ``None`` where no margin applied.
    conversion_ms
        For a split operator or a chain whose GPU parts are on images
        (``PlannerConfig.gpu_images``): the part of ``sharing_ms`` that is the GPU part's image
        conversions (the pack of its input, the unpack of its output); for an operator a
        placement mode runs whole on the GPU, the conversions its edges across processors pay
        (the pack of each tensor it reads from the CPU, the unpack of its result for the CPU);
        ``None`` otherwise, and then left out of :meth:`to_dict`.
    """

    ops: tuple[str, ...]
    dim: str | None
    ratio: float | None
    cpu_ms: float | None
    gpu_ms: float | None
    coexec_ms: float | None
    split_ms: float | None = None
    nochain_ms: float | None = None
    gain_ms: float = 0.0
    reason: str = ""
    cpu_part_ms: float | None = None
    gpu_part_ms: float | None = None
    sharing_ms: float | None = None
    provenance: str = "predicted"
    expected_error: float | None = None
    novel: tuple[str, ...] = ()
    margin_ms: float | None = None
    conversion_ms: float | None = None

    @property
    def source(self) -> str:
        """The provenance in a few characters: ``measured``, ``pred +-18%`` (``*`` for novel)."""
        if self.provenance != "predicted":
            return "measured" if self.provenance == "measured" else "-"
        err = "" if self.expected_error is None else f" +-{100 * self.expected_error:.0f}%"
        return f"pred{err}{'*' if self.novel else ''}"

    @property
    def is_chain(self) -> bool:
        return len(self.ops) > 1

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ops"] = list(self.ops)
        out["novel"] = list(self.novel)
        if self.conversion_ms is None:  # GPU parts on buffers: the report as before images
            del out["conversion_ms"]
        return out


@dataclass(frozen=True)
class PlanSummary:
    """Predicted model latency (modelled operators only) against the single-processor bounds."""

    predicted_ms: float
    cpu_only_ms: float
    gpu_only_ms: float
    ideal_ms: float  # T* = 1 / (1/Tcpu + 1/Tgpu)
    n_ops: int
    n_split_h: int
    n_split_oc: int
    n_whole_cpu: int
    n_whole_gpu: int
    chain_lengths: tuple[int, ...]
    n_unmodelled: int
    home: str = "gpu"  # where kernels outside the plan go when their inputs do not decide

    @property
    def speedup_vs_best_single(self) -> float:
        # a model with no modelled operator predicts 0 ms co-executed and alone alike
        if self.predicted_ms <= 0:
            return 1.0
        return min(self.cpu_only_ms, self.gpu_only_ms) / self.predicted_ms

    @property
    def efficiency(self) -> float:
        """T* / predicted (1.0 reaches the ideal bound)."""
        if self.predicted_ms <= 0:  # nothing modelled (see speedup_vs_best_single)
            return 1.0
        return self.ideal_ms / self.predicted_ms

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["chain_lengths"] = list(self.chain_lengths)
        out["speedup_vs_best_single"] = self.speedup_vs_best_single
        out["efficiency"] = self.efficiency
        return out


@dataclass(frozen=True)
class PlanReport:
    """Decisions of one planning run, its summary and any notes (e.g. cost-model fallbacks)."""

    mode: str
    cost_model: str
    decisions: tuple[Decision, ...]
    summary: PlanSummary
    notes: tuple[str, ...] = field(default=())
    model: str | None = None
    # ``--mode auto``: each candidate mode's predicted latency (ms); ``mode`` is the one chosen
    candidates: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "model": self.model,
            "mode": self.mode,
            "cost_model": self.cost_model,
            "summary": self.summary.to_dict(),
            "decisions": [d.to_dict() for d in self.decisions],
            "notes": list(self.notes),
        }
        if self.candidates is not None:
            out["auto"] = {"chosen": self.mode, "candidates_ms": dict(self.candidates)}
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def chains(self) -> list[Decision]:
        return [d for d in self.decisions if d.is_chain]

    def table(self) -> str:
        """The decisions as a fixed-width text table, then the summary."""
        head = (
            "ops",
            "dim",
            "ratio",
            "cpu ms",
            "gpu ms",
            "co-ex ms",
            "no-chain",
            "gain ms",
            "source",
        )
        rows = []
        for d in self.decisions:
            ops = d.ops[0] if len(d.ops) == 1 else f"{d.ops[0]}..{d.ops[-1]} ({len(d.ops)})"
            rows.append(
                (
                    ops,
                    d.dim or "-",
                    "-" if d.ratio is None else f"{d.ratio:.2f}",
                    _ms(d.cpu_ms),
                    _ms(d.gpu_ms),
                    _ms(d.coexec_ms),
                    _ms(d.nochain_ms),
                    f"{d.gain_ms:.3f}",
                    d.source,
                )
            )
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  reason"]
        for d, r in zip(self.decisions, rows):
            cells = "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
            novel = f" [novel: {'; '.join(d.novel)}]" if d.novel else ""
            lines.append(f"{cells}  {d.reason}{novel}")
        s = self.summary
        lines.append("")
        lines.append(
            f"[{self.mode}] predicted {s.predicted_ms:.3f} ms; CPU only {s.cpu_only_ms:.3f} ms, "
            f"GPU only {s.gpu_only_ms:.3f} ms, T* {s.ideal_ms:.3f} ms "
            f"(efficiency {s.efficiency:.0%}, {s.speedup_vs_best_single:.2f}x the best single "
            "processor)"
        )
        if self.candidates is not None:
            lines.append(
                f"auto chose {self.mode}, the lowest predicted latency of "
                + ", ".join(f"{m} {ms:.3f} ms" for m, ms in self.candidates.items())
            )
        lines.append(
            f"{s.n_ops} operators: {s.n_split_h} split on H, {s.n_split_oc} on OC, "
            f"{s.n_whole_gpu} whole on GPU, {s.n_whole_cpu} whole on CPU, "
            f"{s.n_unmodelled} not modelled; chains of length {list(s.chain_lengths) or 'none'}"
        )
        lines.append(
            "kernels outside the plan (batch norms, softmax, adds, ...) run where their inputs "
            f"were computed, else on the {s.home.upper()} (home: the faster single processor)"
        )
        measured = sum(d.provenance == "measured" for d in self.decisions)
        predicted = sum(d.provenance == "predicted" for d in self.decisions)
        novel = sum(bool(d.novel) for d in self.decisions)
        lines.append(
            f"source: {measured} decision(s) measured, {predicted} "
            f"predicted ({novel} of operators outside the cost model's data, marked *; +-: the "
            "expected error, the cost model's leave-one-model-out error of the parts run)"
        )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
