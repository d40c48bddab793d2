"""Pipe-it's time matrix measured on this machine: every layer on every (group, core count).

A layer is :func:`codl_tvm.passes.stages.layer_starts`'s (a major operator with the operators
after it). :func:`build_layer_libraries` builds ``main`` cut at every layer (one function per
layer) for the host and for each processor group's target; :func:`measure_layers` times each
layer on 1..n cores of each CPU group (a thread pinned to the group's first ``c`` cores with
its own ``c``-worker TVM pool) and on the GPU, and returns the
:class:`~codl_tvm.core.stage_plan.LatencyTable` the stage search takes;
:func:`profile_layers` does both. Pipe-it times each layer alone; ``under_load=True`` times it
while every other core of the groups runs the model's layers, as the other stages of a stream
keep them busy: stages share the socket's caches and memory bandwidth, and an emulated SoC found
them 1.0-2.3x slower streaming than alone (docs/benchmarks.md), which a table of layers alone
does not show the search. Building and timing are apart so that a benchmark builds
many models in parallel and times them one at a time. :func:`layer_records` turns a table into
:class:`~codl_tvm.core.stage_plan.PipeRecord` to fit Pipe-it's model (Eq. 5/8) on.

:func:`stage_timer` times a plan's stages running together, where a stage's layers evict each
other's weights and stages share the caches (what
:func:`~codl_tvm.planner.stages.refine.refine_with_stages` plans on).

:func:`measure_handoff` measures what the stream executor (:mod:`codl_tvm.runtime.stream`) costs a
stage per frame beyond its layers, the :class:`~codl_tvm.core.stage_plan.HandOff` the
search counts: the time matrix times layers alone.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.stage_targets import (
    compile_library,
    group_target,
    layer_names,
    resolve_isas,
    stage_module,
)
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.groups import ProcessorGroup, check_groups
from codl_tvm.core.stage_plan import (
    HandOff,
    LatencyTable,
    LayerShape,
    PipelinePlan,
    PipelineStage,
    PipeRecord,
)
from codl_tvm.frontend.importer import OnnxModel
from codl_tvm.passes.stages import cut_stages, layer_starts, stage_name
from codl_tvm.runtime.staged_artifact import group_device, pin_thread_pool
from codl_tvm.runtime.stream import run_stream

__all__ = [
    "build_layer_libraries",
    "layer_records",
    "measure_handoff",
    "measure_layers",
    "profile_layers",
    "stage_timer",
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


def _layer_inputs(model: OnnxModel, host_library: Path) -> list[list[np.ndarray]]:
    """Each layer's inputs: the outputs of the layers before it on a random input, computed
    once with the host library of :func:`build_layer_libraries`."""
    n = len(layer_starts(model.mod["main"]))
    vm = VirtualMachine(tvm.runtime.load_module(str(host_library)), tvm.cpu(0))
    rng = np.random.default_rng(0)
    args: list[np.ndarray] = [rng.standard_normal(t.shape).astype(t.dtype) for t in model.inputs]
    layer_inputs = []
    for k in range(n):
        layer_inputs.append(args)
        res = vm[stage_name(k)](*(tvm.runtime.tensor(a) for a in args))
        args = [r.numpy() for r in res] if k < n - 1 else []
    return layer_inputs


def _run_layers(lib: Path, dev: Any, layer_inputs: Sequence[Sequence[np.ndarray]], first: int = 0):
    """A VM on ``lib`` and a function running layers ``first, first + 1, ...`` (one per entry
    of ``layer_inputs``) once each on their inputs on ``dev``."""
    vm = VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    placed = [[tvm.runtime.tensor(a, dev) for a in inputs] for inputs in layer_inputs]

    def run_all(stop: threading.Event | None = None) -> None:
        for k, args in enumerate(placed, start=first):
            if stop is not None and stop.is_set():
                return
            vm[stage_name(k)](*args)
            # the GPU enqueues: wait per layer, so the queue never runs far past a stop
            dev.sync()

    return run_all


@contextlib.contextmanager
def _busy(
    loads: Sequence[tuple[Path, Any, Sequence[int]]],
    layer_inputs: Sequence[Sequence[np.ndarray]],
) -> Iterator[list[int]]:
    """Keep each ``(library, device, cores)`` of ``loads`` running every layer in a loop, on a
    thread pinned to ``cores`` with its own TVM pool there, for the duration of the block;
    yields the passes over the layers each load has finished (live counts).

    The block starts once every load has run its layers once (a GPU's first run compiles its
    kernels, which is not the load a stream puts on the machine).

    Raises
    ------
    PlannerError
        A load failed (its error, after every load stopped).
    """
    stop = threading.Event()
    errors: list[BaseException] = []
    ready = [threading.Event() for _ in loads]
    passes = [0] * len(loads)

    def body(i: int, lib: Path, dev: Any, cores: Sequence[int]) -> None:
        try:
            pin_thread_pool(cores)
            run_all = _run_layers(lib, dev, layer_inputs)
            run_all()
            ready[i].set()
            while not stop.is_set():
                run_all(stop)
                passes[i] += 1
        except BaseException as e:  # reported by the caller after every load stopped
            errors.append(e)
        finally:
            ready[i].set()

    threads = [
        threading.Thread(target=body, args=(i, *load), name=f"codl-layer-load-{i}", daemon=True)
        for i, load in enumerate(loads)
    ]
    for t in threads:
        t.start()
    try:
        for r in ready:
            r.wait()
        if errors:
            raise PlannerError(f"a load beside the layer timing failed: {errors[0]}")
        yield passes
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise PlannerError(f"a load beside the layer timing failed: {errors[0]}")


def _loads_beside(
    groups: Sequence[ProcessorGroup],
    libraries: Mapping[str, Path],
    cores: Sequence[int],
) -> list[tuple[Path, Any, list[int]]]:
    """What keeps every core of ``groups`` but the measured ``cores`` busy: each group's other
    cores with its own library (the other groups whole, the measured group's cores left over
    as a stream's other stages of that core type)."""
    loads = []
    for h in groups:
        rest = [c for c in h.cores if c not in cores]
        if rest:
            loads.append((libraries[h.name], group_device(h.kind), rest))
    return loads


def stage_timer(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    libraries: Mapping[str, Path],
    *,
    passes: int = 5,
    timeout_s: float = 120.0,
) -> Callable[[PipelinePlan], list[float]]:
    """A function timing a plan's stages running together on this machine (the ``measure`` of
    :func:`~codl_tvm.planner.stages.refine.refine_with_stages`).

    Each stage runs its layers (:func:`build_layer_libraries`' libraries, each layer on the
    outputs of the layers before it, computed once here) in a loop on a thread pinned to its
    cores with its own TVM pool, every stage at once, as in a stream without the hand-offs:
    a stage's layers evict each other's weights and its neighbours share the caches and
    memory bandwidth. The loops start together once every stage has run once (a GPU compiles
    its kernels then) and stop when every stage has ``passes`` passes; a stage's time is the
    median of its passes, in ms.

    Raises
    ------
    PlannerError
        A stage failed (its error, after every stage stopped), or a stage lacked ``passes``
        passes after ``timeout_s`` seconds.
    """
    if passes < 1:
        raise PlannerError(f"stage timing needs >= 1 pass, got {passes}")
    by_name = {g.name: g for g in check_groups(groups)}
    layer_inputs = _layer_inputs(model, libraries["host"])
    if any(g.kind == "gpu" for g in by_name.values()):
        runtime.load()

    def measure(plan: PipelinePlan) -> list[float]:
        stop, start = threading.Event(), threading.Event()
        ready = [threading.Event() for _ in plan.stages]
        times: list[list[float]] = [[] for _ in plan.stages]
        errors: list[BaseException] = []

        def body(i: int, stage: PipelineStage) -> None:
            try:
                group = by_name[stage.group]
                pin_thread_pool(stage.cores)
                run = _run_layers(
                    libraries[group.name],
                    group_device(group.kind),
                    layer_inputs[stage.first_layer : stage.stop_layer],
                    stage.first_layer,
                )
                run()
                ready[i].set()
                start.wait()
                while not stop.is_set():
                    t0 = time.perf_counter()
                    run(stop)
                    if not stop.is_set():  # a pass cut short by the stop does not count
                        times[i].append((time.perf_counter() - t0) * 1e3)
            except BaseException as e:  # reported by the caller after every stage stopped
                errors.append(e)
            finally:
                ready[i].set()

        threads = [
            threading.Thread(target=body, args=(i, st), name=f"codl-stage-{i}", daemon=True)
            for i, st in enumerate(plan.stages)
        ]
        for t in threads:
            t.start()
        try:
            for r in ready:
                r.wait()
            start.set()
            deadline = time.monotonic() + timeout_s
            while not errors and min(map(len, times)) < passes and time.monotonic() < deadline:
                time.sleep(0.002)
        finally:
            stop.set()
            start.set()
            for t in threads:
                t.join()
        if errors:
            raise PlannerError(f"timing the stages of {plan.describe()} failed: {errors[0]}")
        if min(map(len, times)) < passes:
            raise PlannerError(
                f"timing the stages of {plan.describe()}: a stage ran fewer than {passes} "
                f"passes in {timeout_s:g} s"
            )
        return [float(np.median(t)) for t in times]

    return measure


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
    under_load: bool = False,
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
    under_load
        Time each (group, cores) while every other core of ``groups`` runs the model's layers
        in a loop (each other group with its own library on all its cores, the group's other
        cores with its library), as in a stream; default: each layer alone, as Pipe-it.
    """
    groups = check_groups(groups)
    n = len(layer_starts(model.mod["main"]))
    layer_inputs = _layer_inputs(model, libraries["host"])
    if any(g.kind == "gpu" for g in groups):  # before any GPU load or timing
        runtime.load()
    table: dict[tuple[str, int], np.ndarray] = {}
    for g in groups:
        dev = group_device(g.kind)

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
            loads = _loads_beside(groups, libraries, cores) if under_load else []
            with _busy(loads, layer_inputs):
                table[(g.name, c)] = _time_in_thread(measure, cores)
    return LatencyTable(table, layer_names(model.mod))


def profile_layers(
    model: OnnxModel,
    groups: Sequence[ProcessorGroup],
    *,
    isa: Mapping[str, str] | None = None,
    core_counts: Mapping[str, Sequence[int]] | None = None,
    number: int = 3,
    repeat: int = 3,
    work_dir: str | Path | None = None,
    under_load: bool = False,
) -> LatencyTable:
    """Measure Pipe-it's time matrix on this machine: ms of every layer on every (group, cores)
    (:func:`build_layer_libraries`, then :func:`measure_layers`, ``under_load`` as there; the
    libraries go to ``work_dir``, default a temporary directory removed afterwards)."""
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="codl-profile-"))
    try:
        libs = build_layer_libraries(model, groups, work, isa=isa)
        return measure_layers(
            model,
            groups,
            libs,
            core_counts=core_counts,
            number=number,
            repeat=repeat,
            under_load=under_load,
        )
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
