"""Pipe-it's pipeline search: contiguous cuts of a layer sequence onto processor-group stages.

A pipeline runs a model's layers (in order) as stages; each stage is a number of cores of one
processor group (a CPU cluster: ``big``, ``little``) or a whole accelerator (the GPU), and with a
frame in every stage at once the throughput is ``1 / max(stage latency)`` (Pipe-it Eq. 11). A
stage's latency is the sum of its layers' latencies on its cores (Eq. 9) plus, when a transfer
cost per cut is given, the cost of handing its output to the next stage.

The executor adds a cost per stage that the time matrix does not hold (:class:`HandOff`,
measured on the machine by :func:`codl_tvm.profiling.layers.measure_handoff`): every frame
a stage takes costs a queue get, a put and a thread wake-up (``stage_ms``, added to every
stage), and those Python steps of all stages share one interpreter lock, so one frame leaves
the pipeline no faster than ``(stages + 1) * stage_ms`` (the feeder's put counts too). The
second term is what makes a further cut cost something: with it the search stops cutting
stages whose work is near the hand-off itself.

Inputs are a time matrix (:class:`LatencyTable`: ms of every layer on every (group, core count),
measured or predicted by :mod:`codl_tvm.planner.stages.layer_model`) and the processor groups
(:class:`ProcessorGroup`, :func:`parse_groups` reads ``big:0-3,little:4-7,gpu``), which are
checked against the machine's cores and the table before any search runs.

:func:`search_pipeline` is Pipe-it's heuristic (section VI):

- **Algorithm 1** (``find_split``) shares the layers of two adjacent stages between them. The
  paper moves layers from the end of the faster stage while it stays the slower of the two,
  balancing the pair alone; a pair balanced alone can block the pipeline (a later stage that
  could take a layer stays idle because the pair's own maximum would rise, though the pipeline's
  bottleneck, elsewhere, would not). So this module picks the pair's cut that minimises the
  pipeline's bottleneck (the other stages included) and, on a tie, lets the work flow
  downstream (the paper's "water") up to the current bottleneck, leaving the earlier stage room.
- **Algorithm 2** (``work_flow``) starts with every layer in the first stage and balances each
  adjacent pair in turn until the cuts reach a fixed point. A fixed point of pairwise moves is a
  local optimum (on random tables it misses the best cuts by more than 2 % now and then: a
  bottleneck at one end needs layers to flow through stages that are balanced among
  themselves), so by default (``balance="exact"``) the cuts of each stage sequence are the
  optimum, found by dynamic programming in ``O(stages * layers ** 2)``; ``balance="pipe-it"``
  keeps the published Algorithms 1 and 2.
- **Algorithm 3** (``merge_stage``) starts from one single-core stage per core, fastest cluster
  first (Eq. 10's order), and merges adjacent stages of one group while Eq. 12 holds (the merged
  stage is faster than the slower of the two), re-running Algorithm 2 after every merge. A merge
  Eq. 12 refuses is also kept when the re-balanced pipeline has a lower bottleneck (Eq. 12 sees
  only the two stages' current layers: two stages without layers never satisfy it, which would
  leave a cluster whose single cores are too slow for any layer unused), and where no single
  merge helps, two merges in a row are tried.

Starting pipelines: Pipe-it starts from one order (fastest cluster first, Eq. 10), which assumes
every layer ranks the processors alike. A GPU is fast on some layers only, and per-layer speed
ratios differ between clusters too, so Algorithm 3 runs from several starts and the best
pipeline wins: a GPU group (one stage, never merged) at every position of the single-core
pipeline, and every interleaving of the clusters' cores where that fits in ``max_starts`` (else
every order of whole clusters); and one stage per whole cluster, in every order, as a start too
(Algorithm 3 only merges, a step or two at a time, so it can stop short of whole clusters).
Stages left without layers are dropped (their cores idle).

Where the single-core interleavings are too many to start from, starts that alternate the
clusters in two to four blocks each are added (the optima on measured tables do; from the other
starts the search ends with each cluster in one run). Then (extensions, ours, not the paper's)
a local search from each of Algorithm 3's pipelines moves cores between stages of a cluster,
splits, drops, adds and relocates stages, and carves a core off a stage into a new stage
elsewhere, while the bottleneck falls; the best pipeline's runs of one cluster are then
coarsened to one stage each and the local search restarts from every neighbour of that coarse
pipeline, while that lowers the bottleneck (a local optimum whose clusters alternate in other
blocks than the optimum's is several moves from it); and, where it is cheap,
:func:`optimal_pipeline` replaces the result when its bottleneck is lower.

:func:`exhaustive_pipeline` enumerates every pipeline of up to ``max_stages`` stages (any order
of groups, any core counts, every cut): the check the issue measures the heuristic against.
:func:`optimal_pipeline` finds the optimum over any number of stages by dynamic programming over
(layers placed, cores of each group used). On the device's measured tables (five CNNs, 8 big +
4 little cores and a GPU; three CNNs on 8 big + 7 x86-64-v2 little cores and a GPU; the same
three with AVX2 little kernels) the heuristic alone reaches the optimum over any stage count
(0.998 at worst) on all eleven, CPU groups and all groups. Before the alternating starts, the
stage relocations and the local search's tie-break on the next slowest stages it stopped at
0.89-0.97 on four of them; before the coarse restarts, at 0.979 (CPU groups) and 0.971 (all
groups) on the AVX2 run's Inception v1. The heuristic balances thousands of stage sequences:
on those tables, and on three clusters of six cores, the dynamic program is the cheaper of the
two.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.errors import PlannerError
from codl_tvm.runtime.stream import process_cpus

__all__ = [
    "BALANCERS",
    "GROUP_KINDS",
    "HandOff",
    "LatencyTable",
    "PipelinePlan",
    "PipelineStage",
    "ProcessorGroup",
    "StageConfig",
    "check_groups",
    "exhaustive_pipeline",
    "optimal_pipeline",
    "parse_groups",
    "recost_plan",
    "search_pipeline",
]

GROUP_KINDS = ("cpu", "gpu")
# How search_pipeline cuts one stage sequence (see its ``balance`` argument).
BALANCERS = ("exact", "pipe-it")
# The most work (see _dp_work) search_pipeline spends on the optimum over every stage sequence:
# two clusters of 8 cores and a GPU on a 300-layer model are ~4.5e9 (n * configs = 5100 numpy
# steps over arrays of 300 * 1458 states), a 58-layer CNN on 8 + 7 cores and a GPU ~1.3e8.
MAX_DP_WORK = 5_000_000_000
# The most stages per cluster of the alternating starts (_start_orders): the optima on the
# device's measured tables alternate the clusters in up to four blocks each.
ALTERNATING_BLOCKS = 4

# Coarse restarts run from the local search's best ends of this many distinct block structures:
# from the best alone the heuristic stopped at 0.961 of the optimum on a measured AlexNet
# matrix (its best end's blocks ``big6 - little7 - big2`` are four coarse moves from the
# optimum's; the third-best end's ``little4 - big3 - little3 - big5`` one).
COARSE_STARTS = 3


@dataclass(frozen=True)
class ProcessorGroup:
    """A processor group a pipeline's stages are built for.

    Parameters
    ----------
    name
        The group's name (``"big"``, ``"little"``, ``"gpu"``).
    kind
        ``"cpu"``: stages take 1 to ``len(cores)`` of its cores; ``"gpu"``: one stage, the
        whole device (``cores`` are then the host cores its driver may use, possibly none).
    cores
        Host CPU core ids.
    """

    name: str
    kind: str
    cores: tuple[int, ...]

    @property
    def most_stage_cores(self) -> int:
        """The largest core count one stage of this group may have (a GPU counts as 1)."""
        return len(self.cores) if self.kind == "cpu" else 1


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


def _core_list(text: str, where: str) -> list[int]:
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise PlannerError(f"{where}: bad core range {text!r} (expected N or N-M)") from None
    if first < 0 or last < first:
        raise PlannerError(f"{where}: bad core range {text!r}")
    return list(range(first, last + 1))


def parse_groups(spec: str, available: Iterable[int] | None = None) -> tuple[ProcessorGroup, ...]:
    """Read processor groups from ``"big:0-3,6,little:8-11,gpu"`` and check them.

    A ``name:cores`` item starts a group; a bare number or range after it adds cores to it; a
    bare name is a group without cores. Groups named ``gpu`` (or ``gpu0``, ``gpu1``, ...) are
    GPU groups, all others CPU clusters.

    Raises
    ------
    PlannerError
        Malformed text, or groups :func:`check_groups` refuses.
    """
    groups: list[tuple[str, list[int]]] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            raise PlannerError(f"processor groups {spec!r}: empty item")
        name, sep, cores = item.partition(":")
        if sep:
            name, cores = name.strip(), cores.strip()
            groups.append((name, _core_list(cores, f"group {name!r}") if cores else []))
        elif item[0].isdigit():
            if not groups:
                raise PlannerError(f"processor groups {spec!r}: cores {item!r} before any group")
            groups[-1][1].extend(_core_list(item, f"group {groups[-1][0]!r}"))
        else:
            groups.append((item, []))
    return check_groups(
        [
            ProcessorGroup(name, "gpu" if _is_gpu_name(name) else "cpu", tuple(cores))
            for name, cores in groups
        ],
        available,
    )


def _is_gpu_name(name: str) -> bool:
    return name == "gpu" or (name.startswith("gpu") and name[3:].isdigit())


def _ranges(cores: Iterable[int]) -> str:
    cores = sorted(set(cores))
    out = []
    for _, run in itertools.groupby(enumerate(cores), lambda ic: ic[1] - ic[0]):
        run = [c for _, c in run]
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def check_groups(
    groups: Sequence[ProcessorGroup], available: Iterable[int] | None = None
) -> tuple[ProcessorGroup, ...]:
    """Refuse groups a pipeline cannot run on, before anything is searched or built.

    Parameters
    ----------
    groups
        The processor groups.
    available
        The cores this process may run on (default: ``os.sched_getaffinity(0)``).

    Raises
    ------
    PlannerError
        No groups, a duplicate or empty name, an unknown kind, a CPU group without cores, a core
        named twice, or cores the machine does not have.
    """
    if not groups:
        raise PlannerError("no processor groups to build a pipeline on")
    if available is None:
        available = process_cpus()
    avail = set(available)
    seen_names: set[str] = set()
    owner: dict[int, str] = {}
    for g in groups:
        if not isinstance(g, ProcessorGroup):
            raise PlannerError(f"not a ProcessorGroup: {g!r}")
        if not g.name:
            raise PlannerError("a processor group has an empty name")
        if g.name in seen_names:
            raise PlannerError(f"processor group {g.name!r} is named twice")
        seen_names.add(g.name)
        if g.kind not in GROUP_KINDS:
            raise PlannerError(f"processor group {g.name!r}: unknown kind {g.kind!r}")
        if g.kind == "cpu" and not g.cores:
            raise PlannerError(f"processor group {g.name!r} has no cores")
        if len(set(g.cores)) != len(g.cores):
            raise PlannerError(f"processor group {g.name!r} names a core twice")
        missing = set(g.cores) - avail
        if missing:
            raise PlannerError(
                f"processor group {g.name!r} names cores {_ranges(missing)}, which this machine "
                f"does not have (available: {_ranges(avail) or 'none'})"
            )
        for c in g.cores:
            if c in owner:
                raise PlannerError(f"core {c} is in both group {owner[c]!r} and {g.name!r}")
            owner[c] = g.name
    return tuple(groups)


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


class _Costs:
    """Stage latencies of one table with its transfer and hand-off costs."""

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
        inf where ``j > k``), kept per config: :func:`_exact_cuts` balances thousands of
        sequences of the same few configs."""
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
        if b <= a:
            return 0.0
        ms = self.table.stage_ms.get((config.group, config.cores, a, b))
        if ms is None:
            p = self.table.prefix(config)
            ms = float(p[b] - p[a])
        return float(ms + self.out_ms[b])

    def stages(self, configs: Sequence[StageConfig], cuts: Sequence[int]) -> list[float]:
        return [self.stage(c, cuts[i], cuts[i + 1]) for i, c in enumerate(configs)]

    def bottleneck(self, configs: Sequence[StageConfig], cuts: Sequence[int]) -> float:
        """The time per frame: the slowest stage, or the hand-off floor of the stages with
        layers where that is higher."""
        times = self.stages(configs, cuts)
        used = sum(1 for i in range(len(configs)) if cuts[i + 1] > cuts[i])
        return max(self.handoff.min_cycle_ms(used), *times)


def _find_split(
    costs: _Costs, first: StageConfig, second: StageConfig, a: int, b: int, rest_ms: float
) -> int:
    """Algorithm 1: the cut ``k`` in ``[a, b]`` that shares layers ``a..b-1`` between two
    adjacent stages; ``rest_ms`` is the slowest of the pipeline's other stages."""
    ks = np.arange(a, b + 1)
    t1 = costs.stage_matrix(first)[a, ks]
    t2 = costs.stage_matrix(second)[ks, b]
    worst = np.maximum(np.maximum(t1, t2), rest_ms)
    # the first minimum: on a tie the work flows on downstream, up to the pipeline's current
    # bottleneck, which leaves the earlier stage room for the layers before it
    return int(ks[int(np.argmin(worst))])


def _work_flow(costs: _Costs, configs: Sequence[StageConfig]) -> list[int]:
    """Algorithm 2: all layers in the first stage, then balance adjacent pairs to a fixed point."""
    p = len(configs)
    cuts = [0] + [costs.n] * p
    seen: set[tuple[int, ...]] = set()
    while tuple(cuts) not in seen:
        seen.add(tuple(cuts))
        for i in range(p - 1):
            times = costs.stages(configs, cuts)
            rest = max([0.0, *times[:i], *times[i + 2 :]])
            cuts[i + 1] = _find_split(costs, configs[i], configs[i + 1], cuts[i], cuts[i + 2], rest)
    return cuts


def _exact_cuts(costs: _Costs, configs: Sequence[StageConfig]) -> list[int]:
    """The cuts of a fixed stage sequence with the lowest bottleneck (what Algorithm 2 aims at),
    by dynamic programming over (stage, layers placed): ``O(stages * layers ** 2)``."""
    n, p = costs.n, len(configs)
    best = np.full(n + 1, np.inf)  # best[k]: bottleneck of layers [0, k) on the stages so far
    best[0] = 0.0
    choice = np.zeros((p, n + 1), dtype=np.int64)
    columns = np.arange(n + 1)
    for i, c in enumerate(configs):
        worst = np.maximum(best[:, None], costs.stage_matrix(c))
        # the last minimum over j: on a tie the earlier stages keep the layers
        j = n - np.argmin(worst[::-1], axis=0)
        best = worst[j, columns]
        choice[i] = j
    cuts = [n]
    for i in range(p - 1, -1, -1):
        cuts.append(int(choice[i, cuts[-1]]))
    return cuts[::-1]


def _merges(
    configs: list[StageConfig], mergeable: set[str]
) -> Iterable[tuple[int, list[StageConfig]]]:
    """Every stage sequence one merge of two adjacent stages of one cluster away, with the
    index of the first merged stage."""
    for i in range(len(configs) - 1):
        x, y = configs[i], configs[i + 1]
        if x.group == y.group and x.group in mergeable:
            yield i, [*configs[:i], StageConfig(x.group, x.cores + y.cores), *configs[i + 2 :]]


Balancer = Callable[[_Costs, Sequence[StageConfig]], list[int]]


@dataclass
class _Memo:
    """What one search has worked out, by stage sequence: the starts, merges, local moves and
    restarts revisit most sequences many times.

    ``balanced``: bottleneck and cuts once balanced; ``rank``: :func:`_local_search`'s key;
    ``descent``: where :func:`_local_search` ends from a sequence (the search is deterministic,
    so a later search that reaches a sequence on an earlier one's path ends where it did).
    """

    balanced: dict[tuple[StageConfig, ...], tuple[float, list[int]]] = dataclasses.field(
        default_factory=dict
    )
    rank: dict[tuple[StageConfig, ...], tuple[float, ...]] = dataclasses.field(default_factory=dict)
    descent: dict[tuple[StageConfig, ...], list[StageConfig]] = dataclasses.field(
        default_factory=dict
    )


def _balanced(
    costs: _Costs, seq: Sequence[StageConfig], balance: Balancer, memo: _Memo
) -> tuple[float, list[int]]:
    """``seq``'s bottleneck and cuts once balanced, each sequence balanced once per search."""
    key = tuple(seq)
    found = memo.balanced.get(key)
    if found is None:
        cuts = balance(costs, seq)
        found = memo.balanced[key] = (costs.bottleneck(seq, cuts), cuts)
    return found[0], list(found[1])


def _merge_stage(
    costs: _Costs,
    configs: list[StageConfig],
    mergeable: set[str],
    balance: Balancer,
    memo: _Memo,
) -> tuple[list[StageConfig], list[int]]:
    """Algorithm 3: merge adjacent stages of one cluster while Eq. 12 holds; the best pipeline
    seen on the way (a merge that Eq. 12 accepts can still re-balance to a slower one).

    Eq. 12 only looks at the two stages' current layers: two stages without layers (single cores
    too slow for any layer) never satisfy it, and a merged stage too slow for both stages'
    layers may still be the best home for fewer of them. A merge Eq. 12 refuses is therefore
    tried, and kept if the re-balanced pipeline's bottleneck is lower; where no single merge
    helps, two merges in a row are tried (growing one cluster's stage can pay only once another
    cluster's stages merge to take the layers it hands on). Of the merges allowed, the one with
    the lowest re-balanced bottleneck is made (the paper makes the first, Big cluster first; the
    first can close the way to a better one).
    """

    def bottleneck(seq: list[StageConfig]) -> tuple[float, list[int]]:
        return _balanced(costs, seq, balance, memo)

    current, cuts = bottleneck(configs)
    best = (current, list(configs), list(cuts))
    while True:
        times = costs.stages(configs, cuts)
        steps = []
        for i, trial in _merges(configs, mergeable):
            after = bottleneck(trial)[0]
            # Eq. 12 on the two stages the merge replaces, or a lower bottleneck re-balanced
            eq12 = costs.stage(trial[i], cuts[i], cuts[i + 2]) < max(times[i], times[i + 1])
            if eq12 or after < current:
                steps.append((after, trial))
        if not steps:
            steps = [
                (after, second)
                for _, first in _merges(configs, mergeable)
                for _, second in _merges(first, mergeable)
                if (after := bottleneck(second)[0]) < current
            ]
        if not steps:
            return best[1], best[2]
        # the merge that leaves the lowest bottleneck (the first such, in pipeline order)
        configs = min(steps, key=lambda step: step[0])[1]
        current, cuts = bottleneck(configs)
        if current < best[0]:
            best = (current, list(configs), list(cuts))


def _neighbours(
    configs: list[StageConfig], room: Mapping[str, int], cpu_names: set[str]
) -> Iterator[list[StageConfig]]:
    """Every stage sequence one local move away from ``configs``: a core moved between two
    stages of one cluster, a stage split in two (adjacent, same cluster) or dropped (its cores
    freed), a stage given a free core, a new stage (free cores of a cluster, or an unused GPU)
    put anywhere, a stage moved elsewhere, or one core of a stage carved off into a new stage
    elsewhere (the last two let a cluster's stages interleave with another's, which merges and
    splits of neighbours never do)."""
    used: dict[str, int] = {}
    for c in configs:
        used[c.group] = used.get(c.group, 0) + c.cores
    p = len(configs)
    for i, x in enumerate(configs):
        if p > 1:
            yield [*configs[:i], *configs[i + 1 :]]
        if x.group not in cpu_names:
            continue
        if used[x.group] < room[x.group]:
            yield [*configs[:i], StageConfig(x.group, x.cores + 1), *configs[i + 1 :]]
        if x.cores > 1:
            for j, y in enumerate(configs):
                if j != i and y.group == x.group:
                    trial = list(configs)
                    trial[i] = StageConfig(x.group, x.cores - 1)
                    trial[j] = StageConfig(y.group, y.cores + 1)
                    yield trial
            for k in range(1, x.cores):
                halves = [StageConfig(x.group, k), StageConfig(x.group, x.cores - k)]
                yield [*configs[:i], *halves, *configs[i + 1 :]]
            # one of its cores carved off into a new stage elsewhere
            kept = [*configs[:i], StageConfig(x.group, x.cores - 1), *configs[i + 1 :]]
            for j in range(p + 1):
                if j not in (i, i + 1):
                    yield [*kept[:j], StageConfig(x.group, 1), *kept[j:]]
    # a stage moved elsewhere in the pipeline (a swap of neighbours included)
    for i, x in enumerate(configs):
        rest = [*configs[:i], *configs[i + 1 :]]
        for j in range(p):
            if j != i:
                yield [*rest[:j], x, *rest[j:]]
    for name, most in room.items():
        free = most - used.get(name, 0)
        sizes = range(1, free + 1) if name in cpu_names else range(1, min(free, 1) + 1)
        for c in sizes:
            for i in range(p + 1):
                yield [*configs[:i], StageConfig(name, c), *configs[i:]]


def _local_search(
    costs: _Costs,
    groups: Sequence[ProcessorGroup],
    configs: list[StageConfig],
    balance: Balancer,
    memo: _Memo,
) -> tuple[list[StageConfig], list[int]]:
    """A final local search over core counts and stages from Algorithm 3's best pipeline (an
    extension of Pipe-it): the best of :func:`_neighbours` (re-balanced) while it lowers the
    bottleneck, or keeps it and lowers the next slowest stages.

    Algorithm 3 only merges, and from a few starts: it cannot shrink a stage it grew, move a
    core between two stages of a cluster that are not adjacent, or split a stage again. On
    measured tables (big and little x86 clusters, a PoCL GPU) that left it 3-11 % below the
    optimum on four of five CNNs; these moves close most of that gap.
    """
    room = {g.name: g.most_stage_cores for g in groups}
    cpu_names = {g.name for g in groups if g.kind == "cpu"}

    def rank(seq: list[StageConfig]) -> tuple[float, ...]:
        # the bottleneck, then the next two slowest stages (rounded to 1e-9 ms, so rounding
        # never counts as progress): a move that keeps the bottleneck but unloads the stages
        # next to it is progress too. On measured tables the bottleneck alone left plateaus
        # (the first run's SqueezeNet, 0.92 of the optimum: splitting the little cluster
        # around a big stage takes two moves, the first of which lowers only the second
        # slowest stage); every key is strictly lower than the last, so the search ends.
        key = tuple(seq)
        found = memo.rank.get(key)
        if found is None:
            bottleneck, cuts = _balanced(costs, seq, balance, memo)
            times = sorted(costs.stages(seq, cuts), reverse=True)
            found = (round(bottleneck, 9), *(round(t, 9) for t in times[1:3]))
            memo.rank[key] = found
        return found

    current = rank(configs)
    path = []
    while True:
        key = tuple(configs)
        if key in memo.descent:  # an earlier search passed here: it goes on the same way
            configs = memo.descent[key]
            break
        path.append(key)
        step = None
        for trial in _neighbours(configs, room, cpu_names):
            after = rank(trial)
            if after < current and (step is None or after < step[0]):
                step = (after, trial)
        if step is None:
            break
        current, configs = step
    for key in path:
        memo.descent[key] = configs
    return list(configs), _balanced(costs, configs, balance, memo)[1]


def _coarsened(configs: Sequence[StageConfig], mergeable: set[str]) -> list[StageConfig]:
    """``configs`` with every run of adjacent stages of one cluster as one stage of their
    cores (the pipeline's blocks: what Algorithm 3's merges of those stages end in)."""
    out: list[StageConfig] = []
    for c in configs:
        if out and c.group in mergeable and out[-1].group == c.group:
            out[-1] = StageConfig(c.group, out[-1].cores + c.cores)
        else:
            out.append(c)
    return out


def _coarse_restarts(
    costs: _Costs,
    groups: Sequence[ProcessorGroup],
    configs: list[StageConfig],
    balance: Balancer,
    memo: _Memo,
) -> tuple[list[StageConfig], list[int]]:
    """The local search restarted from every neighbour of the best pipeline's cluster blocks
    (an extension of Pipe-it, ours, as :func:`_local_search` is).

    A local move changes one stage, and every move is kept only when it lowers the bottleneck
    (or the next slowest stages): an optimum whose clusters alternate in other blocks is
    several moves away, through slower pipelines. On a measured Inception v1 table (58 layers,
    8 AVX-512 big + 7 AVX2 little cores) the local search stopped in
    ``little2 - big4 - big1 - big1 - big1 - little1 - big1 - little2 - little1 - little1``
    (blocks ``little2 - big7 - little1 - big1 - little4``), 0.979 of the optimum
    ``little2 - big4 - little3 - little1 - big1 - big1 - little1 - big1 - big1``. Here the
    pipeline is coarsened to its blocks (:func:`_coarsened`), and the local search runs again
    from every neighbour of the coarse pipeline (:func:`_neighbours`: a block's core moved to
    another block, a block carved into a new one elsewhere, a block moved ...); the best
    result replaces the pipeline where its bottleneck is lower, and the step repeats from it
    until none is (on that table the first step's coarse neighbour
    ``little2 - big7 - little1 - big1 - little1 - little3``, the last block split, leads to the
    optimum, and the second finds nothing lower). Deterministic: the neighbours come in
    :func:`_neighbours`' order, the first best wins a tie, and no pipeline is searched from
    twice.
    """
    room = {g.name: g.most_stage_cores for g in groups}
    cpu_names = {g.name for g in groups if g.kind == "cpu"}
    best = (_balanced(costs, configs, balance, memo)[0], configs)
    tried: set[tuple[StageConfig, ...]] = set()
    while True:
        start = best
        for trial in _neighbours(_coarsened(best[1], cpu_names), room, cpu_names):
            if tuple(trial) in tried:
                continue
            tried.add(tuple(trial))
            found, cuts = _local_search(costs, groups, trial, balance, memo)
            bottleneck = costs.bottleneck(found, cuts)
            if bottleneck < best[0]:
                best = (bottleneck, found)
        if best is start:
            return best[1], _balanced(costs, best[1], balance, memo)[1]


def _plan(
    costs: _Costs,
    groups: Sequence[ProcessorGroup],
    configs: Sequence[StageConfig],
    cuts: Sequence[int],
    method: str,
) -> PipelinePlan:
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


def _prepare(
    table: LatencyTable | Mapping[tuple[str, int], Sequence[float]],
    groups: Sequence[ProcessorGroup],
    available: Iterable[int] | None,
    transfer_ms: Sequence[float] | None,
    handoff: HandOff | None = None,
) -> _Costs:
    # the groups first: a group naming cores the machine lacks is the user's first mistake
    check_groups(groups, available)
    if not isinstance(table, LatencyTable):
        table = LatencyTable(table)
    table.check(groups)
    return _Costs(table, transfer_ms, handoff)


def _interleavings(counts: dict[str, int]) -> Iterable[list[str]]:
    """Every distinct order of ``counts[name]`` copies of each name."""
    if not any(counts.values()):
        yield []
        return
    for name, n in counts.items():
        if n:
            for rest in _interleavings({**counts, name: n - 1}):
                yield [name, *rest]


def _start_orders(
    cpus: Sequence[ProcessorGroup], gpus: Sequence[ProcessorGroup], max_starts: int
) -> Iterable[list[StageConfig]]:
    """Algorithm 3's starting pipelines (GPU stages are placed into them later).

    Pipe-it starts from single-core stages in one order, the fastest cluster first. Per-layer
    speed ratios differ (and a GPU is faster on some layers only), so where the starts fit in
    ``max_starts`` every interleaving of the clusters' cores is a start (a big stage, a little
    stage, then big again can be best); otherwise every order of whole clusters. Then one stage
    per whole cluster, in every order.
    """
    counts = {g.name: len(g.cores) for g in cpus}
    n_single = sum(counts.values())
    n_interleavings = math.factorial(n_single)
    for n in counts.values():
        n_interleavings //= math.factorial(n)
    if n_interleavings * (n_single + 1) ** len(gpus) <= max_starts:
        for names in _interleavings(counts):
            yield [StageConfig(name, 1) for name in names]
    else:
        for order in itertools.permutations(cpus):
            yield [StageConfig(g.name, 1) for g in order for _ in g.cores]
    # Merging single-core stages one or two at a time can stop short of whole clusters (a stage
    # of every core of a cluster needs several merges that pay only together), so every order
    # of whole clusters is a start too (Pipe-it's best pipelines are often B4-s4).
    for order in itertools.permutations(cpus):
        yield [StageConfig(g.name, len(g.cores)) for g in order]


def _alternating_starts(cpus: Sequence[ProcessorGroup]) -> Iterable[list[StageConfig]]:
    """Starts that alternate the clusters in a few blocks (an extension of Pipe-it).

    Where the single-core interleavings are too many to start from (:func:`_start_orders`),
    the optima still alternate clusters in a few blocks (``little3 - big4 - little2 - big1 -
    little2 - big1 - big2`` on a 58-layer CNN, 8 big + 7 little cores): merges only join
    neighbours of one cluster and a local move changes one stage, so from those starts the
    search ends with each cluster in one run (0.94 of the optimum there). Each start here splits
    every cluster into ``blocks`` stages of near-equal core counts (the last cluster of the
    order into ``blocks`` or ``blocks - 1``, so the pipeline can begin and end on one cluster),
    the clusters in turn. :func:`search_pipeline` puts a GPU stage at their end only (its local
    search moves it): every slot of every start multiplied the search's time by the stage count.
    """
    for blocks in range(2, ALTERNATING_BLOCKS + 1):
        for order in itertools.permutations(cpus):
            for last in (blocks - 1, blocks) if len(order) > 1 else (blocks,):
                parts = [blocks] * (len(order) - 1) + [last]
                yield [
                    StageConfig(g.name, _even_share(len(g.cores), k, b))
                    for b in range(blocks)
                    for g, k in zip(order, parts, strict=True)
                    if b < k and _even_share(len(g.cores), k, b)
                ]


def _even_share(n: int, parts: int, i: int) -> int:
    """The ``i``-th of ``parts`` near-equal shares of ``n`` (the larger shares first)."""
    q, r = divmod(n, parts)
    return q + (1 if i < r else 0)


def search_pipeline(
    table: LatencyTable | Mapping[tuple[str, int], Sequence[float]],
    groups: Sequence[ProcessorGroup],
    *,
    transfer_ms: Sequence[float] | None = None,
    handoff: HandOff | None = None,
    available: Iterable[int] | None = None,
    max_starts: int = 256,
    balance: str = "exact",
    local_search: bool = True,
    local_starts: int | None = None,
    coarse_restarts: bool = True,
    exact_stages: bool = True,
) -> PipelinePlan:
    """Pipe-it's heuristic (Algorithms 1-3) extended with GPU stages.

    Parameters
    ----------
    table
        The time matrix (ms per layer for every (group, core count) the groups allow).
    groups
        The processor groups; checked (with ``available``) before anything is searched.
    transfer_ms
        Optional cost of each cut (``n_layers - 1`` values): handing the tensors live after
        layer ``i`` to the next stage, added to the stage that sends them.
    handoff
        The executor's cost per stage (:class:`HandOff`); none by default.
    available
        The machine's cores (default: this process's CPU affinity).
    max_starts
        The most starting pipelines Algorithm 3 runs from when every interleaving of the
        clusters' cores is tried; beyond it, only orders of whole clusters are.
    balance
        How the cuts of one stage sequence are chosen: ``"pipe-it"``, Algorithms 1 and 2 (the
        pairwise balancing, a local optimum); ``"exact"``, the lowest bottleneck by dynamic
        programming (the optimum Algorithm 2 approximates; same merges and starts).
    local_search
        After Algorithm 3, move cores between stages, split, drop and add stages while the
        bottleneck falls (an extension: Algorithm 3 only merges).
    local_starts
        The local search runs from this many of Algorithm 3's best distinct pipelines (None:
        from every one; its starts end in few, and the local searches share their balanced
        sequences). From the best alone it stops in a worse local optimum more often: on the
        device's SqueezeNet table 0.76 of the optimum's throughput, 1.0 from all of them.
    coarse_restarts
        With ``local_search``, then restart it from every neighbour of a pipeline's blocks
        (each run of one cluster's stages as one stage) while that lowers the bottleneck
        (:func:`_coarse_restarts`, an extension), from the local search's best ends of
        ``COARSE_STARTS`` distinct block structures. Without it the emulated SoC's Inception v1
        table stopped at 0.979 (CPU groups) and 0.971 (all groups) of the optimum.
    exact_stages
        With ``balance="exact"``, also compute :func:`optimal_pipeline` (the optimum over every
        stage sequence) where its work is at most ``MAX_DP_WORK`` and return it when its
        bottleneck is lower than the heuristic's (``method="pipe-it+optimal"``). On measured
        tables of five CNNs the heuristic alone was 0-11 % below that optimum: the optima
        interleave big and little stages (``big2 - big1 - little3 - big1 - little1 - big2``)
        in ways merges from few starts do not reach.

    Returns
    -------
    PipelinePlan
        The best pipeline found (``method="pipe-it"``, or ``"pipe-it+optimal"`` where the
        optimum over every stage sequence was lower).
    """
    costs = _prepare(table, groups, available, transfer_ms, handoff)
    exact_stages = exact_stages and balance == "exact"
    cpus = [g for g in groups if g.kind == "cpu"]
    gpus = [g for g in groups if g.kind == "gpu"]
    mergeable = {g.name for g in cpus}
    if balance not in BALANCERS:
        raise PlannerError(f"unknown balance {balance!r} (choose from {', '.join(BALANCERS)})")
    balancer = _exact_cuts if balance == "exact" else _work_flow
    memo = _Memo()
    found: dict[tuple[StageConfig, ...], tuple[float, list[StageConfig], list[int]]] = {}
    starts = [(start, True) for start in _start_orders(cpus, gpus, max_starts)]
    starts += [(start, False) for start in _alternating_starts(cpus)]
    for start, every_slot in starts:
        # every placement of the GPU stages among the CPU stages (or after them)
        slots_of = range(len(start) + 1) if every_slot else (len(start),)
        for slots in itertools.product(slots_of, repeat=len(gpus)):
            configs = list(start)
            for gpu, slot in sorted(zip(gpus, slots, strict=True), key=lambda gs: -gs[1]):
                configs.insert(slot, StageConfig(gpu.name, 1))
            configs, cuts = _merge_stage(costs, configs, mergeable, balancer, memo)
            found.setdefault(tuple(configs), (costs.bottleneck(configs, cuts), configs, cuts))
    # the best of Algorithm 3's pipelines, first found first on a tie
    ranked = sorted(found.values(), key=lambda f: f[0])
    best = ranked[0]  # check_groups refuses an empty list: there is one start at least
    if local_search:
        ends: dict[tuple[StageConfig, ...], tuple[float, list[StageConfig], list[int]]] = {}
        for _, start_configs, _ in ranked[:local_starts]:  # [:None]: every one
            configs, cuts = _local_search(costs, groups, start_configs, balancer, memo)
            bottleneck = costs.bottleneck(configs, cuts)
            ends.setdefault(tuple(configs), (bottleneck, configs, cuts))
            if bottleneck < best[0]:
                best = (bottleneck, configs, cuts)
        if coarse_restarts:
            # from the best local-search ends of COARSE_STARTS distinct block structures
            coarse_seen: set[tuple[StageConfig, ...]] = set()
            for _, end_configs, _ in sorted(ends.values(), key=lambda e: e[0]):
                blocks = tuple(_coarsened(end_configs, mergeable))
                if blocks in coarse_seen:
                    continue
                coarse_seen.add(blocks)
                configs, cuts = _coarse_restarts(costs, groups, end_configs, balancer, memo)
                bottleneck = costs.bottleneck(configs, cuts)
                if bottleneck < best[0]:
                    best = (bottleneck, configs, cuts)
                if len(coarse_seen) == COARSE_STARTS:
                    break
    if exact_stages and _dp_work(costs.n, groups) <= MAX_DP_WORK:
        # the optimum over every stage sequence (optimal_pipeline) where it is cheap: the
        # heuristic's pipeline is kept unless the optimum's bottleneck is lower
        opt = optimal_pipeline(
            costs.table, groups, transfer_ms=transfer_ms, handoff=handoff, available=available
        )
        if opt.bottleneck_ms < best[0]:
            return dataclasses.replace(opt, method="pipe-it+optimal")
    return _plan(costs, groups, best[1], best[2], "pipe-it")


def recost_plan(
    plan: PipelinePlan,
    table: LatencyTable | Mapping[tuple[str, int], Sequence[float]],
    *,
    transfer_ms: Sequence[float] | None = None,
    handoff: HandOff | None = None,
) -> PipelinePlan:
    """The same stages and cuts with latencies from another table (and hand-off cost).

    What a pipeline chosen from predicted latencies achieves under measured ones (Pipe-it's
    Table IV compares the two).
    """
    if not isinstance(table, LatencyTable):
        table = LatencyTable(table)
    if plan.stages and plan.stages[-1].stop_layer != table.n_layers:
        raise PlannerError(
            f"the plan covers {plan.stages[-1].stop_layer} layers, the table has {table.n_layers}"
        )
    costs = _Costs(table, transfer_ms, handoff)
    for s in plan.stages:
        if (s.group, s.core_count) not in table:
            raise PlannerError(f"the table has no entry for {s.core_count} core(s) of {s.group!r}")
    return PipelinePlan(
        tuple(
            dataclasses.replace(
                s,
                latency_ms=costs.stage(
                    StageConfig(s.group, s.core_count), s.first_layer, s.stop_layer
                ),
            )
            for s in plan.stages
        ),
        plan.method,
        costs.handoff.min_cycle_ms(len(plan.stages)),
    )


def _stage_options(
    groups: Sequence[ProcessorGroup], max_stages: int
) -> Iterator[list[StageConfig]]:
    """Every sequence of up to ``max_stages`` stage configs the groups' cores can hold."""
    options = [StageConfig(g.name, c) for g in groups for c in range(1, g.most_stage_cores + 1)]
    room = {g.name: g.most_stage_cores for g in groups}
    for p in range(1, max_stages + 1):
        for seq in itertools.product(options, repeat=p):
            used: dict[str, int] = {}
            for s in seq:
                used[s.group] = used.get(s.group, 0) + s.cores
            if all(used[name] <= room[name] for name in used):
                yield list(seq)


def exhaustive_pipeline(
    table: LatencyTable | Mapping[tuple[str, int], Sequence[float]],
    groups: Sequence[ProcessorGroup],
    *,
    max_stages: int = 3,
    transfer_ms: Sequence[float] | None = None,
    handoff: HandOff | None = None,
    available: Iterable[int] | None = None,
) -> PipelinePlan:
    """The best pipeline of at most ``max_stages`` non-empty stages, by enumeration.

    Every order of groups, every core count per stage and every cut is tried, so the cost grows
    as ``(configs ** max_stages) * C(n_layers - 1, max_stages - 1)``: a check for small tables.
    Ties keep the pipeline with fewer stages.
    """
    if isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1:
        raise PlannerError(f"max_stages must be a positive integer, got {max_stages!r}")
    costs = _prepare(table, groups, available, transfer_ms, handoff)
    n = costs.n
    best: tuple[float, list[StageConfig], list[int]] | None = None
    for configs in _stage_options(groups, min(max_stages, n)):
        p = len(configs)
        combos = list(itertools.combinations(range(1, n), p - 1))
        inner = np.array(combos, dtype=np.int64).reshape(len(combos), p - 1)
        cuts = np.concatenate(
            [np.zeros((len(inner), 1), np.int64), inner, np.full((len(inner), 1), n)], axis=1
        )
        # every stage here has layers: the hand-off floor of p stages holds for all cuts
        worst = np.full(len(cuts), costs.handoff.min_cycle_ms(p))
        for i, c in enumerate(configs):
            worst = np.maximum(worst, costs.stage_matrix(c)[cuts[:, i], cuts[:, i + 1]])
        j = int(np.argmin(worst))
        if best is None or worst[j] < best[0]:
            best = (float(worst[j]), configs, [int(x) for x in cuts[j]])
    assert best is not None
    return _plan(costs, groups, best[1], best[2], f"exhaustive<={max_stages}")


def _dp_work(n_layers: int, groups: Sequence[ProcessorGroup]) -> int:
    """:func:`optimal_pipeline`'s work: (layers ** 2) * stage configs * states of used cores
    * stage counts."""
    configs = sum(g.most_stage_cores for g in groups)
    return (
        n_layers
        * n_layers
        * configs
        * math.prod(g.most_stage_cores + 1 for g in groups)
        * (configs + 1)
    )


def optimal_pipeline(
    table: LatencyTable | Mapping[tuple[str, int], Sequence[float]],
    groups: Sequence[ProcessorGroup],
    *,
    transfer_ms: Sequence[float] | None = None,
    handoff: HandOff | None = None,
    available: Iterable[int] | None = None,
) -> PipelinePlan:
    """The pipeline with the lowest bottleneck over any number of stages, by dynamic programming.

    Cores of one group are alike, so a pipeline's remaining choices depend only on how many
    layers are placed, how many cores of each group (and whether each GPU) are taken and how
    many stages there are (the hand-off floor, :meth:`HandOff.min_cycle_ms`, grows with them):
    the best bottleneck of layers ``[0, k)`` on ``u`` used cores in ``s`` stages is
    ``min over j, stage config c of max(best[j, u - c, s - 1], stage(c, j, k))``, and the
    answer the lowest ``max(best[n, u, s], min_cycle(s))``. That is
    ``O(n_layers ** 2 * configs * prod(cores + 1) * stages)`` time: every table the heuristic
    is for. Ties keep the first pipeline found (fewer layers in the last stage, fewer stages).
    """
    costs = _prepare(table, groups, available, transfer_ms, handoff)
    n = costs.n
    caps = [g.most_stage_cores for g in groups]
    most_stages = sum(caps)  # every stage takes a core (or the GPU)
    dims = (*(c + 1 for c in caps), most_stages + 1)
    g_axes = len(caps)
    configs = [(gi, c) for gi, g in enumerate(groups) for c in range(1, caps[gi] + 1)]
    best = np.full((n + 1, *dims), np.inf)
    best[(0,) * (g_axes + 2)] = 0.0
    # how each state was reached: (previous layer count j, config index), -1 for none
    from_j = np.full((n + 1, *dims), -1, dtype=np.int64)
    from_c = np.full((n + 1, *dims), -1, dtype=np.int64)
    for k in range(1, n + 1):
        for ci, (gi, c) in enumerate(configs):
            # one value per start j < k
            stage = costs.stage_matrix(StageConfig(groups[gi].name, c))[:k, k]
            src = [slice(None)] * g_axes + [slice(0, most_stages)]
            dst = [slice(None)] * g_axes + [slice(1, most_stages + 1)]
            src[gi], dst[gi] = slice(0, caps[gi] + 1 - c), slice(c, caps[gi] + 1)
            cand = np.maximum(best[(slice(0, k), *src)], stage.reshape((k,) + (1,) * (g_axes + 1)))
            j = np.argmin(cand, axis=0)
            val = np.take_along_axis(cand, j[None], 0)[0]
            cur = best[(k, *dst)]
            better = val < cur
            cur[better] = val[better]
            from_j[(k, *dst)][better] = j[better]
            from_c[(k, *dst)][better] = ci
    floor = np.array([costs.handoff.min_cycle_ms(st) for st in range(most_stages + 1)])
    state = np.unravel_index(int(np.argmin(np.maximum(best[n], floor))), dims)
    k = n
    seq: list[StageConfig] = []
    cuts = [n]
    while k > 0:
        j, ci = int(from_j[(k, *state)]), int(from_c[(k, *state)])
        gi, c = configs[ci]
        seq.append(StageConfig(groups[gi].name, c))
        cuts.append(j)
        state = (
            *(int(u) - (c if i == gi else 0) for i, u in enumerate(state[:-1])),
            int(state[-1]) - 1,
        )
        k = j
    return _plan(costs, groups, seq[::-1], cuts[::-1], "optimal")
