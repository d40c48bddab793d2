"""Pipe-it's heuristic stage search (section VI) and this project's extensions of it.

Owns the steps :func:`~codl_tvm.planner.stages.search.search_pipeline` runs on a
:class:`~codl_tvm.planner.stages.table.StageCosts`:

- Algorithm 1 (``_find_split``) and Algorithm 2 (:func:`work_flow`): the published pairwise
  balancing of one stage sequence's cuts (the exact alternative is
  :func:`~codl_tvm.planner.stages.exact.exact_cuts`);
- Algorithm 3 (:func:`merge_stage`): merges of adjacent stages of one cluster while Eq. 12 holds,
  or while the re-balanced bottleneck falls;
- the starting pipelines (:func:`start_orders`, :func:`alternating_starts`);
- the extensions: a local search over core counts and stage positions (:func:`local_search`) and
  its restarts from the neighbours of a pipeline's cluster blocks (:func:`coarse_restarts`).

:class:`SearchMemo` keeps what one search has worked out per stage sequence; every step is
deterministic, so the search is too.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.groups import ProcessorGroup
from codl_tvm.planner.stages.table import StageConfig, StageCosts

__all__ = [
    "ALTERNATING_BLOCKS",
    "Balancer",
    "SearchMemo",
    "alternating_starts",
    "coarse_restarts",
    "coarsened",
    "local_search",
    "merge_stage",
    "start_orders",
    "work_flow",
]

# The most stages per cluster of the alternating starts (alternating_starts): the optima on the
# emulated SoC's measured tables alternate the clusters in up to four blocks each.
ALTERNATING_BLOCKS = 4


def _find_split(
    costs: StageCosts, first: StageConfig, second: StageConfig, a: int, b: int, rest_ms: float
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


def work_flow(costs: StageCosts, configs: Sequence[StageConfig]) -> list[int]:
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


def _merges(
    configs: list[StageConfig], mergeable: set[str]
) -> Iterable[tuple[int, list[StageConfig]]]:
    """Every stage sequence one merge of two adjacent stages of one cluster away, with the
    index of the first merged stage."""
    for i in range(len(configs) - 1):
        x, y = configs[i], configs[i + 1]
        if x.group == y.group and x.group in mergeable:
            yield i, [*configs[:i], StageConfig(x.group, x.cores + y.cores), *configs[i + 2 :]]


Balancer = Callable[[StageCosts, Sequence[StageConfig]], list[int]]


@dataclass
class SearchMemo:
    """What one search has worked out, by stage sequence: the starts, merges, local moves and
    restarts revisit most sequences many times.

    ``balanced``: bottleneck and cuts once balanced; ``rank``: :func:`local_search`'s key;
    ``descent``: where :func:`local_search` ends from a sequence (the search is deterministic,
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
    costs: StageCosts, seq: Sequence[StageConfig], balance: Balancer, memo: SearchMemo
) -> tuple[float, list[int]]:
    """``seq``'s bottleneck and cuts once balanced, each sequence balanced once per search."""
    key = tuple(seq)
    found = memo.balanced.get(key)
    if found is None:
        cuts = balance(costs, seq)
        found = memo.balanced[key] = (costs.bottleneck(seq, cuts), cuts)
    return found[0], list(found[1])


def merge_stage(
    costs: StageCosts,
    configs: list[StageConfig],
    mergeable: set[str],
    balance: Balancer,
    memo: SearchMemo,
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


def local_search(
    costs: StageCosts,
    groups: Sequence[ProcessorGroup],
    configs: list[StageConfig],
    balance: Balancer,
    memo: SearchMemo,
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
        # (a measured SqueezeNet table, 0.92 of the optimum: splitting the little cluster
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


def coarsened(configs: Sequence[StageConfig], mergeable: set[str]) -> list[StageConfig]:
    """``configs`` with every run of adjacent stages of one cluster as one stage of their
    cores (the pipeline's blocks: what Algorithm 3's merges of those stages end in)."""
    out: list[StageConfig] = []
    for c in configs:
        if out and c.group in mergeable and out[-1].group == c.group:
            out[-1] = StageConfig(c.group, out[-1].cores + c.cores)
        else:
            out.append(c)
    return out


def coarse_restarts(
    costs: StageCosts,
    groups: Sequence[ProcessorGroup],
    configs: list[StageConfig],
    balance: Balancer,
    memo: SearchMemo,
) -> tuple[list[StageConfig], list[int]]:
    """The local search restarted from every neighbour of the best pipeline's cluster blocks
    (an extension of Pipe-it, ours, as :func:`local_search` is).

    A local move changes one stage, and every move is kept only when it lowers the bottleneck
    (or the next slowest stages): an optimum whose clusters alternate in other blocks is
    several moves away, through slower pipelines. On a measured Inception v1 table (58 layers,
    8 AVX-512 big + 7 AVX2 little cores) the local search stopped in
    ``little2 - big4 - big1 - big1 - big1 - little1 - big1 - little2 - little1 - little1``
    (blocks ``little2 - big7 - little1 - big1 - little4``), 0.979 of the optimum
    ``little2 - big4 - little3 - little1 - big1 - big1 - little1 - big1 - big1``. Here the
    pipeline is coarsened to its blocks (:func:`coarsened`), and the local search runs again
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
        for trial in _neighbours(coarsened(best[1], cpu_names), room, cpu_names):
            if tuple(trial) in tried:
                continue
            tried.add(tuple(trial))
            found, cuts = local_search(costs, groups, trial, balance, memo)
            bottleneck = costs.bottleneck(found, cuts)
            if bottleneck < best[0]:
                best = (bottleneck, found)
        if best is start:
            return best[1], _balanced(costs, best[1], balance, memo)[1]


def _interleavings(counts: dict[str, int]) -> Iterable[list[str]]:
    """Every distinct order of ``counts[name]`` copies of each name."""
    if not any(counts.values()):
        yield []
        return
    for name, n in counts.items():
        if n:
            for rest in _interleavings({**counts, name: n - 1}):
                yield [name, *rest]


def start_orders(
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


def alternating_starts(cpus: Sequence[ProcessorGroup]) -> Iterable[list[StageConfig]]:
    """Starts that alternate the clusters in a few blocks (an extension of Pipe-it).

    Where the single-core interleavings are too many to start from (:func:`start_orders`),
    the optima still alternate clusters in a few blocks (``little3 - big4 - little2 - big1 -
    little2 - big1 - big2`` on a 58-layer CNN, 8 big + 7 little cores): merges only join
    neighbours of one cluster and a local move changes one stage, so from those starts the
    search ends with each cluster in one run (0.94 of the optimum there). Each start here splits
    every cluster into ``blocks`` stages of near-equal core counts (the last cluster of the
    order into ``blocks`` or ``blocks - 1``, so the pipeline can begin and end on one cluster),
    the clusters in turn. :func:`~codl_tvm.planner.stages.search.search_pipeline` puts a GPU
    stage at their end only (its local search moves it): every slot of every start multiplied
    the search's time by the stage count.
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
