"""Pipe-it's stage costs: a stage's latency from the time matrix, and the plan from cuts.

Owns what the stage searches (:mod:`codl_tvm.planner.stages.heuristics`,
:mod:`codl_tvm.planner.stages.exact`, :mod:`codl_tvm.planner.stages.search`) compute with:

- :class:`StageCosts`, a stage's latency (Pipe-it Eq. 9: the sum of its layers' latencies on its
  cores, plus the hand-over of its output and the executor's hand-off) as one prefix-sum
  subtraction;
- :func:`prepare_costs`, the checks of the groups and the table before a search, and
  :func:`plan_from_cuts`, the :class:`PipelinePlan` of a stage sequence and its cuts.

The types they read and return (:class:`LatencyTable`, :class:`HandOff`, :class:`StageConfig`,
:class:`PipelineStage`, :class:`PipelinePlan`) are Pipe-it's contract with profiling and the
build, :mod:`codl_tvm.core.stage_plan`; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup, check_groups
from codl_tvm.core.stage_plan import (
    HandOff,
    LatencyTable,
    PipelinePlan,
    PipelineStage,
    StageConfig,
)

__all__ = [
    "HandOff",
    "LatencyTable",
    "PipelinePlan",
    "PipelineStage",
    "StageConfig",
    "StageCosts",
    "TableLike",
    "plan_from_cuts",
    "prepare_costs",
]


# What the searches take as a table: a LatencyTable, or the mapping one is built from.
TableLike = LatencyTable | Mapping[tuple[str, int], Sequence[float]]


class StageCosts:
    """Stage latencies of one table with its transfer and hand-off costs.

    Parameters
    ----------
    table
        The time matrix.
    transfer_ms
        Optional cost of each cut (``n_layers - 1`` values), added to the stage that sends.
    handoff
        The executor's cost per stage (none by default).
    """

    def __init__(
        self,
        table: LatencyTable,
        transfer_ms: Sequence[float] | None,
        handoff: HandOff | None = None,
    ) -> None:
        n = table.n_layers
        self.table = table
        self.n = n
        self.handoff = handoff or HandOff()
        # the hand-off is paid by every stage with layers: folded into the cost of a cut and
        # of the last stage's end (out_ms), a stage's cost stays one prefix-sum subtraction
        if transfer_ms is None:
            trans = np.zeros(max(n - 1, 0))
        else:
            trans = np.asarray(transfer_ms, dtype=np.float64)
            if trans.shape != (max(n - 1, 0),):
                raise PlannerError(
                    f"transfer_ms has {trans.size} values; {n} layers have {max(n - 1, 0)} cuts"
                )
            if not np.all(np.isfinite(trans)) or np.any(trans < 0):
                raise PlannerError("transfer_ms must be finite and >= 0")
        # out_ms[b]: cost of handing over the tensors live after layer b - 1 (none at the
        # ends) plus the executor's hand-off, which every stage with layers pays
        self.out_ms = np.concatenate([[0.0], trans, [0.0]]) + self.handoff.stage_ms
        self.out_ms[0] = 0.0
        self._matrices: dict[StageConfig, np.ndarray] = {}

    def stage_matrix(self, config: StageConfig) -> np.ndarray:
        """``[j, k]``: the stage running layers ``[j, k)`` on ``config`` (0 where ``j == k``,
        inf where ``j > k``), kept per config:
        :func:`~codl_tvm.planner.stages.exact.exact_cuts` balances thousands of sequences of
        the same few configs."""
        m = self._matrices.get(config)
        if m is None:
            pre = self.table.prefix(config)
            m = pre[None, :] - pre[:, None] + self.out_ms[None, :]
            for first, stop, ms in self.table.measured(config):
                m[first, stop] = ms + self.out_ms[stop]
            j, k = np.indices(m.shape)
            m[j == k] = 0.0
            m[j > k] = np.inf
            self._matrices[config] = m
        return m

    def stage(self, config: StageConfig, a: int, b: int) -> float:
        """The stage running layers ``[a, b)`` on ``config`` (0 without layers)."""
        if b <= a:
            return 0.0
        ms = self.table.stage_ms.get((config.group, config.cores, a, b))
        if ms is None:
            p = self.table.prefix(config)
            ms = float(p[b] - p[a])
        return float(ms + self.out_ms[b])

    def stages(self, configs: Sequence[StageConfig], cuts: Sequence[int]) -> list[float]:
        """Every stage's latency for stage sequence ``configs`` cut at ``cuts``."""
        return [self.stage(c, cuts[i], cuts[i + 1]) for i, c in enumerate(configs)]

    def bottleneck(self, configs: Sequence[StageConfig], cuts: Sequence[int]) -> float:
        """The time per frame: the slowest stage, or the hand-off floor of the stages with
        layers where that is higher."""
        times = self.stages(configs, cuts)
        used = sum(1 for i in range(len(configs)) if cuts[i + 1] > cuts[i])
        return max(self.handoff.min_cycle_ms(used), *times)


def plan_from_cuts(
    costs: StageCosts,
    groups: Sequence[ProcessorGroup],
    configs: Sequence[StageConfig],
    cuts: Sequence[int],
    method: str,
) -> PipelinePlan:
    """The pipeline of stage sequence ``configs`` cut at ``cuts``: each stage's host cores
    (consecutive slices of its group's cores, in stage order) and latency; stages without
    layers are dropped (their cores idle)."""
    by_name = {g.name: g for g in groups}
    used = dict.fromkeys(by_name, 0)
    stages = []
    for i, c in enumerate(configs):
        g = by_name[c.group]
        if g.kind == "cpu":
            ids = g.cores[used[g.name] : used[g.name] + c.cores]
            used[g.name] += c.cores
        else:
            ids = g.cores
        if cuts[i + 1] > cuts[i]:
            stages.append(
                PipelineStage(
                    group=c.group,
                    core_count=c.cores,
                    cores=tuple(ids),
                    first_layer=cuts[i],
                    stop_layer=cuts[i + 1],
                    latency_ms=costs.stage(c, cuts[i], cuts[i + 1]),
                )
            )
    return PipelinePlan(tuple(stages), method, costs.handoff.min_cycle_ms(len(stages)))


def prepare_costs(
    table: TableLike,
    groups: Sequence[ProcessorGroup],
    available: Iterable[int] | None,
    transfer_ms: Sequence[float] | None,
    handoff: HandOff | None = None,
) -> StageCosts:
    """Check ``groups`` (against ``available``) and ``table`` (an entry for every stage the
    groups allow), then the table's stage costs.

    Raises
    ------
    PlannerError
        Groups :func:`~codl_tvm.core.groups.check_groups` refuses, or a table without an entry
        the search needs.
    """
    # the groups first: a group naming cores the machine lacks is the user's first mistake
    check_groups(groups, available)
    if not isinstance(table, LatencyTable):
        table = LatencyTable(table)
    table.check(groups)
    return StageCosts(table, transfer_ms, handoff)
