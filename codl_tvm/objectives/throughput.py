"""The throughput objective: compile a model into a pipeline of stages on processor groups.

``codl-tvm compile MODEL --objective throughput --groups big:0-7,little:8-11,gpu`` calls
:func:`compile_throughput` with one :class:`ThroughputOptions`, in phases:

1. **resolve**: the processor groups are read and checked against this machine's cores
   (:func:`~codl_tvm.core.groups.parse_groups`) and each CPU group's instruction set chosen
   (:func:`~codl_tvm.build.stage_targets.resolve_isas`; a group named ``little`` is built for
   ``x86-64-v2`` on x86-64 unless ``isa`` says otherwise, which is logged) before anything is
   measured or built;
2. **plan**: the time matrix (ms of every layer on every (group, core count)) is measured on this
   machine (:func:`~codl_tvm.profiling.layers.measure_layers`), or predicted by a fitted Pipe-it
   model (:class:`~codl_tvm.planner.stages.layer_model.PipeModel`, ``pipe_model``); the stream
   executor's hand-off cost per stage is measured here
   (:func:`~codl_tvm.profiling.layers.measure_handoff`), and Pipe-it's search
   (:func:`~codl_tvm.planner.stages.search.search_pipeline`) picks the stages with it counted;
   with ``stage_rounds`` (opt-in) the chosen stages are then timed running together and the
   search repeated on those measurements
   (:func:`~codl_tvm.planner.stages.refine.refine_with_stages`): a stage of many layers runs
   slower than the sum of its layers timed one by one, but on an emulated SoC the plans it kept
   streamed slower than the plans on the loaded matrix (docs/benchmarks.md);
3. **build**: the stages are built, each for its group, into one pipeline artifact
   (:func:`~codl_tvm.objectives.stage_build.build_pipeline`) with the latencies the search used
   and, unless ``reference`` is off, the unpartitioned model's outputs on seeded inputs, which
   ``codl-tvm run OUT/`` checks the pipeline against.

With ``verify_frames`` (``--verify N``) the table is not trusted to rank plans (streams measured
0.3-0.9 of the rates tables promise, and not in the tables' order): the layers are timed both
under load and alone, the plan searched on each and the whole model as one stage on the group
where it runs fastest are built, each streams ``N`` frames here in rotated rounds, and the one
with the highest median steady rate is kept (:func:`verify_throughput`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from codl_tvm.build.stage_targets import ISA_NOTES, ISAS, resolve_isas
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup, parse_groups
from codl_tvm.frontend.importer import OnnxModel, load_onnx, random_inputs
from codl_tvm.objectives.stage_build import (
    Reference,
    build_pipeline,
    check_pipeline_out,
    compute_reference,
    install_pipeline,
    layer_shapes,
)
from codl_tvm.options import OptionsError
from codl_tvm.passes.stages import layer_starts
from codl_tvm.planner.stages.layer_model import PipeModel
from codl_tvm.planner.stages.refine import refine_with_stages
from codl_tvm.planner.stages.search import BALANCERS, search_pipeline
from codl_tvm.planner.stages.table import HandOff, LatencyTable, PipelinePlan, PipelineStage
from codl_tvm.profiling.layers import (
    build_layer_libraries,
    measure_handoff,
    measure_layers,
    stage_timer,
)
from codl_tvm.runtime.staged_artifact import PIPELINE_MANIFEST, Pipeline, load_pipeline

__all__ = [
    "Candidate",
    "ThroughputOptions",
    "compile_throughput",
    "one_stage_plan",
    "parse_isa",
    "stream_rate",
    "verify_throughput",
]

logger = logging.getLogger(__name__)


def parse_isa(spec: str | None) -> dict[str, str]:
    """Read ``"little=x86-64-v2,big=host"`` (group name = instruction-set preset).

    Raises
    ------
    PlannerError
        An item that is not ``NAME=ISA``.
    """
    out: dict[str, str] = {}
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        name, sep, isa = item.partition("=")
        if not sep or not name.strip() or not isa.strip():
            raise PlannerError(f"instruction sets {spec!r}: expected GROUP=ISA, got {item!r}")
        out[name.strip()] = isa.strip()
    return out


@dataclass(frozen=True)
class ThroughputOptions:
    """How :func:`compile_throughput` plans and builds a pipeline (checked when made).

    Attributes
    ----------
    groups
        Processor groups, ``"big:0-7,little:8-11,gpu"`` (see
        :func:`~codl_tvm.core.groups.parse_groups`).
    isa
        Instruction set per CPU group, a name of
        :data:`~codl_tvm.build.stage_targets.ISAS` (default: ``x86-64-v2`` for a group named
        ``little`` on x86-64, the little cores of an emulated big.LITTLE SoC; else ``host``).
    pipe_model
        A fitted Pipe-it model (JSON) to predict layer latencies with, instead of measuring.
    balance
        The search's cut balancer (``"exact"`` or ``"pipe-it"``).
    number, repeat
        Timing of each layer when measuring (``time_evaluator``'s ``number`` and ``repeat``).
    handoff
        Measure the stream executor's cost per stage and let the search count it (fewer,
        larger stages where stages are short); False plans on the layers' latencies alone.
    under_load
        Time each layer while every other core of the groups runs the model's layers, as the
        other stages of a stream keep them busy (shared caches and memory bandwidth); False:
        each layer alone, as Pipe-it (:func:`~codl_tvm.profiling.layers.measure_layers`).
        docs/benchmarks.md streams the plans of both.
    stage_rounds
        On a measured matrix, the most pipelines whose stages are timed running together
        before the search's choice (:func:`~codl_tvm.planner.stages.refine.refine_with_stages`);
        0 (the default) plans on the sums of the layers' latencies, as Pipe-it: on an emulated
        SoC the refined plans streamed 0.84x the loaded matrix's on average.
    force
        Replace an existing pipeline artifact.
    verify_frames
        0: build the plan searched on the one table. Else (at least 2) frames each candidate
        streams per round (:func:`verify_throughput`; ``under_load`` is then moot: both
        tables are measured).
    verify_rounds
        Rounds of streaming every candidate once, in rotated order (the median rate counts).
    seed
        Seed of the reference inputs and of the random frames streamed with ``verify_frames``.
    reference
        Store seeded inputs and the unpartitioned model's outputs on the host CPU in the
        artifact (``reference.npz``), which ``codl-tvm run OUT/`` checks the pipeline against
        (one more build of the model).

    Raises
    ------
    OptionsError
        A field out of range or fields that contradict each other (the message names them).
    """

    groups: str
    isa: Mapping[str, str] = field(default_factory=dict)
    pipe_model: str | None = None
    balance: str = "exact"
    number: int = 3
    repeat: int = 3
    handoff: bool = True
    under_load: bool = True
    stage_rounds: int = 0
    force: bool = False
    verify_frames: int = 0
    verify_rounds: int = 3
    seed: int = 0
    reference: bool = True

    def __post_init__(self) -> None:
        if not self.groups or not self.groups.strip():
            raise OptionsError(
                "groups is empty: give at least one, e.g. 'big:0-3,gpu'", ("groups",)
            )
        for name, isa in dict(self.isa).items():
            if isa not in ISAS:
                raise OptionsError(
                    f"isa: group {name!r}: unknown instruction set {isa!r} (choose from "
                    f"{', '.join(ISAS)})",
                    ("isa",),
                )
        if self.balance not in BALANCERS:
            raise OptionsError(
                f"balance must be one of {', '.join(BALANCERS)}, got {self.balance!r}", ("balance",)
            )
        if self.number < 1 or self.repeat < 1:
            raise OptionsError(
                f"number and repeat must be >= 1, got {self.number}, {self.repeat}",
                ("number", "repeat"),
            )
        if self.stage_rounds < 0:
            raise OptionsError(
                f"stage_rounds must be >= 0, got {self.stage_rounds}", ("stage_rounds",)
            )
        if self.stage_rounds and self.pipe_model:
            raise OptionsError(
                "stage_rounds times the stages here; pipe_model predicts the layers: give one",
                ("stage_rounds", "pipe_model"),
            )
        if self.verify_frames == 1 or self.verify_frames < 0:
            raise OptionsError(
                f"verify_frames must be 0 (no verification) or >= 2 (the steady rate is timed "
                f"between the first output and the last), got {self.verify_frames}",
                ("verify_frames",),
            )
        if self.verify_rounds < 1:
            raise OptionsError(
                f"verify_rounds must be >= 1, got {self.verify_rounds}", ("verify_rounds",)
            )


@dataclass(frozen=True)
class Candidate:
    """A plan ``verify_frames`` builds and streams.

    Attributes
    ----------
    name
        Where it came from: ``under-load``, ``alone`` (the plan searched on that table),
        ``one-stage`` (:func:`one_stage_plan`), or several joined by ``+`` where they are the
        same plan.
    plan
        The stages.
    latencies
        The manifest's ``latencies`` record of the table it was planned on.
    """

    name: str
    plan: PipelinePlan
    latencies: Mapping[str, Any]


def compile_throughput(
    model_path: str | Path, out: str | Path, options: ThroughputOptions
) -> PipelinePlan:
    """Plan and build ``model_path`` as a pipeline artifact in ``out``; return the plan.

    With ``options.verify_frames`` the candidates of :func:`verify_throughput` are built and
    streamed here and the fastest is kept (one log line per candidate and the kept one).

    Raises
    ------
    PlannerError
        Groups naming cores this machine does not have, instruction sets for unknown groups,
        or a Pipe-it model that lacks a group or layer type.
    ArtifactError
        ``out`` exists (without ``options.force``, or is not a pipeline artifact), checked
        before anything is measured.
    ModelError, BuildError
        As :func:`~codl_tvm.frontend.importer.load_onnx` and
        :func:`~codl_tvm.objectives.stage_build.build_pipeline`.
    """
    out = Path(out)
    check_pipeline_out(out, options.force)
    groups = _resolve_groups(options)
    model = load_onnx(model_path)
    handoff = measure_handoff() if options.handoff else HandOff()
    verifying = options.verify_frames != 0
    planned = _plans(model, groups, options, handoff, both=verifying)
    reference = None
    if options.reference:
        logger.info("computing the reference outputs (unpartitioned model, host CPU)")
        reference = compute_reference(model, options.seed)
    found = [
        Candidate(name, plan, _latencies(t, s, handoff)) for name, (plan, t, s) in planned.items()
    ]
    if not verifying:
        (kept,) = found
        build_pipeline(
            model,
            kept.plan,
            groups,
            out,
            isa=options.isa,
            force=options.force,
            extra={"latencies": kept.latencies},
            reference=reference,
        )
        return kept.plan
    # the one-stage candidate on the table of layers timed with nothing else running, as a
    # lone stage runs (a Pipe-it model predicts one table only)
    _, table, source = planned.get("alone", next(iter(planned.values())))
    one = one_stage_plan(model, table, groups, handoff)
    found.append(Candidate("one-stage", one, _latencies(table, source, handoff)))
    return verify_throughput(model, groups, out, _unique(found), options, reference).plan


def _resolve_groups(options: ThroughputOptions) -> tuple[ProcessorGroup, ...]:
    """The groups, checked against this machine, with every CPU group's instruction set
    checked; a default other than this CPU's (a group named ``little``) is logged."""
    groups = parse_groups(options.groups)
    isas = resolve_isas(groups, options.isa)
    for g in groups:
        if g.kind == "cpu" and g.name not in options.isa and isas[g.name] != "host":
            logger.info(
                "group %r is built for %s (%s), as the little cores of an emulated big.LITTLE "
                "SoC; give it instruction set 'host' to build it for this CPU",
                g.name,
                isas[g.name],
                ISA_NOTES.get(isas[g.name], "another instruction set"),
            )
    return groups


def _plans(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    options: ThroughputOptions,
    handoff: HandOff,
    both: bool,
) -> dict[str, tuple[PipelinePlan, LatencyTable, str]]:
    """The plans searched on each time matrix, ``{name: (plan, table, source)}``: one
    matrix, or with ``both`` (and no Pipe-it model) the layers timed under load and alone
    (built once, timed twice); on a measured matrix the plan's stages are measured
    (``options.stage_rounds``) and the table returned holds them."""
    if options.pipe_model:
        pipe_model = PipeModel.load(options.pipe_model)
        shapes = layer_shapes(model.mod)
        table = LatencyTable(
            pipe_model.latency_table(shapes, {g.name: g.most_stage_cores for g in groups}),
            [s.name for s in shapes],
        )
        plan = search_pipeline(table, groups, balance=options.balance, handoff=handoff)
        return {"predicted": (plan, table, f"predicted by {options.pipe_model}")}
    loads = (True, False) if both else (options.under_load,)
    work = Path(tempfile.mkdtemp(prefix="codl-profile-"))
    try:
        libs = build_layer_libraries(model, groups, work, isa=options.isa)
        measure = stage_timer(model, groups, libs) if options.stage_rounds else None
        out = {}
        for under_load in loads:
            table = measure_layers(
                model,
                groups,
                libs,
                number=options.number,
                repeat=options.repeat,
                under_load=under_load,
            )
            source = "measured on this machine" + (" under load" if under_load else "")
            if measure is None:
                plan = search_pipeline(table, groups, balance=options.balance, handoff=handoff)
            else:
                refined = refine_with_stages(
                    table,
                    groups,
                    measure,
                    handoff=handoff,
                    rounds=options.stage_rounds,
                    balance=options.balance,
                )
                plan, table = refined.plan, refined.table
                source += ", stages timed together"
            out["under-load" if under_load else "alone"] = (plan, table, source)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _latencies(table: LatencyTable, source: str, handoff: HandOff) -> dict[str, Any]:
    return {
        "source": source,
        "handoff_ms_per_stage": handoff.stage_ms,
        "layers": list(table.layer_names or ()),
        "ms": {f"{g}:{c}": [float(v) for v in table[(g, c)]] for g, c in table.keys()},
        # measured stages: [group, cores, first layer, stop layer, ms]
        "stages_ms": [[*key, ms] for key, ms in table.stage_ms.items()],
    }


def one_stage_plan(
    model: OnnxModel,
    table: LatencyTable,
    groups: Sequence[ProcessorGroup],
    handoff: HandOff | None = None,
) -> PipelinePlan:
    """The whole model as one stage, on all cores of the group where ``table`` says it runs
    fastest (a pipeline of one stage: what a stream gets without pipelining).

    Raises
    ------
    PlannerError
        A table of another number of layers than the model's, or one that lacks a group's
        all-cores entry.
    """
    handoff = handoff or HandOff()
    n = len(layer_starts(model.mod["main"]))
    if table.n_layers != n:
        raise PlannerError(f"the latency table has {table.n_layers} layers; the model has {n}")
    table.check(groups)
    ms = {
        g.name: table.stage_ms.get(
            (g.name, g.most_stage_cores, 0, n), float(np.sum(table[(g.name, g.most_stage_cores)]))
        )
        for g in groups
    }
    best = min(groups, key=lambda g: ms[g.name])
    stage = PipelineStage(
        best.name, best.most_stage_cores, best.cores, 0, n, ms[best.name] + handoff.stage_ms
    )
    return PipelinePlan((stage,), "one-stage", handoff.min_cycle_ms(1))


def _unique(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per plan (same :meth:`~PipelinePlan.describe`), its names joined, its
    record the first's."""
    by_plan: dict[str, Candidate] = {}
    for c in candidates:
        key = c.plan.describe()
        if key in by_plan:
            first = by_plan[key]
            by_plan[key] = Candidate(f"{first.name}+{c.name}", first.plan, first.latencies)
        else:
            by_plan[key] = c
    return list(by_plan.values())


def verify_throughput(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    out: str | Path,
    candidates: Sequence[Candidate],
    options: ThroughputOptions,
    reference: Reference | None = None,
) -> Candidate:
    """Build every candidate beside ``out``, stream them here, keep the fastest as ``out``.

    Each candidate is built into one temporary directory beside ``out``, streams a warm-up
    (a quarter of the frames, at least 2), then ``options.verify_rounds`` rounds stream
    ``options.verify_frames`` random frames through every candidate, the order rotated each
    round so that drift favours none. The candidate with the highest median steady rate is
    moved to ``out`` (an existing ``out`` is replaced only with ``options.force``, after the
    kept one is complete) with every candidate's plan, predicted and measured rates in its
    manifest's ``verify`` and ``reference`` as its reference; the others are removed.

    Raises
    ------
    PlannerError
        ``options.verify_frames`` is 0 (nothing to stream).
    ArtifactError
        ``out`` exists (without ``force``, or is not a pipeline artifact).
    BuildError
        A candidate failed to build (nothing is left behind).
    """
    if options.verify_frames == 0:
        raise PlannerError("verify_frames is 0: give the frames each candidate streams")
    out = Path(out)
    check_pipeline_out(out, options.force)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.verify-", dir=out.parent))
    try:
        paths = []
        for k, c in enumerate(candidates):
            path = work / f"candidate{k}"
            build_pipeline(
                model,
                c.plan,
                groups,
                path,
                isa=options.isa,
                extra={"latencies": c.latencies},
                reference=reference,
            )
            paths.append(path)
        frames = _frames(model, options.verify_frames, options.seed)
        samples = _stream_rounds(paths, frames, options.verify_rounds)
        rates = [float(np.median(v)) for v in samples]
        best = int(np.argmax(rates))
        for k, c in enumerate(candidates):
            logger.info(
                "verify: %s: %s predicted %.1f, streamed %.1f frames/s (median of %d rounds of "
                "%d frames)",
                c.name,
                c.plan.describe(),
                c.plan.throughput_fps,
                rates[k],
                options.verify_rounds,
                options.verify_frames,
            )
        logger.info(
            "verify: keeping %s: %s", candidates[best].name, candidates[best].plan.describe()
        )
        record = _verify_record(candidates, rates, samples, best, options)
        _add_to_manifest(paths[best], {"verify": record})
        install_pipeline(paths[best], out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return candidates[best]


def _verify_record(
    candidates: Sequence[Candidate],
    rates: Sequence[float],
    samples: Sequence[Sequence[float]],
    best: int,
    options: ThroughputOptions,
) -> dict[str, Any]:
    """The manifest's ``verify``: every candidate's plan, predicted and streamed rates."""
    return {
        "frames": options.verify_frames,
        "rounds": options.verify_rounds,
        "on": "this machine",
        "candidates": [
            {
                "name": c.name,
                "describe": c.plan.describe(),
                "predicted_fps": c.plan.throughput_fps,
                "measured_fps": rates[k],
                "samples_fps": list(samples[k]),
            }
            for k, c in enumerate(candidates)
        ],
        "kept": candidates[best].name,
    }


def _frames(model: OnnxModel, count: int, seed: int) -> list[list[np.ndarray]]:
    # a few distinct frames repeated: what a frame holds does not change a CNN's time
    distinct = [random_inputs(model, seed + i) for i in range(min(count, 4))]
    return [[distinct[i % len(distinct)][s.name] for s in model.inputs] for i in range(count)]


def stream_rate(pipe: Pipeline, frames: Sequence[Any]) -> float:
    """Steady frames/s of ``frames`` streamed through ``pipe`` (its stages pinned to their
    cores)."""
    with pipe.stream(frames) as stream:
        for _ in stream:
            pass
        return stream.stats().steady_frames_per_s


def _stream_rounds(paths: Sequence[Path], frames: Sequence[Any], rounds: int) -> list[list[float]]:
    """Steady rates of every artifact per round (in ``paths`` order), after a warm-up."""
    pipes = [load_pipeline(path) for path in paths]
    warm = frames[: max(2, len(frames) // 4)]
    for pipe in pipes:
        stream_rate(pipe, warm)
    samples: list[list[float]] = [[] for _ in pipes]
    for r in range(rounds):
        for i in range(len(pipes)):
            k = (i + r) % len(pipes)
            samples[k].append(stream_rate(pipes[k], frames))
    return samples


def _add_to_manifest(path: Path, fields: Mapping[str, Any]) -> None:
    mpath = path / PIPELINE_MANIFEST
    manifest = json.loads(mpath.read_text())
    manifest.update(fields)
    tmp = mpath.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, mpath)
