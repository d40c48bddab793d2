"""The throughput objective: compile a model into a pipeline of stages on processor groups.

``codl-tvm compile MODEL --objective throughput --groups big:0-7,little:8-11,gpu`` calls
:func:`compile_throughput` with one :class:`ThroughputOptions`:

1. the processor groups are read and checked against this machine's cores
   (:func:`~codl_tvm.planner.pipe_search.parse_groups`) before anything is measured or built;
2. the time matrix (ms of every layer on every (group, core count)) is measured on this machine
   (:func:`~codl_tvm.profiling.layers.profile_layers`), or predicted by a fitted Pipe-it model
   (:class:`~codl_tvm.planner.pipe_model.PipeModel`, ``--pipe-model FILE``);
3. the stream executor's hand-off cost per stage is measured on this machine
   (:func:`~codl_tvm.profiling.layers.measure_handoff`), and Pipe-it's search
   (:func:`~codl_tvm.planner.pipe_search.search_pipeline`) picks the stages with it counted;
4. the stages are built, each for its group, into one pipeline artifact
   (:func:`~codl_tvm.pipeline_build.build_pipeline`), which records the stages, the groups and
   the latencies the search used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from codl_tvm.errors import PlannerError
from codl_tvm.frontend import load_onnx
from codl_tvm.pipeline_build import build_pipeline, layer_shapes
from codl_tvm.planner.pipe_model import PipeModel
from codl_tvm.planner.pipe_search import (
    HandOff,
    LatencyTable,
    PipelinePlan,
    parse_groups,
    search_pipeline,
)
from codl_tvm.profiling.layers import measure_handoff, profile_layers

__all__ = ["ThroughputOptions", "compile_throughput", "parse_isa"]


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
    """How :func:`compile_throughput` plans and builds a pipeline.

    Attributes
    ----------
    groups
        Processor groups, ``"big:0-7,little:8-11,gpu"`` (see
        :func:`~codl_tvm.planner.pipe_search.parse_groups`).
    isa
        Instruction set per CPU group (default: ``x86-64-v2`` for ``little`` on x86-64, else the
        host's).
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
    force
        Replace an existing pipeline artifact.
    """

    groups: str
    isa: Mapping[str, str] = field(default_factory=dict)
    pipe_model: str | None = None
    balance: str = "exact"
    number: int = 3
    repeat: int = 3
    handoff: bool = True
    under_load: bool = True
    force: bool = False


def compile_throughput(
    model_path: str | Path, out: str | Path, options: ThroughputOptions
) -> PipelinePlan:
    """Plan and build ``model_path`` as a pipeline artifact in ``out``; return the plan.

    Raises
    ------
    PlannerError
        Groups naming cores this machine does not have, unknown instruction sets, or a Pipe-it
        model that lacks a group or layer type.
    ModelError, BuildError, ArtifactError
        As :func:`~codl_tvm.frontend.load_onnx` and
        :func:`~codl_tvm.pipeline_build.build_pipeline`.
    """
    groups = parse_groups(options.groups)
    model = load_onnx(model_path)
    if options.pipe_model:
        pipe_model = PipeModel.load(options.pipe_model)
        shapes = layer_shapes(model.mod)
        table = LatencyTable(
            pipe_model.latency_table(shapes, {g.name: g.most_stage_cores for g in groups}),
            [s.name for s in shapes],
        )
        source = f"predicted by {options.pipe_model}"
    else:
        table = profile_layers(
            model,
            groups,
            isa=options.isa,
            number=options.number,
            repeat=options.repeat,
            under_load=options.under_load,
        )
        source = "measured on this machine" + (" under load" if options.under_load else "")
    handoff = measure_handoff() if options.handoff else HandOff()
    plan = search_pipeline(table, groups, balance=options.balance, handoff=handoff)
    build_pipeline(
        model,
        plan,
        groups,
        out,
        isa=options.isa,
        force=options.force,
        extra={
            "latencies": {
                "source": source,
                "handoff_ms_per_stage": handoff.stage_ms,
                "layers": list(table.layer_names or ()),
                "ms": {f"{g}:{c}": [float(v) for v in table[(g, c)]] for g, c in table.keys()},
            }
        },
    )
    return plan
