"""HOPE's exact placement: its ILP solved with OR-Tools CP-SAT, piece by piece on large graphs.

Owns :func:`solve_exact` (placement and per-processor order of minimum makespan, with optional
intervals and no-overlap constraints; a time limit returns the best schedule found and its
proven gap) and HOPE's upward-rank partitioning (Algorithm 1, :func:`partition_by_upward_rank`),
which cuts a graph above ``max_nodes`` into pieces solved in order. OR-Tools is optional:
:class:`SolverMissingError` says how to install it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from codl_tvm.core.errors import CodlError, PlannerError
from codl_tvm.planner.placement.graph import PROCESSORS, SPLIT, OpGraph
from codl_tvm.planner.placement.heuristics import greedy_schedule
from codl_tvm.planner.placement.schedule import (
    Schedule,
    ScheduleTimer,
    lower_bound_ms,
    simulate,
    upward_ranks,
)

__all__ = [
    "DEFAULT_MAX_NODES",
    "DEFAULT_TIME_LIMIT_S",
    "SolverMissingError",
    "partition_by_upward_rank",
    "solve_exact",
]

DEFAULT_MAX_NODES = 24  # pieces CP-SAT proves optimal in well under a second (HOPE cuts at 12)
DEFAULT_TIME_LIMIT_S = 3.0  # with the greedy hint (~2 s on 81 nodes), about 5 s per model
_TICKS = 1_000_000  # CP-SAT works in integers: the horizon is cut into this many ticks
_EPS = 1e-9


class SolverMissingError(CodlError, ImportError):
    """The exact placement needs a solver package that is not installed."""


def partition_by_upward_rank(
    graph: OpGraph, max_nodes: int = DEFAULT_MAX_NODES, balance: float = 0.2
) -> list[list[int]]:
    """Cut ``graph`` into pieces of at most ``max_nodes`` nodes, in dependency order.

    A node's upward rank is the longest path (in nodes) from a source to it. A piece is cut in
    two at the rank threshold that keeps both halves within ``(1 + balance) * |V| / 2`` nodes and
    has the fewest nodes with a reader on the other side (the vertex cut); with no balanced
    threshold the balance is relaxed by 0.1 until one exists, and a piece with a single rank
    level is cut in the middle of its nodes. Every edge goes from an earlier piece to a later
    one or stays inside a piece (edges always increase the rank), so the pieces can be solved in
    order.
    """
    if max_nodes < 1:
        raise PlannerError(f"partition: max_nodes must be >= 1, got {max_nodes!r}")
    rank = upward_ranks(graph)

    def split(piece: list[int]) -> list[list[int]]:
        if len(piece) <= max_nodes:
            return [piece]
        ordered = sorted(piece, key=lambda i: (rank[i], i))
        inside = set(piece)
        levels = sorted({rank[i] for i in piece})
        best = None
        eps = balance
        while best is None and eps <= 1.0 + _EPS and len(levels) > 1:
            limit = (1.0 + eps) * len(piece) / 2
            for r in levels[:-1]:
                low = [i for i in ordered if rank[i] <= r]
                high = len(piece) - len(low)
                if len(low) > limit or high > limit:
                    continue
                low_set = set(low)
                cut = sum(
                    any(s in inside and s not in low_set for s in graph.succs(i)) for i in low
                )
                if best is None or cut < best[0]:
                    best = (cut, len(low))
            eps += 0.1
        at = best[1] if best is not None else len(ordered) // 2
        first = sorted(ordered[:at])
        second = sorted(ordered[at:])
        return split(first) + split(second)

    return split(list(range(len(graph))))


def _cp_model():
    try:
        # deferred: ortools is an optional, heavy dependency only the exact placement needs
        from ortools.sat.python import cp_model
    except ImportError:
        raise SolverMissingError(
            "the exact HOPE placement needs OR-Tools' CP-SAT solver: install the 'ortools' "
            "package (pip install ortools)"
        ) from None
    return cp_model


def _solve_piece(
    graph: OpGraph,
    piece: Sequence[int],
    fixed: ScheduleTimer,
    hint: Sequence[str],
    time_limit_s: float,
    workers: int,
):
    """Solve the nodes ``piece`` with the nodes ``fixed`` has timed kept as they are (each
    processor free from its last finish there). Returns ``(placement, start order, status,
    bound_ms)``."""
    cp_model = _cp_model()
    procs, finish, ready_at = fixed.procs, fixed.finish, fixed.ready
    nodes = list(piece)
    inside = set(nodes)
    # The horizon: the processors' release, all transfers and the slower latencies in sequence.
    horizon_ms = max(
        max(ready_at.values()),
        max((finish[j] for i in nodes for j in graph.preds(i) if j not in inside), default=0.0),
    )
    horizon_ms += sum(
        max(graph.nodes[i].latency_ms(p) for p in graph.nodes[i].choices()) for i in nodes
    )
    horizon_ms += sum(
        max(graph.cross_ms(j, i, p) for p in PROCESSORS) for i in nodes for j in graph.preds(i)
    )
    scale = _TICKS / horizon_ms if horizon_ms > 0 else 1.0

    def ticks(ms: float) -> int:
        return round(ms * scale)

    horizon = ticks(horizon_ms) + len(nodes) + 1
    m = cp_model.CpModel()
    # Per node one literal per choice, exactly one true: gpu[i], cpu[i] and, where the node
    # offers a split, split[i] (0 otherwise). Earlier pieces' nodes enter as constants.
    gpu: dict[int, Any] = {}
    cpu: dict[int, Any] = {}
    split: dict[int, Any] = {}
    start = {}
    end = {}
    per_proc: dict[str, list] = {p: [] for p in PROCESSORS}
    for i in nodes:
        node = graph.nodes[i]
        lits = {p: m.NewBoolVar(f"{p}_{i}") for p in node.choices()}
        m.AddExactlyOne(lits.values())
        gpu[i], cpu[i] = lits["gpu"], lits["cpu"]
        split[i] = lits.get(SPLIT, 0)
        s = start[i] = m.NewIntVar(0, horizon, f"s_{i}")
        e = end[i] = m.NewIntVar(0, horizon, f"e_{i}")
        for p, lit in lits.items():
            d = ticks(node.latency_ms(p))
            m.Add(e == s + d).OnlyEnforceIf(lit)
            for q in PROCESSORS if p == SPLIT else (p,):
                if d > 0:
                    m.Add(s >= ticks(ready_at[q])).OnlyEnforceIf(lit)
                    per_proc[q].append(m.NewOptionalFixedSizeIntervalVar(s, d, lit, f"{q}{p}_{i}"))
            m.AddHint(lit, hint[i] == p)
    for p in PROCESSORS:
        m.AddNoOverlap(per_proc[p])

    def placed(j: int, p: str):
        """Whether node j runs on p: a literal inside the piece, a constant before it."""
        if j in inside:
            return {"gpu": gpu, "cpu": cpu, SPLIT: split}[p][j]
        return int(procs[j] == p)

    for i in nodes:
        for j in graph.preds(i):
            # the transfer (and image conversion) each way: to the GPU, to the CPU
            to_gpu, to_cpu = (ticks(graph.cross_ms(j, i, p)) for p in ("gpu", "cpu"))
            end_j = end[j] if j in inside else ticks(finish[j])
            # the delay when the two run whole on different processors: the expressions are
            # 1 exactly then (i on the GPU, j on the CPU; the other way), <= 0 otherwise (a
            # split on either end has no transfer)
            gi, gj = placed(i, "gpu"), placed(j, "gpu")
            si, sj = placed(i, SPLIT), placed(j, SPLIT)
            m.Add(start[i] >= end_j)
            if to_gpu > 0:
                m.Add(start[i] >= end_j + to_gpu * (gi - gj - si - sj))
            if to_cpu > 0:
                m.Add(start[i] >= end_j + to_cpu * (gj - gi - si - sj))
        if graph.nodes[i].follows:
            # PlaceParts: the one processor the producers run whole on, else home (split
            # producers do not count). With home h and other o, the node is on o exactly when
            # some producer runs whole on o and none on h.
            h, o = graph.home, "cpu" if graph.home == "gpu" else "gpu"
            on_home = placed(i, h)
            preds = graph.preds(i)
            if not preds:
                m.Add(on_home == 1)
            for j in preds:
                m.Add(on_home >= placed(j, h))
                m.Add(on_home <= sum(placed(k, h) for k in preds) + 1 - placed(j, o))
            if preds:
                m.Add(on_home >= 1 - sum(placed(k, o) for k in preds))
    makespan = m.NewIntVar(0, horizon, "makespan")
    m.AddMaxEquality(makespan, [end[i] for i in nodes])
    m.Minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit_s))
    solver.parameters.num_workers = workers
    status = solver.Solve(m)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placement = {
            i: next(p for p in graph.nodes[i].choices() if solver.Value(placed(i, p)))
            for i in nodes
        }
        order = sorted(nodes, key=lambda i: (solver.Value(start[i]), solver.Value(end[i]), i))
        name = "optimal" if status == cp_model.OPTIMAL else "feasible"
    else:  # no solution within the limit: the hint (a heuristic's schedule)
        placement = {i: hint[i] for i in nodes}
        order = nodes
        name = "feasible"
    # the bound in ticks, less one tick per node of rounding
    bound = max(0.0, (solver.BestObjectiveBound() - len(nodes)) / scale)
    return placement, order, name, bound


def solve_exact(
    graph: OpGraph,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_nodes: int = DEFAULT_MAX_NODES,
    workers: int = 1,
    start: Sequence[str] | None = None,
) -> Schedule:
    """Placement and per-processor order of minimum makespan (HOPE's ILP, with CP-SAT).

    Parameters
    ----------
    graph
        The graph to place.
    time_limit_s
        Wall-clock budget of the whole solve (shared by the pieces in proportion to their
        nodes). When it runs out the best schedule found so far is returned, ``status``
        ``feasible``, with its proven lower bound; the solver starts from the greedy schedule,
        so there always is one.
    max_nodes
        Graphs with more nodes are cut by :func:`partition_by_upward_rank` and solved piece by
        piece (each with the earlier pieces fixed; the result is then optimal per piece only).
    workers
        CP-SAT search workers. One (the default) is deterministic: the same graph gives the same
        schedule. More may prove large graphs faster, but then two runs may return different
        schedules of the same makespan.
    start
        A placement to start from besides the greedy schedule (one choice per node, e.g. the
        CoDL planner's): the solver's hint is the faster of the two, and the result is never
        slower than either, even when the time limit or the pieces stop the proof.

    Returns
    -------
    Schedule
        Timed by :func:`simulate` from the solver's placement and order (in exact
        milliseconds; the solver itself works on a grid of the horizon / 10**6).
    """
    if not time_limit_s > 0:
        raise PlannerError(f"exact: time_limit_s must be > 0, got {time_limit_s!r}")
    if not isinstance(workers, int) or workers < 1:
        raise PlannerError(f"exact: workers must be a positive integer, got {workers!r}")
    n = len(graph)
    if n == 0:
        return simulate(graph, [], method="exact", status="optimal", bound_ms=0.0)
    greedy = greedy_schedule(graph)
    if start is not None:
        if len(start) != n or any(
            p not in graph.nodes[i].choices() and not graph.nodes[i].follows
            for i, p in enumerate(start)
        ):
            raise PlannerError("exact: start must give each node one of its choices")
        given = simulate(graph, start, method="exact")
        if given.makespan_ms < greedy.makespan_ms:
            greedy = given
    hint = greedy.processor
    pieces = partition_by_upward_rank(graph, max_nodes) if n > max_nodes else [list(range(n))]
    timer = ScheduleTimer(graph)  # the pieces solved so far, timed exactly
    statuses = []
    bound = 0.0
    for piece in pieces:
        placement, order, status, bound = _solve_piece(
            graph, piece, timer, hint, time_limit_s * len(piece) / n, workers
        )
        statuses.append(status)
        for i in order:
            timer.commit(i, timer.processor(i, placement[i]))
    schedule = timer.schedule("exact")
    if greedy.makespan_ms < schedule.makespan_ms:
        # the solver's grid rounds latencies; never return worse than the schedule it started from
        schedule = greedy
    if len(pieces) == 1:
        status = statuses[0]
        bound = max(bound, lower_bound_ms(graph))
    else:
        status = "optimal_pieces" if all(s == "optimal" for s in statuses) else "feasible"
        bound = lower_bound_ms(graph)
    if status == "optimal":
        bound = schedule.makespan_ms
    return Schedule(
        schedule.processor,
        schedule.start_ms,
        schedule.finish_ms,
        schedule.makespan_ms,
        "exact",
        status,
        min(bound, schedule.makespan_ms),
    )
