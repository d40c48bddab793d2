"""Plan a pipeline on measured stages: search, time the chosen stages together, search again.

Pipe-it's time matrix times every layer on its own, repeated with its weights warm in the
caches, and a stage's cost is the sum of its layers. A stream runs each stage's layers in turn,
beside the other stages: a stage of many layers evicts its own weights every frame and shares
the socket's caches and memory bandwidth with its neighbours. On a 16-core Xeon a ResNet50 stage of
twelve layers streamed at 2.0x the sum of its layers under load (docs/benchmarks.md), and the
search, which puts the pipeline's bottleneck wherever the table is lowest, picks exactly such
underestimated stages.

:func:`refine_with_stages` closes that loop with measurements instead of a model: it searches the
table, times the chosen pipeline's stages all at once on their cores (the caller's ``measure``;
:func:`codl_tvm.profiling.layers.measure_stages` on this machine), records each as a measured
stage of the table (:meth:`~codl_tvm.planner.stages.table.LatencyTable.with_stages`, which the
search then takes instead of the sum), and searches again, until the search's choice runs on
measured stages only. A stage not yet measured keeps its (usually optimistic) sum, so the search
keeps trying the stages that look best until their measurements say otherwise. Where
``rounds`` run out first, the pipeline with the lowest measured bottleneck is kept. A stage's
measurement is taken beside one pipeline's other stages and reused in others: an approximation
that a stream does not contradict as badly as the sums do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup
from codl_tvm.planner.stages.search import recost_plan, search_pipeline
from codl_tvm.planner.stages.table import HandOff, LatencyTable, PipelinePlan

__all__ = ["StageRefinement", "refine_with_stages"]


@dataclass(frozen=True)
class StageRefinement:
    """What :func:`refine_with_stages` found.

    Attributes
    ----------
    plan
        The pipeline kept, its stage latencies measured.
    table
        The input table with every stage measured on the way.
    converged
        Whether the search's last choice ran on measured stages only (else ``plan`` is the
        lowest measured bottleneck of the rounds).
    rounds
        One record per round: the plan searched (``describe``), the bottleneck the table
        promised and the one measured.
    """

    plan: PipelinePlan
    table: LatencyTable
    converged: bool
    rounds: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict:
        return {
            "converged": self.converged,
            "measured_stages": len(self.table.stage_ms),
            "rounds": [dict(r) for r in self.rounds],
        }


def _key(stage) -> tuple[str, int, int, int]:
    return (stage.group, stage.core_count, stage.first_layer, stage.stop_layer)


def refine_with_stages(
    table: LatencyTable,
    groups: Sequence[ProcessorGroup],
    measure: Callable[[PipelinePlan], Sequence[float]],
    *,
    handoff: HandOff | None = None,
    rounds: int = 16,
    **search: Any,
) -> StageRefinement:
    """Search ``table``, measure the chosen stages with ``measure``, and search again.

    Parameters
    ----------
    table
        The time matrix (and any stages measured before).
    groups
        The processor groups (as :func:`~codl_tvm.planner.stages.search.search_pipeline`).
    measure
        Times a plan's stages running together: ms of each stage's layers per frame, one value
        per stage, without the executor's hand-off (the search adds ``handoff``).
    handoff
        The executor's cost per stage.
    rounds
        The most plans measured.
    **search
        Passed to :func:`~codl_tvm.planner.stages.search.search_pipeline`.

    Raises
    ------
    PlannerError
        ``rounds`` below 1, or ``measure`` returning another number of values than stages.
    """
    if rounds < 1:
        raise PlannerError(f"stage rounds must be >= 1, got {rounds}")
    records: list[dict[str, Any]] = []
    best: PipelinePlan | None = None
    for _ in range(rounds):
        plan = search_pipeline(table, groups, handoff=handoff, **search)
        if all(_key(s) in table.stage_ms for s in plan.stages):
            # every stage measured: the search's optimum is costed on measurements alone
            return StageRefinement(plan, table, True, tuple(records))
        ms = list(measure(plan))
        if len(ms) != len(plan.stages):
            raise PlannerError(
                f"measured {len(ms)} stage times for a plan of {len(plan.stages)} stages"
            )
        table = table.with_stages({_key(s): m for s, m in zip(plan.stages, ms, strict=True)})
        measured = recost_plan(plan, table, handoff=handoff)
        records.append(
            {
                "plan": plan.describe(),
                "planned_ms": plan.bottleneck_ms,
                "measured_ms": measured.bottleneck_ms,
            }
        )
        if best is None or measured.bottleneck_ms < best.bottleneck_ms:
            best = measured
    assert best is not None
    return StageRefinement(best, table, False, tuple(records))
