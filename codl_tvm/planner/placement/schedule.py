"""The timing model every placement method is scheduled and checked under.

Owns :class:`Schedule` (where and when every node of an
:class:`~codl_tvm.planner.placement.graph.OpGraph` runs), its check (:func:`check_schedule`), the
earliest-start timing of nodes dispatched one by one (:class:`ScheduleTimer`, :func:`simulate`),
a makespan no schedule beats (:func:`lower_bound_ms`) and the graph ranks the methods order
nodes by (:func:`bottom_levels`, :func:`upward_ranks`), and the order the host issues a
schedule's operators in (:func:`dispatch_order`). The model itself is described in
:mod:`codl_tvm.planner.placement.hope`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from codl_tvm.core.errors import PlannerError
from codl_tvm.planner.placement.graph import PROCESSORS, SPLIT, OpGraph

__all__ = [
    "Schedule",
    "ScheduleError",
    "ScheduleTimer",
    "bottom_levels",
    "check_schedule",
    "dispatch_order",
    "lower_bound_ms",
    "simulate",
    "upward_ranks",
]


class ScheduleError(PlannerError):
    """A schedule violates the timing model (the message lists the violations)."""


@dataclass(frozen=True)
class Schedule:
    """Where and when every node of an :class:`OpGraph` runs.

    Attributes
    ----------
    processor, start_ms, finish_ms
        Per node, in the graph's node order; the processor is ``"cpu"``, ``"gpu"`` or
        ``"both"`` (split, :data:`~codl_tvm.planner.placement.graph.SPLIT`).
    makespan_ms
        The latest finish.
    method
        ``exact``, ``greedy``, ``starpu`` or ``mosaic``; ``single_processor`` where a
        planner kept every node on one processor because no placement was predicted faster.
    status
        ``optimal`` (proven), ``optimal_pieces`` (each piece of a partitioned graph proven
        optimal given the earlier ones), ``feasible`` (a time limit stopped the proof) or
        ``heuristic``.
    bound_ms
        A proven lower bound on the makespan of any schedule (None for heuristics).
    """

    processor: tuple[str, ...]
    start_ms: tuple[float, ...]
    finish_ms: tuple[float, ...]
    makespan_ms: float
    method: str
    status: str = "heuristic"
    bound_ms: float | None = None

    @property
    def gap(self) -> float | None:
        """``(makespan - bound) / makespan``: 0 when proven optimal, None without a bound."""
        if self.bound_ms is None:
            return None
        if self.makespan_ms <= 0:
            return 0.0
        return max(0.0, (self.makespan_ms - self.bound_ms) / self.makespan_ms)

    def order(self, processor: str) -> list[int]:
        """The nodes ``processor`` runs (its parts of split nodes included), in start order."""
        nodes = [i for i, p in enumerate(self.processor) if p in (processor, SPLIT)]
        return sorted(nodes, key=lambda i: (self.start_ms[i], self.finish_ms[i], i))

    def placement(self, graph: OpGraph) -> dict[str, str]:
        """Node name -> processor."""
        return {n.name: p for n, p in zip(graph.nodes, self.processor, strict=True)}


def check_schedule(graph: OpGraph, schedule: Schedule, tol: float = 1e-6) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is valid for ``graph``.

    Checks each node's processor (and the follow rule), its duration, the precedence constraints
    with transfer delays, that no processor runs two nodes at once, and the makespan.
    """
    n = len(graph)
    problems: list[str] = []
    if not (len(schedule.processor) == len(schedule.start_ms) == len(schedule.finish_ms) == n):
        raise ScheduleError(f"schedule covers {len(schedule.processor)} nodes, graph has {n}")
    procs = schedule.processor
    for i, node in enumerate(graph.nodes):
        p = procs[i]
        if p not in node.choices() and not (node.follows and p in PROCESSORS):
            problems.append(f"{node.name}: cannot run on {p!r} (choices: {node.choices()})")
            continue
        if node.follows and p != graph.follow(i, procs):
            problems.append(
                f"{node.name}: on {p}, the follow rule puts it on {graph.follow(i, procs)}"
            )
        s, f = schedule.start_ms[i], schedule.finish_ms[i]
        if s < -tol:
            problems.append(f"{node.name}: starts at {s:.6g} < 0")
        if abs(f - s - node.latency_ms(p)) > tol * max(1.0, f):
            problems.append(
                f"{node.name}: runs {f - s:.6g} ms on {p}, predicted {node.latency_ms(p):.6g}"
            )
        for j in graph.preds(i):
            delay = graph.delay_ms(j, i, procs[j], p)
            if s + tol * max(1.0, s) < schedule.finish_ms[j] + delay:
                problems.append(
                    f"{node.name}: starts at {s:.6g}, before {graph.nodes[j].name} finishes at "
                    f"{schedule.finish_ms[j]:.6g} plus {delay:.6g} ms of transfer"
                )
    for p in PROCESSORS:
        busy = sorted(
            (schedule.start_ms[i], schedule.finish_ms[i], i)
            for i in range(n)
            if procs[i] in (p, SPLIT) and schedule.finish_ms[i] - schedule.start_ms[i] > tol
        )
        for (_, f0, a), (s1, _, b) in itertools.pairwise(busy):
            if s1 + tol * max(1.0, s1) < f0:
                problems.append(
                    f"{p}: {graph.nodes[a].name} (until {f0:.6g}) and {graph.nodes[b].name} "
                    f"(from {s1:.6g}) overlap"
                )
    makespan = max(schedule.finish_ms, default=0.0)
    if abs(makespan - schedule.makespan_ms) > tol * max(1.0, makespan):
        problems.append(f"makespan {schedule.makespan_ms:.6g}, latest finish {makespan:.6g}")
    if schedule.bound_ms is not None and schedule.bound_ms > makespan + tol * max(1.0, makespan):
        problems.append(f"lower bound {schedule.bound_ms:.6g} above the makespan {makespan:.6g}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ScheduleError(f"invalid {schedule.method} schedule: {'; '.join(problems[:5])}{more}")


class ScheduleTimer:
    """Earliest-start timing of nodes dispatched one by one (each appended to its processor).

    ``procs``, ``start`` and ``finish`` hold each dispatched node's processor and times (None
    and 0 before it is dispatched); ``ready`` when each processor is next free.
    """

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.procs: list[str | None] = [None] * len(graph)
        self.start = [0.0] * len(graph)
        self.finish = [0.0] * len(graph)
        self.ready = dict.fromkeys(PROCESSORS, 0.0)

    def copy(self) -> ScheduleTimer:
        """An independent copy (for trying a dispatch)."""
        other = ScheduleTimer.__new__(ScheduleTimer)
        other.graph = self.graph
        other.procs = list(self.procs)
        other.start = list(self.start)
        other.finish = list(self.finish)
        other.ready = dict(self.ready)
        return other

    def processor(self, i: int, wanted: str | None) -> str:
        """``wanted``, or the follow rule's processor for a follow node."""
        return self.graph.follow(i, self.procs) if self.graph.nodes[i].follows else wanted

    def end_on(self, i: int, p: str) -> tuple[float, float]:
        """(start, finish) of node ``i`` appended to processor ``p`` (or split) now."""
        g = self.graph
        t = 0.0
        for j in g.preds(i):
            if self.procs[j] is None:
                raise PlannerError(
                    f"schedule: {g.nodes[i].name} is dispatched before its producer "
                    f"{g.nodes[j].name}"
                )
            t = max(t, self.finish[j] + g.delay_ms(j, i, self.procs[j], p))
        lat = g.nodes[i].latency_ms(p)
        used = PROCESSORS if p == SPLIT else (p,)
        s = max(t, *(self.ready[q] for q in used)) if lat > 0 else t
        return s, s + lat

    def commit(self, i: int, p: str) -> None:
        """Dispatch node ``i`` on ``p`` (or split) at its earliest start."""
        self.procs[i] = p
        self.start[i], self.finish[i] = self.end_on(i, p)
        if self.finish[i] > self.start[i]:
            for q in PROCESSORS if p == SPLIT else (p,):
                self.ready[q] = self.finish[i]

    def schedule(
        self, method: str, status: str = "heuristic", bound_ms: float | None = None
    ) -> Schedule:
        """The nodes dispatched so far as a :class:`Schedule`."""
        return Schedule(
            tuple(self.procs),
            tuple(self.start),
            tuple(self.finish),
            max(self.finish, default=0.0),
            method,
            status,
            bound_ms,
        )


def simulate(
    graph: OpGraph,
    placement: Mapping[int, str] | Sequence[str],
    order: Sequence[int] | None = None,
    method: str = "heuristic",
    status: str = "heuristic",
    bound_ms: float | None = None,
) -> Schedule:
    """The earliest-start schedule of a placement, nodes dispatched in ``order``.

    Each node in ``order`` (a topological order; default: the graph's) starts when its inputs
    have arrived and its processor is free of the nodes dispatched before it. A follow node's
    processor is the follow rule's, whatever ``placement`` says.
    """
    n = len(graph)
    order = list(range(n)) if order is None else list(order)
    if sorted(order) != list(range(n)):
        raise PlannerError("simulate: order must list every node once")
    timer = ScheduleTimer(graph)
    for i in order:
        timer.commit(i, timer.processor(i, placement[i]))
    return timer.schedule(method, status, bound_ms)


def lower_bound_ms(graph: OpGraph) -> float:
    """A makespan no schedule beats: the longest path with every node at its fastest choice,
    and half the total work with every node at its least processor time (a split busies both
    processors), transfers free."""
    fastest = [min(n.latency_ms(p) for p in n.choices()) for n in graph.nodes]
    work = [
        min(n.cpu_ms, n.gpu_ms, math.inf if n.split_ms is None else 2 * n.split_ms)
        for n in graph.nodes
    ]
    path = [0.0] * len(graph)
    for i in range(len(graph)):
        path[i] = fastest[i] + max((path[j] for j in graph.preds(i)), default=0.0)
    return max(max(path, default=0.0), sum(work) / len(PROCESSORS))


def bottom_levels(graph: OpGraph) -> list[float]:
    """Each node's bottom level: the longest path from its start to the end of the graph, every
    node at its fastest choice, transfers free (HEFT's upward rank without communication)."""
    level = [0.0] * len(graph)
    for i in reversed(range(len(graph))):
        node = graph.nodes[i]
        fastest = min(node.latency_ms(p) for p in node.choices())
        level[i] = fastest + max((level[j] for j in graph.succs(i)), default=0.0)
    return level


def upward_ranks(graph: OpGraph) -> list[int]:
    """HOPE's upward rank: the longest path, in nodes, from a source to each node."""
    rank = [0] * len(graph)
    for i in range(len(graph)):
        rank[i] = 1 + max((rank[j] for j in graph.preds(i)), default=-1)
    return rank


def dispatch_order(graph: OpGraph, schedule: Schedule) -> tuple[str, ...]:
    """The order in which the host should issue the placed operators so ``schedule`` runs.

    The VM runs ``main`` in program order: a GPU kernel is only enqueued (it runs when the GPU
    is free), a CPU kernel runs on the host thread until it finishes. So a GPU node is issued as
    soon as the CPU nodes it waits for have finished (its *enqueue time*: the latest finish of
    its CPU producers and the enqueue times of its GPU producers), a CPU node at its start.
    Nodes are issued by that time, GPU first on ties, in a topological order that keeps the
    GPU's queue in the schedule's order (GPU and split nodes by start); a GPU node that starts
    while a CPU node runs is thus issued before it. Returns the plan operator names
    (:attr:`~codl_tvm.planner.placement.graph.DagNode.op`) in that order, for
    :class:`~codl_tvm.passes.order.OrderSplits`.
    """
    check_schedule(graph, schedule)
    n = len(graph)
    key = [0.0] * n
    for i in range(n):  # graph order is topological
        if schedule.processor[i] != "gpu":  # the host runs a split's CPU part itself
            key[i] = schedule.start_ms[i]
        else:
            key[i] = max(
                (
                    key[j] if schedule.processor[j] == "gpu" else schedule.finish_ms[j]
                    for j in graph.preds(i)
                ),
                default=0.0,
            )
    # The GPU runs its queue in order: the GPU lane's nodes (whole on the GPU or split) are
    # issued in the schedule's order on it, each after the one before, else a node enqueued
    # early would hold up the GPU work the schedule runs first.
    succs = [list(graph.succs(i)) for i in range(n)]
    waiting = [len(graph.preds(i)) for i in range(n)]
    lane = sorted(
        (i for i in range(n) if schedule.processor[i] != "cpu"),
        key=lambda i: (schedule.start_ms[i], i),
    )
    for a, b in itertools.pairwise(lane):
        key[b] = max(key[b], key[a])
        succs[a].append(b)
        waiting[b] += 1
    heap = [(key[i], schedule.processor[i] != "gpu", i) for i in range(n) if not waiting[i]]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        _, _, i = heapq.heappop(heap)
        if graph.nodes[i].op is not None:
            order.append(graph.nodes[i].op)
        for j in succs[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(heap, (key[j], schedule.processor[j] != "gpu", j))
    return tuple(order)
