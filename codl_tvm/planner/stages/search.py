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

Inputs are a time matrix (:class:`~codl_tvm.planner.stages.table.LatencyTable`: ms of every
layer on every (group, core count), measured or predicted by
:mod:`codl_tvm.planner.stages.layer_model`) and the processor groups
(:class:`~codl_tvm.core.groups.ProcessorGroup`, :func:`~codl_tvm.core.groups.parse_groups` reads
``big:0-3,little:4-7,gpu``), which are checked against the machine's cores and the table before
any search runs.

This module is the public entry of the stage search (:func:`search_pipeline`,
:func:`optimal_pipeline`, :func:`exhaustive_pipeline`, :func:`recost_plan`) and re-exports the
names users import with them. The steps live by concern: the groups in
:mod:`codl_tvm.core.groups`; the table, costs and plans in :mod:`codl_tvm.planner.stages.table`;
Algorithms 1-3, the starts and the local search in :mod:`codl_tvm.planner.stages.heuristics`; the
exact solvers in :mod:`codl_tvm.planner.stages.exact`.

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
of groups, any core counts, every cut): the check the heuristic is measured against.
:func:`optimal_pipeline` finds the optimum over any number of stages by dynamic programming over
(layers placed, cores of each group used). On tables measured on a 16-core Xeon (five CNNs, 8 big +
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
from collections.abc import Iterable, Sequence

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import GROUP_KINDS, ProcessorGroup, check_groups, parse_groups
from codl_tvm.planner.stages import heuristics
from codl_tvm.planner.stages.exact import (
    dp_work,
    exact_cuts,
    exhaustive_pipeline,
    optimal_pipeline,
)
from codl_tvm.planner.stages.heuristics import Balancer, SearchMemo
from codl_tvm.planner.stages.table import (
    HandOff,
    LatencyTable,
    PipelinePlan,
    PipelineStage,
    StageConfig,
    StageCosts,
    TableLike,
    plan_from_cuts,
    prepare_costs,
)

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

# How search_pipeline cuts one stage sequence (see its ``balance`` argument).
BALANCERS = ("exact", "pipe-it")
# The most work (see dp_work) search_pipeline spends on the optimum over every stage sequence:
# two clusters of 8 cores and a GPU on a 300-layer model are ~4.5e9 (n * configs = 5100 numpy
# steps over arrays of 300 * 1458 states), a 58-layer CNN on 8 + 7 cores and a GPU ~1.3e8.
MAX_DP_WORK = 5_000_000_000

# Coarse restarts run from the local search's best ends of this many distinct block structures:
# from the best alone the heuristic stopped at 0.961 of the optimum on a measured AlexNet
# matrix (its best end's blocks ``big6 - little7 - big2`` are four coarse moves from the
# optimum's; the third-best end's ``little4 - big3 - little3 - big5`` one).
COARSE_STARTS = 3

# A pipeline the search found: its bottleneck, stage sequence and cuts.
_Found = tuple[float, list[StageConfig], list[int]]


def search_pipeline(
    table: TableLike,
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
        sequences). From the best alone it stops in a worse local optimum more often: on a
        measured SqueezeNet table 0.76 of the optimum's throughput, 1.0 from all of them.
    coarse_restarts
        With ``local_search``, then restart it from every neighbour of a pipeline's blocks
        (each run of one cluster's stages as one stage) while that lowers the bottleneck
        (:func:`~codl_tvm.planner.stages.heuristics.coarse_restarts`, an extension), from the
        local search's best ends of ``COARSE_STARTS`` distinct block structures. Without it the
        emulated SoC's Inception v1 table stopped at 0.979 (CPU groups) and 0.971 (all groups)
        of the optimum.
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
    costs = prepare_costs(table, groups, available, transfer_ms, handoff)
    exact_stages = exact_stages and balance == "exact"
    if balance not in BALANCERS:
        raise PlannerError(f"unknown balance {balance!r} (choose from {', '.join(BALANCERS)})")
    balancer = exact_cuts if balance == "exact" else heuristics.work_flow
    memo = SearchMemo()
    ranked = _merged_pipelines(costs, groups, max_starts, balancer, memo)
    best = ranked[0]  # check_groups refuses an empty list: there is one start at least
    if local_search:
        best = _locally_improved(
            costs, groups, ranked, balancer, memo, local_starts, coarse_restarts
        )
    if exact_stages and dp_work(costs.n, groups) <= MAX_DP_WORK:
        # the optimum over every stage sequence (optimal_pipeline) where it is cheap: the
        # heuristic's pipeline is kept unless the optimum's bottleneck is lower
        opt = optimal_pipeline(
            costs.table, groups, transfer_ms=transfer_ms, handoff=handoff, available=available
        )
        if opt.bottleneck_ms < best[0]:
            return dataclasses.replace(opt, method="pipe-it+optimal")
    return plan_from_cuts(costs, groups, best[1], best[2], "pipe-it")


def _merged_pipelines(
    costs: StageCosts,
    groups: Sequence[ProcessorGroup],
    max_starts: int,
    balancer: Balancer,
    memo: SearchMemo,
) -> list[_Found]:
    """Algorithm 3's pipelines from every start, each once, best first (first found first on
    a tie)."""
    cpus = [g for g in groups if g.kind == "cpu"]
    gpus = [g for g in groups if g.kind == "gpu"]
    mergeable = {g.name for g in cpus}
    found: dict[tuple[StageConfig, ...], _Found] = {}
    starts = [(start, True) for start in heuristics.start_orders(cpus, gpus, max_starts)]
    starts += [(start, False) for start in heuristics.alternating_starts(cpus)]
    for start, every_slot in starts:
        # every placement of the GPU stages among the CPU stages (or after them)
        slots_of = range(len(start) + 1) if every_slot else (len(start),)
        for slots in itertools.product(slots_of, repeat=len(gpus)):
            configs = list(start)
            for gpu, slot in sorted(zip(gpus, slots, strict=True), key=lambda gs: -gs[1]):
                configs.insert(slot, StageConfig(gpu.name, 1))
            configs, cuts = heuristics.merge_stage(costs, configs, mergeable, balancer, memo)
            found.setdefault(tuple(configs), (costs.bottleneck(configs, cuts), configs, cuts))
    return sorted(found.values(), key=lambda f: f[0])


def _locally_improved(
    costs: StageCosts,
    groups: Sequence[ProcessorGroup],
    ranked: Sequence[_Found],
    balancer: Balancer,
    memo: SearchMemo,
    local_starts: int | None,
    restarts: bool,
) -> _Found:
    """The best of ``ranked[0]``, the local search's ends from ``ranked[:local_starts]`` and,
    with ``restarts``, the coarse restarts from the best ends of ``COARSE_STARTS`` distinct
    block structures."""
    best = ranked[0]
    ends: dict[tuple[StageConfig, ...], _Found] = {}
    for _, start_configs, _ in ranked[:local_starts]:  # [:None]: every one
        configs, cuts = heuristics.local_search(costs, groups, start_configs, balancer, memo)
        bottleneck = costs.bottleneck(configs, cuts)
        ends.setdefault(tuple(configs), (bottleneck, configs, cuts))
        if bottleneck < best[0]:
            best = (bottleneck, configs, cuts)
    if not restarts:
        return best
    mergeable = {g.name for g in groups if g.kind == "cpu"}
    coarse_seen: set[tuple[StageConfig, ...]] = set()
    for _, end_configs, _ in sorted(ends.values(), key=lambda e: e[0]):
        blocks = tuple(heuristics.coarsened(end_configs, mergeable))
        if blocks in coarse_seen:
            continue
        coarse_seen.add(blocks)
        configs, cuts = heuristics.coarse_restarts(costs, groups, end_configs, balancer, memo)
        bottleneck = costs.bottleneck(configs, cuts)
        if bottleneck < best[0]:
            best = (bottleneck, configs, cuts)
        if len(coarse_seen) == COARSE_STARTS:
            break
    return best


def recost_plan(
    plan: PipelinePlan,
    table: TableLike,
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
    costs = StageCosts(table, transfer_ms, handoff)
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
