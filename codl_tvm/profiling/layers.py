"""Pipe-it's time matrix measured on this machine: every layer on every (group, core count).

A layer is :func:`codl_tvm.passes.stages.layer_starts`'s (a major operator with the operators
after it). :func:`build_layer_libraries` builds ``main`` cut at every layer (one function per
layer) for the host and for each processor group's target; :func:`measure_layers` times each
layer on 1..n cores of each CPU group (a thread pinned to the group's first ``c`` cores with
its own ``c``-worker TVM pool) and on the GPU, and returns the
:class:`~codl_tvm.planner.pipe_search.LatencyTable` the stage search takes;
:func:`profile_layers` does both. Building and timing are apart so that a benchmark builds
many models in parallel and times them one at a time. :func:`layer_records` turns a table into
:class:`~codl_tvm.planner.pipe_model.PipeRecord` to fit Pipe-it's model (Eq. 5/8) on.

:func:`measure_handoff` measures what the stream executor (:mod:`codl_tvm.stream`) costs a
stage per frame beyond its layers, the :class:`~codl_tvm.planner.pipe_search.HandOff` the
search counts: the time matrix times layers alone.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.errors import PlannerError
from codl_tvm.frontend import OnnxModel
from codl_tvm.passes.stages import cut_stages, layer_starts, stage_name
from codl_tvm.pipeline_artifact import _device, pin_thread_pool
from codl_tvm.pipeline_build import (
    compile_library,
    group_target,
    layer_shapes,
    resolve_isas,
    stage_module,
)
from codl_tvm.planner.pipe_model import LayerShape, PipeRecord
from codl_tvm.planner.pipe_search import HandOff, LatencyTable, ProcessorGroup, check_groups
from codl_tvm.stream import run_stream

__all__ = [
    "build_layer_libraries",
    "layer_records",
    "measure_handoff",
    "measure_layers",
    "profile_layers",
]


def measure_handoff(stages: int = 8, frames: int = 400, repeat: int = 3) -> HandOff:
    """The stream executor's cost per stage and frame on this machine, measured.

    ``frames`` small arrays stream through ``stages`` stages that return their input (the
    executor's default queues, threads unpinned); with no work in the stages the steady time
    per frame is the hand-offs alone: ``stages + 1`` of them (the feeder's too), serialised by
    the interpreter lock. The median over ``repeat`` streams, divided by ``stages + 1``.

    Raises
    ------
    PlannerError
        ``stages``, ``frames`` or ``repeat`` below what a steady rate needs.
    """
    if stages < 1 or frames < 3 or repeat < 1:
        raise PlannerError(
            f"measure_handoff needs >= 1 stage, >= 3 frames and >= 1 repeat, got {stages}, "
            f"{frames}, {repeat}"
        )
    frame = np.zeros(16, dtype=np.float32)
    cycles = []
    for _ in range(repeat):
        with run_stream([_identity] * stages, [frame] * frames) as stream:
            for _ in stream:
                pass
        fps = stream.stats().steady_frames_per_s
        if fps > 0:  # 0: every frame out within the timer's resolution
            cycles.append(1e3 / fps)
    return HandOff(float(np.median(cycles)) / (stages + 1) if cycles else 0.0)


def _identity(x: Any) -> Any:
    return x


def layer_records(table: LatencyTable, layers: Sequence[LayerShape]) -> list[PipeRecord]:
    """Every measured entry of ``table`` as a :class:`PipeRecord` (to fit a Pipe-it model)."""
    if len(layers) != table.n_layers:
        raise PlannerError(f"{len(layers)} layer shapes for a table of {table.n_layers} layers")
    records = []
    for group, cores in table.keys():
        values = table[(group, cores)]
        for layer, ms in zip(layers, values, strict=True):
            if ms > 0:
                records.append(PipeRecord(layer, group, cores, float(ms)))
    return records


def _time_in_thread(fn: Callable[[], Any], cores: Sequence[int] | None) -> Any:
    """Run ``fn`` in a new thread (pinned with its own TVM pool on ``cores``) and return its
    result: a thread's affinity and pool are its own, so the caller's stay as they were."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            if cores:
                pin_thread_pool(cores)
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=body, name="codl-profile-layers")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def build_layer_libraries(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    work_dir: str | Path,
    *,
    isa: Mapping[str, str] | None = None,
    host: bool = True,
) -> dict[str, Path]:
    """Build ``main`` cut at every layer (one function per layer) for the host (with
    ``host``) and for each group: ``{"host": lib, group name: lib, ...}`` in ``work_dir`` (what
    :func:`measure_layers` times; building and timing are apart so that a benchmark can build
    many models in parallel and time them one at a time)."""
    groups = check_groups(groups) if groups or not host else ()
    isas = resolve_isas(groups, isa)
    starts = layer_starts(model.mod["main"])
    staged = cut_stages(model.mod, starts[1:])
    layer_mod = stage_module(staged, [stage_name(k) for k in range(len(starts))])
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    libs = {}
    if host:  # the library that computes every layer's inputs (skip: another call builds it)
        libs["host"] = work / "layers_host.so"
        host_group = ProcessorGroup("host", "cpu", (0,))
        compile_library(
            layer_mod, group_target(host_group, "host"), libs["host"], f"{model.path} (layers)"
        )
    for g in groups:
        libs[g.name] = work / f"layers_{g.name}.so"
        compile_library(
            layer_mod,
            group_target(g, isas[g.name] if g.kind == "cpu" else None),
            libs[g.name],
            f"{model.path} (layers on {g.name})",
        )
    return libs


def measure_layers(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    libraries: Mapping[str, Path],
    *,
    core_counts: Mapping[str, Sequence[int]] | None = None,
    number: int = 3,
    repeat: int = 3,
) -> LatencyTable:
    """Time every layer of :func:`build_layer_libraries`' libraries on every (group, cores).

    A layer runs on the outputs of the layers before it (computed once with the host library),
    timed by ``time_evaluator`` (median of ``repeat`` means of ``number`` runs, after one
    warm-up run) in a thread pinned to the group's first ``c`` cores with ``c`` TVM workers (a
    GPU group: its host cores, one count).

    Parameters
    ----------
    core_counts
        Per CPU group, the core counts to measure (default: 1 to all of its cores). The search
        needs every count from 1 to the group's size.
    """
    groups = check_groups(groups)
    n = len(layer_starts(model.mod["main"]))
    vm = VirtualMachine(tvm.runtime.load_module(str(libraries["host"])), tvm.cpu(0))
    rng = np.random.default_rng(0)
    args: list[np.ndarray] = [rng.standard_normal(t.shape).astype(t.dtype) for t in model.inputs]
    layer_inputs = []
    for k in range(n):
        layer_inputs.append(args)
        res = vm[stage_name(k)](*(tvm.runtime.tensor(a) for a in args))
        args = [r.numpy() for r in res] if k < n - 1 else []
    table: dict[tuple[str, int], np.ndarray] = {}
    for g in groups:
        if g.kind == "gpu":
            runtime.load()
        dev = _device(g.kind)

        def measure(lib: Path = libraries[g.name], dev: Any = dev) -> np.ndarray:
            gvm = VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
            ms = np.zeros(n)
            for k in range(n):
                placed = [tvm.runtime.tensor(a, dev) for a in layer_inputs[k]]
                gvm[stage_name(k)](*placed)  # warm-up (OpenCL compiles kernels here)
                timer = gvm.time_evaluator(stage_name(k), dev, number=number, repeat=repeat)
                ms[k] = float(np.median(timer(*placed).results)) * 1e3
            return ms

        counts = (
            [1]
            if g.kind == "gpu"
            else list((core_counts or {}).get(g.name, range(1, len(g.cores) + 1)))
        )
        for c in counts:
            cores = list(g.cores[:c]) if g.kind == "cpu" else list(g.cores)
            table[(g.name, c)] = _time_in_thread(measure, cores)
    return LatencyTable(table, [s.name for s in layer_shapes(model.mod)])


def profile_layers(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    *,
    isa: Mapping[str, str] | None = None,
    core_counts: Mapping[str, Sequence[int]] | None = None,
    number: int = 3,
    repeat: int = 3,
    work_dir: str | Path | None = None,
) -> LatencyTable:
    """Measure Pipe-it's time matrix on this machine: ms of every layer on every (group, cores)
    (:func:`build_layer_libraries`, then :func:`measure_layers`; the libraries go to
    ``work_dir``, default a temporary directory removed afterwards)."""
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="codl-profile-"))
    try:
        libs = build_layer_libraries(model, groups, work, isa=isa)
        return measure_layers(
            model, groups, libs, core_counts=core_counts, number=number, repeat=repeat
        )
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
