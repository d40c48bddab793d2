"""Pipe-it's cost inputs and results: the time matrix, the executor's hand-off and the plan.

Owns what the stage searches (:mod:`codl_tvm.planner.stages.heuristics`,
:mod:`codl_tvm.planner.stages.exact`, :mod:`codl_tvm.planner.stages.search`) read and return:

- :class:`LatencyTable`, Pipe-it's time matrix: ms of every layer on every (group, core count),
  measured (:mod:`codl_tvm.profiling.layers`) or predicted
  (:mod:`codl_tvm.planner.stages.layer_model`), with optional measured stages;
- :class:`HandOff`, the executor's cost per stage, which no layer's latency holds;
- :class:`StageCosts`, a stage's latency (Pipe-it Eq. 9: the sum of its layers' latencies on its
  cores, plus the hand-over of its output and the hand-off) as one prefix-sum subtraction;
- :class:`PipelinePlan` and :class:`PipelineStage`, the pipeline a search returns
  (:func:`plan_from_cuts` builds one from a stage sequence and its cuts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup, check_groups

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


@dataclass(frozen=True)
class HandOff:
    """The executor's cost per stage, which no layer's latency holds.

    Parameters
    ----------
    stage_ms
        What one frame's hand-over costs a stage (queue get and put, thread wake-up); added to
        every stage's latency. The Python steps of every stage are serialised by the
        interpreter lock, so a pipeline of ``S`` stages also takes at least
        ``(S + 1) * stage_ms`` per frame (the ``+ 1``: the feeder).
    """

    stage_ms: float = 0.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.stage_ms) or self.stage_ms < 0:
            raise PlannerError(f"hand-off cost must be finite and >= 0 ms, got {self.stage_ms!r}")

    def min_cycle_ms(self, stages: int) -> float:
        """The shortest time per frame of a pipeline of ``stages`` stages."""
        return (stages + 1) * self.stage_ms if stages else 0.0


@dataclass(frozen=True)
class StageConfig:
    """One stage's processors: ``cores`` cores of group ``group`` (1 for a GPU)."""

    group: str
    cores: int


class LatencyTable:
    """Pipe-it's time matrix: ms of every layer on every (group, core count).

    Parameters
    ----------
    latency_ms
        ``(group, cores) -> per-layer latencies in ms`` (one value per layer, in layer order,
        finite and >= 0).
    layer_names
        Optional names of the layers (for plans and messages).
    stage_ms
        Optional measured stages, ``(group, cores, first layer, stop layer) -> ms``: the time
        of layers ``[first, stop)`` run as one stage, which the search takes instead of the sum
        of their latencies (:meth:`with_stages`). A stage of many layers runs slower than its
        layers timed one at a time, each repeated with its weights warm in the caches.
    """

    def __init__(
        self,
        latency_ms: Mapping[tuple[str, int], Sequence[float] | np.ndarray],
        layer_names: Sequence[str] | None = None,
        stage_ms: Mapping[tuple[str, int, int, int], float] | None = None,
    ) -> None:
        if not latency_ms:
            raise PlannerError("the latency table is empty")
        self._ms: dict[tuple[str, int], np.ndarray] = {}
        n_layers = None
        for key, values in latency_ms.items():
            arr = np.asarray(values, dtype=np.float64)
            if arr.ndim != 1 or arr.size == 0:
                raise PlannerError(f"latency table {key}: expected one value per layer")
            if n_layers is None:
                n_layers = arr.size
            elif arr.size != n_layers:
                raise PlannerError(
                    f"latency table {key}: {arr.size} layers, other entries have {n_layers}"
                )
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                bad = int(np.flatnonzero(~np.isfinite(arr) | (arr < 0))[0])
                raise PlannerError(
                    f"latency table {key}: layer {bad} has latency {float(arr[bad])!r} ms (must be "
                    "finite and >= 0)"
                )
            self._ms[(str(key[0]), int(key[1]))] = arr
        self.n_layers: int = int(n_layers)
        if layer_names is not None and len(layer_names) != self.n_layers:
            raise PlannerError(
                f"{len(layer_names)} layer names for a table of {self.n_layers} layers"
            )
        self.layer_names = None if layer_names is None else tuple(layer_names)
        # prefix sums: the latency of layers [a, b) on a config is one subtraction
        self._prefix = {k: np.concatenate([[0.0], np.cumsum(v)]) for k, v in self._ms.items()}
        self.stage_ms: dict[tuple[str, int, int, int], float] = {}
        for key, ms in (stage_ms or {}).items():
            group, cores, first, stop = str(key[0]), int(key[1]), int(key[2]), int(key[3])
            if (group, cores) not in self._ms:
                raise PlannerError(
                    f"measured stage {key}: the table has no entry for {cores} core(s) of {group!r}"
                )
            if not 0 <= first < stop <= self.n_layers:
                raise PlannerError(
                    f"measured stage {key}: layers [{first}, {stop}) outside the table's "
                    f"{self.n_layers} layers"
                )
            if not math.isfinite(ms) or ms < 0:
                raise PlannerError(f"measured stage {key}: {ms!r} ms (must be finite and >= 0)")
            self.stage_ms[(group, cores, first, stop)] = float(ms)

    def __getitem__(self, key: tuple[str, int]) -> np.ndarray:
        return self._ms[key]

    def __contains__(self, key: object) -> bool:
        return key in self._ms

    def keys(self) -> list[tuple[str, int]]:
        """The ``(group, cores)`` entries of the table."""
        return list(self._ms)

    def prefix(self, config: StageConfig) -> np.ndarray:
        """Prefix sums of ``config``'s per-layer latencies (length ``n_layers + 1``)."""
        return self._prefix[(config.group, config.cores)]

    def measured(self, config: StageConfig) -> Iterator[tuple[int, int, float]]:
        """``(first, stop, ms)`` of every measured stage on ``config``."""
        for (group, cores, first, stop), ms in self.stage_ms.items():
            if group == config.group and cores == config.cores:
                yield first, stop, ms

    def with_stages(self, stage_ms: Mapping[tuple[str, int, int, int], float]) -> LatencyTable:
        """This table with ``stage_ms`` measured stages added (replacing any of the same key)."""
        return LatencyTable(self._ms, self.layer_names, {**self.stage_ms, **stage_ms})

    def check(self, groups: Sequence[ProcessorGroup]) -> None:
        """Refuse a table that lacks an entry the search needs for ``groups``."""
        for g in groups:
            for c in range(1, g.most_stage_cores + 1):
                if (g.name, c) not in self:
                    raise PlannerError(
                        f"the latency table has no entry for {c} core(s) of group {g.name!r}"
                    )


@dataclass(frozen=True)
class PipelineStage:
    """One stage of a pipeline.

    Parameters
    ----------
    group
        The processor group's name.
    core_count
        Cores of the group the stage uses (1 for a GPU).
    cores
        The host core ids the stage runs on (consecutive slices of its group's cores in stage
        order; a GPU stage carries its group's host cores).
    first_layer, stop_layer
        The stage runs layers ``first_layer .. stop_layer - 1``.
    latency_ms
        Its layers' latency plus the transfer of its output to the next stage and the
        executor's hand-off (:attr:`HandOff.stage_ms`).
    """

    group: str
    core_count: int
    cores: tuple[int, ...]
    first_layer: int
    stop_layer: int
    latency_ms: float


@dataclass(frozen=True)
class PipelinePlan:
    """A pipeline: stages in order, each a contiguous run of layers on its processors.

    ``min_cycle_ms`` is the executor's floor on the time per frame for this many stages
    (:meth:`HandOff.min_cycle_ms`; 0 without a hand-off cost).
    """

    stages: tuple[PipelineStage, ...]
    method: str
    min_cycle_ms: float = 0.0

    @property
    def bottleneck_ms(self) -> float:
        """The slowest stage's latency, or the executor's floor where that is higher: one frame
        leaves the pipeline this often."""
        return max(self.min_cycle_ms, *(s.latency_ms for s in self.stages))

    @property
    def throughput_fps(self) -> float:
        """Frames per second at steady state (Pipe-it Eq. 11)."""
        return 1000.0 / self.bottleneck_ms if self.bottleneck_ms > 0 else math.inf

    def describe(self) -> str:
        """A one-line summary: ``big4[0:35] - little2[35:44] - gpu1[44:54]``."""
        return " - ".join(
            f"{s.group}{s.core_count}[{s.first_layer}:{s.stop_layer}]" for s in self.stages
        )

    def to_json(self) -> dict:
        return {
            "method": self.method,
            "throughput_fps": self.throughput_fps,
            "min_cycle_ms": self.min_cycle_ms,
            "stages": [
                {
                    "group": s.group,
                    "core_count": s.core_count,
                    "cores": list(s.cores),
                    "layers": [s.first_layer, s.stop_layer],
                    "latency_ms": s.latency_ms,
                }
                for s in self.stages
            ],
        }


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
