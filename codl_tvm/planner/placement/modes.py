"""Planner modes that place whole operators on the CPU or the GPU (HOPE and its baselines).

``plan_placement(mod, cost_model, mode)`` builds the module's operator graph
(:func:`~codl_tvm.planner.placement.graph.build_graph`), schedules it with the mode's method
(:mod:`codl_tvm.planner.placement.hope`) and returns what every planner mode returns: a
:class:`~codl_tvm.core.plan.PartitionPlan` and a :class:`~codl_tvm.planner.report.PlanReport`.

The plan states the placement the way the partitioning passes already build it: every operator
the graph places gets an :class:`~codl_tvm.core.plan.OpPartition` with ratio 1 (whole on the GPU)
or 0 (whole on the CPU), and ``home`` is the graph's; ``codl.PlaceParts`` puts the kernels between
them (bias adds, activations: with their producer; concats and residual adds: where all their
producers ran, else ``home``) exactly as the graph's super-ops and follow nodes assume.

Modes
-----
``hope``: the exact placement and order (:func:`~codl_tvm.planner.placement.hope.solve_exact`);
``hope_greedy``: HOPE's GS with its refinements
(:func:`~codl_tvm.planner.placement.hope.greedy_schedule`); ``starpu``: StarPU-like earliest finish;
``mosaic``: MOSAIC-like slices; ``codl_hope``: the exact placement where each operator may also be
split between the processors (its best CoDL split, Eq. 2, as a third choice), so one plan mixes
branches placed whole and split operators; CoDL's chains enter as one node each (the chain split, or
its operators whole) and CoDL's own plan is the exact solve's start, so ``codl_hope`` is never
predicted slower than CoDL's placement in the graph's timing model. :func:`make_plan` runs any mode,
these or the CoDL planner's (:func:`~codl_tvm.planner.split.search.plan_model`).

``auto`` (:func:`plan_auto`) plans with each of :data:`AUTO_CANDIDATES` (``codl``, ``hope``,
``hope_greedy``, ``codl_hope``) and keeps the plan of the lowest predicted latency, ``codl`` on a
tie; its report is the chosen plan's, with every candidate's prediction
(:attr:`~codl_tvm.planner.report.PlanReport.candidates`) and the reason in its notes. It is not
the default: ``codl``'s fall-back margin (``policy.MIN_PREDICTED_SPEEDUP``) was calibrated on
measured ``codl`` builds only, and the placement plans' measured latencies on the emulated SoC
are still to be benchmarked.

Every mode minimises the makespan with what a co-executed build pays beyond the cost model's
per-operator predictions (:attr:`PlacementConfig.costs`, by default those the cost model records for
the hardware it was fitted on: slower operators on each processor, a sync per edge across
processors), and a schedule no faster than the faster processor alone (its plain prediction: such a
plan is built for that processor alone) becomes that processor alone, so no placement mode predicts
a plan slower than the best single processor.

The plan's ``order`` is the schedule's :func:`dispatch_order`: the build issues the operators in
it (:class:`~codl_tvm.passes.order.OrderSplits`), so a GPU branch is enqueued before the host
runs a CPU branch beside it. The runtime still decides the rest (each GPU kernel starts when
the GPU is free, each CPU kernel waits only for the GPU results it reads), so the measured
latency follows the schedule only as far as the predictions hold.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import (
    ChainPlan,
    OpInfo,
    OpPartition,
    PartitionPlan,
    model_fingerprint,
    partitionable_ops,
)
from codl_tvm.cost_model.base import CostModel
from codl_tvm.planner.placement.exact import (
    DEFAULT_MAX_NODES,
    DEFAULT_TIME_LIMIT_S,
    solve_exact,
)
from codl_tvm.planner.placement.graph import (
    PROCESSORS,
    SPLIT,
    CoexecCosts,
    DagNode,
    OpGraph,
    build_graph,
)
from codl_tvm.planner.placement.heuristics import (
    DEFAULT_GREEDY_K,
    greedy_schedule,
    mosaic_schedule,
    starpu_schedule,
)
from codl_tvm.planner.placement.schedule import (
    Schedule,
    check_schedule,
    dispatch_order,
    simulate,
)
from codl_tvm.planner.report import Decision, PlanReport, PlanSummary, of_it_conversions
from codl_tvm.planner.split.config import MODES, PlannerConfig, ideal_latency
from codl_tvm.planner.split.predict import calibrated_model
from codl_tvm.planner.split.search import plan_model

__all__ = [
    "ALL_MODES",
    "AUTO_CANDIDATES",
    "PLACEMENT_MODES",
    "PlacementConfig",
    "PlacementSchedule",
    "dispatch_order",
    "make_plan",
    "plan_auto",
    "plan_placement",
    "schedule_placement",
]

PLACEMENT_MODES: tuple[str, ...] = ("hope", "hope_greedy", "starpu", "mosaic", "codl_hope")
#: The modes ``auto`` plans with, in the order ties go (today's default first).
AUTO_CANDIDATES: tuple[str, ...] = ("codl", "hope", "hope_greedy", "codl_hope")
ALL_MODES: tuple[str, ...] = (*MODES, *PLACEMENT_MODES, "auto")

# auto takes another mode's plan only when it is predicted faster by more than this fraction:
# plans of equal makespan (e.g. every mode keeping a chain on one processor) stay codl's.
_AUTO_TIE = 1e-6


@dataclass(frozen=True)
class PlacementConfig:
    """Settings of the placement modes.

    Parameters
    ----------
    greedy_k
        Ready operators HOPE's GS maps at once (``2**k`` mappings tried; HOPE: 4).
    time_limit_s
        Wall-clock budget of the exact solve; when it runs out the best schedule found is used
        and the report gives its proven gap.
    max_nodes
        Graphs with more nodes are cut by upward rank and solved piece by piece.
    workers
        CP-SAT search workers (1: deterministic plans; more may solve large graphs faster, but
        may return another schedule of the same makespan).
    costs
        What a co-executed build adds to the cost model's predictions
        (:class:`~codl_tvm.planner.placement.graph.CoexecCosts`), in the makespan every mode
        minimises; the single-processor latencies a plan is compared with keep the plain
        predictions. None: the costs the cost model's file records for the hardware it was
        fitted on (:meth:`~codl_tvm.planner.placement.graph.CoexecCosts.of`; the shipped
        ``emulated-soc-k12`` model carries them), else none; ``CoexecCosts()``: none.
    """

    greedy_k: int = DEFAULT_GREEDY_K
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    max_nodes: int = DEFAULT_MAX_NODES
    workers: int = 1
    costs: CoexecCosts | None = None

    def __post_init__(self) -> None:
        if self.costs is not None and not isinstance(self.costs, CoexecCosts):
            raise PlannerError(
                f"placement: costs must be a CoexecCosts, got {type(self.costs).__name__}"
            )
        if not isinstance(self.greedy_k, int) or not 1 <= self.greedy_k <= 12:
            raise PlannerError(
                f"placement: greedy_k must be an integer in 1..12, got {self.greedy_k!r}"
            )
        if not self.time_limit_s > 0:
            raise PlannerError(f"placement: time_limit_s must be > 0, got {self.time_limit_s!r}")
        if not isinstance(self.max_nodes, int) or self.max_nodes < 2:
            raise PlannerError(
                f"placement: max_nodes must be an integer >= 2, got {self.max_nodes!r}"
            )


def schedule_graph(
    graph: OpGraph, mode: str, placement: PlacementConfig, start: list[str] | None = None
) -> Schedule:
    """The schedule of ``graph`` by the method of a placement ``mode``, checked (``start``: a
    placement the exact solve starts from, see
    :func:`~codl_tvm.planner.placement.hope.solve_exact`)."""
    if mode in ("hope", "codl_hope"):
        s = solve_exact(
            graph, placement.time_limit_s, placement.max_nodes, placement.workers, start=start
        )
    elif mode == "hope_greedy":
        s = greedy_schedule(graph, placement.greedy_k)
    elif mode == "starpu":
        s = starpu_schedule(graph)
    elif mode == "mosaic":
        s = mosaic_schedule(graph)
    else:
        raise PlannerError(f"unknown placement mode {mode!r} (known: {', '.join(PLACEMENT_MODES)})")
    check_schedule(graph, s)
    return s


def _with_codl_chains(
    graph: OpGraph, codl_plan: PartitionPlan, codl_report: PlanReport
) -> tuple[OpGraph, dict[str, ChainPlan], list[str], list[str]]:
    """``graph`` with each of CoDL's chains contracted into one node that offers the chain's
    split (its Eq. 2 latency with sharing at entry and exit only) besides running its operators
    whole, and CoDL's own plan as a placement of that graph.

    Returns the graph, the chains by node name, the placement (a chain or an operator CoDL
    splits: split; one it runs whole: its processor) and notes on chains left out.
    """
    notes: list[str] = []
    chains: dict[str, ChainPlan] = {}
    for chain in codl_plan.chains:
        row = next((d for d in codl_report.decisions if d.ops == chain.ops), None)
        name = PartitionPlan.entry_name(chain)
        names = {n.name for n in graph.nodes}
        members = [graph.index(op) for op in chain.ops if op in names]
        if row is None or row.coexec_ms is None or len(members) != len(chain.ops):
            notes.append(f"codl_hope: chain {name} has no prediction in the graph; left out")
            continue
        node = DagNode(
            name,
            sum(graph.nodes[i].cpu_ms for i in members),
            sum(graph.nodes[i].gpu_ms for i in members),
            op=name,
            kind="chain",
            members=tuple(m for i in members for m in graph.nodes[i].members),
            split_ms=row.coexec_ms,
            split_dim=chain.dim.value,
            split_ratio=chain.ratio,
            split_conversion_ms=row.conversion_ms,
        )
        contracted = graph.contract(chain.ops, node)
        if contracted is None:
            notes.append(f"codl_hope: chain {name} is no path of the graph; left out")
            continue
        graph = contracted
        chains[name] = chain
    ratio = {e.op: e.ratio for e in codl_plan.ops}
    start: list[str] = []
    for node in graph.nodes:
        if node.name in chains:
            start.append(SPLIT)
        elif node.name in ratio and 0.0 < ratio[node.name] < 1.0 and node.split_ms is not None:
            start.append(SPLIT)
        elif node.name in ratio:
            start.append("gpu" if ratio[node.name] == 1.0 else "cpu")
        else:
            start.append(graph.home)
    return graph, chains, start, notes


def _status(s: Schedule) -> str:
    if s.method == "single_processor":
        return "one processor alone (no placement predicted faster)"
    if s.method != "exact":
        return f"{s.method} schedule"
    if s.status == "optimal":
        return "exact schedule, proven optimal"
    if s.status == "optimal_pieces":
        return f"exact schedule, optimal per upward-rank piece (gap to the lower bound {s.gap:.1%})"
    return f"exact schedule stopped by the time limit, proven gap {s.gap:.1%}"


@dataclass(frozen=True)
class PlacementSchedule:
    """A placement mode's schedule of a module (:func:`schedule_placement`).

    Attributes
    ----------
    graph
        The graph scheduled: CoDL's chains contracted (``codl_hope``) and
        :attr:`PlacementConfig.costs` applied.
    schedule
        Its checked schedule; every node on one processor when no placement was predicted
        faster than the faster processor alone.
    chains
        CoDL's chains by graph node name (``codl_hope``).
    single_ms
        Predicted latency of the model on each processor alone (the plain cost model's, as the
        single-processor builds run), by ``"cpu"`` / ``"gpu"``.
    notes, warnings
        Report notes, and the messages of warnings raised while reading the graph.
    """

    graph: OpGraph
    schedule: Schedule
    chains: dict[str, ChainPlan]
    single_ms: dict[str, float]
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def schedule_placement(
    mod,
    cost_model: CostModel,
    mode: str = "hope",
    config: PlannerConfig | None = None,
    model_name: str | None = None,
    placement: PlacementConfig | None = None,
) -> PlacementSchedule:
    """The schedule a placement ``mode`` gives ``mod`` (what :func:`plan_placement` turns into
    a plan); arguments as there.

    The mode minimises the makespan of the graph with :attr:`PlacementConfig.costs` applied
    (:meth:`~codl_tvm.planner.placement.graph.OpGraph.with_costs`); a schedule whose makespan is
    not below the faster processor alone (its plain prediction: a plan keeping every operator on one
    processor is built for that processor alone) is replaced by that processor alone.
    """
    if not isinstance(cost_model, CostModel):
        raise PlannerError(
            f"plan_placement needs a fitted CostModel, got {type(cost_model).__name__}"
        )
    if mode not in PLACEMENT_MODES:
        raise PlannerError(f"unknown placement mode {mode!r} (known: {', '.join(PLACEMENT_MODES)})")
    config = config or PlannerConfig()
    placement = placement or PlacementConfig()
    raw_model = cost_model
    cost_model, notes = calibrated_model(cost_model, config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = build_graph(mod, cost_model, config, splits=mode == "codl_hope")
    single = {p: graph.single_processor_ms(p) for p in PROCESSORS}
    chains: dict[str, ChainPlan] = {}
    start = None
    if mode == "codl_hope":
        # CoDL's chains as a choice, and CoDL's own plan as a start: the combined schedule is
        # never slower than CoDL's placement in the graph's timing model
        codl_plan, codl_report = plan_model(mod, raw_model, "codl", config, model_name)
        graph, chains, start, chain_notes = _with_codl_chains(graph, codl_plan, codl_report)
        notes.extend(chain_notes)
    plain = graph
    costs = placement.costs if placement.costs is not None else CoexecCosts.of(raw_model)
    if not costs.neutral:
        graph = graph.with_costs(costs)
        notes.append(
            f"co-execution costs in the makespan: CPU operators x{costs.cpu_factor:g}, GPU "
            f"operators x{costs.gpu_factor:g} + {costs.gpu_op_ms:g} ms, "
            f"+{costs.cross_edge_ms:g} ms per edge across processors"
        )
    schedule = schedule_graph(graph, mode, placement, start)
    best = min(PROCESSORS, key=lambda p: (single[p], p != graph.home))
    used = {schedule.processor[i] for i, n in enumerate(graph.nodes) if not n.follows}
    one_processor = len(used) <= 1 and SPLIT not in used
    if schedule.makespan_ms >= single[best] or one_processor:
        # a plan that keeps every operator on one processor is built for that processor
        # alone, which pays none of the co-execution costs: predict it plainly, and take the
        # faster processor when no placement is predicted faster than it
        if one_processor:
            notes.append(
                f"{mode}: every operator on the {best.upper()}, built and predicted as the "
                f"{best.upper()} alone ({single[best]:.3f} ms)"
            )
        else:
            notes.append(
                f"{mode}: the best placement found, {schedule.makespan_ms:.3f} ms with "
                f"co-execution costs, is no faster than the {best.upper()} alone "
                f"({single[best]:.3f} ms): every operator on the {best.upper()}"
            )
        graph = plain
        schedule = simulate(graph, [best] * len(graph), method="single_processor")
        check_schedule(graph, schedule)
    return PlacementSchedule(
        graph,
        schedule,
        chains,
        single,
        tuple(notes),
        tuple(dict.fromkeys(str(w.message) for w in caught)),
    )


def _chain_rows(
    mode: str, scheduled: PlacementSchedule, infos: dict[str, OpInfo], config: PlannerConfig
) -> tuple[list[OpPartition], list[ChainPlan], list[Decision]]:
    """The plan entries and report rows of CoDL's chains in a ``codl_hope`` schedule: a chain
    run split stays a chain; one run whole becomes its operators, each whole there."""
    graph, schedule = scheduled.graph, scheduled.schedule
    entries: list[OpPartition] = []
    chain_entries: list[ChainPlan] = []
    rows: list[Decision] = []
    for name, chain in scheduled.chains.items():
        i = graph.index(name)
        node = graph.nodes[i]
        p = schedule.processor[i]
        span = f"from {schedule.start_ms[i]:.3f} to {schedule.finish_ms[i]:.3f} ms"
        if p == SPLIT:
            chain_entries.append(chain)
            rows.append(
                Decision(
                    chain.ops,
                    chain.dim.value,
                    chain.ratio,
                    node.cpu_ms,
                    node.gpu_ms,
                    node.split_ms,
                    None,
                    None,
                    min(node.cpu_ms, node.gpu_ms) - node.split_ms,
                    f"{mode}: CoDL chain {chain.dim.value}@{chain.ratio:g} on both {span} "
                    f"({node.split_ms:.3f} ms with sharing at entry and exit"
                    f"{of_it_conversions(node.split_conversion_ms)}; whole CPU "
                    f"{node.cpu_ms:.3f}, GPU {node.gpu_ms:.3f} ms)",
                    conversion_ms=node.split_conversion_ms,
                )
            )
            continue
        crossing = _crossing_words(graph, schedule, i) if p == "gpu" else ""
        for op in chain.ops:
            dim = _entry_dim(infos[op], config)
            entries.append(OpPartition(op, dim, 1.0 if p == "gpu" else 0.0))
            rows.append(
                Decision(
                    (op,),
                    dim,
                    1.0 if p == "gpu" else 0.0,
                    None,
                    None,
                    None,
                    None,
                    None,
                    0.0,
                    f"{mode}: CoDL's chain {name} whole on {p.upper()} {span} ({node.cpu_ms:.3f} "
                    f"ms on the CPU, {node.gpu_ms:.3f} on the GPU for the chain{crossing})",
                )
            )
    return entries, chain_entries, rows


def _crossing(graph: OpGraph, schedule: Schedule, i: int) -> tuple[float, float]:
    """What node ``i``, run whole on the GPU, pays on its edges across processors: their delay
    (transfers and image conversions) and the image conversions of it, the pack of each
    tensor it reads from the CPU and the unpack of its result (once: the largest) for the
    CPU."""
    procs = schedule.processor
    into = [j for j in graph.preds(i) if procs[j] == "cpu"]
    out = [k for k in graph.succs(i) if procs[k] == "cpu"]
    moved = sum(graph.cross_ms(j, i, "gpu") for j in into)
    moved += max((graph.cross_ms(i, k, "cpu") for k in out), default=0.0)
    converted = sum(graph.conversion_ms(j, i, "gpu") for j in into)
    converted += max((graph.conversion_ms(i, k, "cpu") for k in out), default=0.0)
    return moved, converted


def _crossing_words(graph: OpGraph, schedule: Schedule, i: int) -> str:
    """``; 0.300 ms moving data from/to the CPU, 0.200 of it image conversions`` where node
    ``i`` on the GPU converts images on its edges across processors, else ``""`` (buffers'
    reasons as before)."""
    moved, converted = _crossing(graph, schedule, i)
    if not converted:
        return ""
    return f"; {moved:.3f} ms moving data from/to the CPU{of_it_conversions(converted)}"


def _entry_dim(info: OpInfo, config: PlannerConfig) -> str:
    """The dimension a whole operator's plan entry names: the first of ``config.dims`` it
    allows, else its first."""
    dims = [d.value for d in info.dims]
    return next((d for d in config.dims if d in dims), dims[0])


def _op_row(
    mode: str, scheduled: PlacementSchedule, info: OpInfo, config: PlannerConfig
) -> tuple[OpPartition | None, Decision]:
    """The plan entry (None: left out) and report row of one operator outside the chains."""
    graph, schedule = scheduled.graph, scheduled.schedule
    i = graph.index(info.name)
    node = graph.nodes[i]
    if node.op is None:
        return None, Decision(
            (info.name,),
            None,
            None,
            None,
            None,
            None,
            reason=f"{node.note}; left out of the plan, runs unsplit where its inputs were "
            "computed",
        )
    p = schedule.processor[i]
    span = f"from {schedule.start_ms[i]:.3f} to {schedule.finish_ms[i]:.3f} ms"
    if p == SPLIT:
        return OpPartition(info.name, node.split_dim, node.split_ratio), Decision(
            (info.name,),
            node.split_dim,
            node.split_ratio,
            node.cpu_ms,
            node.gpu_ms,
            node.split_ms,
            node.split_ms,
            None,
            min(node.cpu_ms, node.gpu_ms) - node.split_ms,
            f"{mode}: split {node.split_dim}@{node.split_ratio:g} on both {span} "
            f"({node.split_ms:.3f} ms with sharing{of_it_conversions(node.split_conversion_ms)}; "
            f"whole CPU {node.cpu_ms:.3f}, GPU {node.gpu_ms:.3f} ms)",
            conversion_ms=node.split_conversion_ms,
        )
    dim = _entry_dim(info, config)
    other = "cpu" if p == "gpu" else "gpu"
    # an operator on the GPU on images: the conversions of its edges across processors
    converted = _crossing(graph, schedule, i)[1] if p == "gpu" and config.images else None
    return OpPartition(info.name, dim, 1.0 if p == "gpu" else 0.0), Decision(
        (info.name,),
        dim,
        1.0 if p == "gpu" else 0.0,
        node.cpu_ms,
        node.gpu_ms,
        node.latency_ms(p),
        None,
        None,
        node.latency_ms(other) - node.latency_ms(p),
        f"{mode}: whole on {p.upper()} {span} ({node.latency_ms(p):.3f} ms; "
        f"{other.upper()} {node.latency_ms(other):.3f} ms"
        f"{_crossing_words(graph, schedule, i) if p == 'gpu' else ''})",
        conversion_ms=converted,
    )


def _placement_summary(
    scheduled: PlacementSchedule,
    n_ops: int,
    entries: Sequence[OpPartition],
    chain_entries: Sequence[ChainPlan],
) -> PlanSummary:
    cpu = scheduled.single_ms["cpu"]
    gpu = scheduled.single_ms["gpu"]
    return PlanSummary(
        predicted_ms=scheduled.schedule.makespan_ms,
        cpu_only_ms=cpu,
        gpu_only_ms=gpu,
        ideal_ms=ideal_latency(cpu, gpu),
        n_ops=n_ops,
        n_split_h=sum(0.0 < e.ratio < 1.0 and e.dim.value == "H" for e in entries),
        n_split_oc=sum(0.0 < e.ratio < 1.0 and e.dim.value == "OC" for e in entries),
        n_whole_cpu=sum(e.ratio == 0.0 for e in entries),
        n_whole_gpu=sum(e.ratio == 1.0 for e in entries),
        chain_lengths=tuple(len(c.ops) for c in chain_entries),
        n_unmodelled=n_ops - len(entries) - sum(len(c.ops) for c in chain_entries),
        home=scheduled.graph.home,
    )


def _status_note(graph: OpGraph, schedule: Schedule) -> str:
    """The report's first note: the method, its status and each processor's busy time."""
    busy = {
        p: sum(
            schedule.finish_ms[i] - schedule.start_ms[i]
            for i in range(len(graph))
            if schedule.processor[i] in (p, SPLIT)
        )
        for p in ("cpu", "gpu")
    }
    return (
        f"{_status(schedule)}: makespan {schedule.makespan_ms:.3f} ms over {len(graph)} graph "
        f"nodes (CPU busy {busy['cpu']:.3f} ms, GPU busy {busy['gpu']:.3f} ms, transfers "
        "included in the makespan)"
    )


def plan_placement(
    mod,
    cost_model: CostModel,
    mode: str = "hope",
    config: PlannerConfig | None = None,
    model_name: str | None = None,
    placement: PlacementConfig | None = None,
) -> tuple[PartitionPlan, PlanReport]:
    """Place every operator of ``mod`` whole on the CPU or the GPU (``codl_hope``: or split)
    with a placement ``mode``.

    Parameters
    ----------
    mod
        The Relax module as imported.
    cost_model
        A fitted :class:`~codl_tvm.cost_model.CostModel` (calibrated with ``config``'s
        ``processor_scale`` and ``weight_gbps`` as the CoDL planner does).
    mode
        One of :data:`PLACEMENT_MODES`.
    config
        The planner config whose implementation choices and calibration the predictions use.
    model_name
        Recorded in the report.
    placement
        :class:`PlacementConfig` of the schedulers.

    Returns
    -------
    (PartitionPlan, PlanReport)
        Ratio 1 or 0 for every operator placed whole, the split's dimension and ratio for a
        split one (``codl_hope``); the report's predicted latency is the schedule's
        makespan (transfers included), each row's reason gives the operator's processor and time
        span, and the notes the method, its status and gap, and what the graph leaves out.
    """
    scheduled = schedule_placement(mod, cost_model, mode, config, model_name, placement)
    graph, schedule, chains = scheduled.graph, scheduled.schedule, scheduled.chains
    config = config or PlannerConfig()
    infos = partitionable_ops(mod)
    by_name = {info.name: info for info in infos}
    entries, chain_entries, rows = _chain_rows(mode, scheduled, by_name, config)
    chain_of = {op for chain in chains.values() for op in chain.ops}
    for info in infos:
        if info.name in chain_of:
            continue
        entry, row = _op_row(mode, scheduled, info, config)
        if entry is not None:
            entries.append(entry)
        rows.append(row)
    # a chain placed whole is issued as its operators, in chain order
    whole = {PartitionPlan.entry_name(c): c.ops for c in chains.values() if c not in chain_entries}
    order = tuple(
        op for entry in dispatch_order(graph, schedule) for op in whole.get(entry, (entry,))
    )
    plan = PartitionPlan(
        tuple(entries),
        tuple(chain_entries),
        model_fingerprint(mod, infos),
        home=graph.home,
        order=order,
    )
    plan.validate(mod)
    notes = [_status_note(graph, schedule), *scheduled.notes, *graph.notes]
    notes.extend(dict.fromkeys(scheduled.warnings))
    report = PlanReport(
        mode=mode,
        cost_model=cost_model.kind,
        decisions=tuple(rows),
        summary=_placement_summary(scheduled, len(infos), entries, chain_entries),
        notes=tuple(notes),
        model=model_name,
    )
    return plan, report


def make_plan(
    mod,
    cost_model: CostModel,
    mode: str = "codl",
    config: PlannerConfig | None = None,
    model_name: str | None = None,
    placement: PlacementConfig | None = None,
) -> tuple[PartitionPlan, PlanReport]:
    """Plan ``mod`` with any planner mode of :data:`ALL_MODES`: the CoDL planner's
    (:func:`~codl_tvm.planner.split.search.plan_model`) or a placement mode
    (:func:`plan_placement`)."""
    if mode == "auto":
        return plan_auto(mod, cost_model, config, model_name, placement)
    if mode in PLACEMENT_MODES:
        return plan_placement(mod, cost_model, mode, config, model_name, placement)
    if mode not in MODES:
        raise PlannerError(f"unknown planner mode {mode!r} (known: {', '.join(ALL_MODES)})")
    return plan_model(mod, cost_model, mode, config, model_name)


def plan_auto(
    mod,
    cost_model: CostModel,
    config: PlannerConfig | None = None,
    model_name: str | None = None,
    placement: PlacementConfig | None = None,
    candidates: tuple[str, ...] = AUTO_CANDIDATES,
) -> tuple[PartitionPlan, PlanReport]:
    """Plan ``mod`` with each mode of ``candidates`` and keep the lowest predicted latency.

    Every candidate predicts with the same calibrated cost model: CoDL's is the sum of its
    operators' (and chains') co-executed latencies, sharing included; the placement modes' the
    schedule's makespan, transfers included. A later candidate replaces an earlier one only
    when predicted faster by more than a relative 1e-6, so equal predictions keep the first
    (``codl``: today's default).

    Returns
    -------
    (PartitionPlan, PlanReport)
        The chosen plan and its report, with ``mode`` the chosen mode,
        :attr:`~codl_tvm.planner.report.PlanReport.candidates` every candidate's predicted
        latency (ms) and a first note saying why it was chosen.
    """
    if not candidates:
        raise PlannerError("auto: no candidate modes to plan with")
    bad = [m for m in candidates if m == "auto" or m not in ALL_MODES]
    if bad:
        raise PlannerError(
            f"auto: candidate modes {bad} are not among {', '.join(m for m in ALL_MODES[:-1])}"
        )
    results = {m: make_plan(mod, cost_model, m, config, model_name, placement) for m in candidates}
    predicted = {m: results[m][1].summary.predicted_ms for m in candidates}
    best = candidates[0]
    for m in candidates[1:]:
        if predicted[m] < predicted[best] * (1.0 - _AUTO_TIE):
            best = m
    plan, report = results[best]
    others = [m for m in candidates if m != best]
    runner_up = min(others, key=predicted.__getitem__) if others else None
    why = f"auto: {best} predicted {predicted[best]:.3f} ms, the lowest of {len(candidates)}"
    if runner_up is not None:
        ratio = predicted[runner_up] / predicted[best] if predicted[best] > 0 else float("inf")
        why += f" (next: {runner_up} {predicted[runner_up]:.3f} ms, {ratio:.3f}x)"
        if predicted[runner_up] <= predicted[best] * (1.0 + _AUTO_TIE):
            why += f"; a tie goes to the earlier of {', '.join(candidates)}"
    report = dataclasses.replace(report, notes=(why, *report.notes), candidates=predicted)
    return plan, report
