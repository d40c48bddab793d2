"""Pipe-it's exact solvers: the optimal cuts of one stage sequence, and the optimal pipeline.

Owns the solvers the heuristic (:mod:`codl_tvm.planner.stages.heuristics`) is measured against
and falls back on:

- :func:`exact_cuts`: the cuts of a fixed stage sequence with the lowest bottleneck (what
  Pipe-it's Algorithm 2 approximates), by dynamic programming in ``O(stages * layers ** 2)``;
- :func:`exhaustive_pipeline`: every pipeline of up to ``max_stages`` stages (any order of groups,
  any core counts, every cut) enumerated: the check for small tables;
- :func:`optimal_pipeline`: the optimum over any number of stages, by dynamic programming over
  (layers placed, cores of each group used, stages); :func:`dp_work` is its cost, which
  :func:`~codl_tvm.planner.stages.search.search_pipeline` compares with its budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup
from codl_tvm.planner.stages.table import (
    HandOff,
    PipelinePlan,
    StageConfig,
    StageCosts,
    TableLike,
    plan_from_cuts,
    prepare_costs,
)

__all__ = ["dp_work", "exact_cuts", "exhaustive_pipeline", "optimal_pipeline"]


def exact_cuts(costs: StageCosts, configs: Sequence[StageConfig]) -> list[int]:
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
    table: TableLike,
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
    costs = prepare_costs(table, groups, available, transfer_ms, handoff)
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
    return plan_from_cuts(costs, groups, best[1], best[2], f"exhaustive<={max_stages}")


def dp_work(n_layers: int, groups: Sequence[ProcessorGroup]) -> int:
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
    table: TableLike,
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
    costs = prepare_costs(table, groups, available, transfer_ms, handoff)
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
    return plan_from_cuts(costs, groups, seq[::-1], cuts[::-1], "optimal")
