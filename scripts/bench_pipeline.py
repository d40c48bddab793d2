"""Pipelined throughput (Pipe-it) on emulated big/little clusters and a GPU, with its baselines.

::

    python scripts/bench_pipeline.py \\
        --models bvlc_alexnet,inception_v1,posenet,resnet50,squeezenet \\
        --groups gpu:0,big:1-8,little:9-15 --isa little=x86-64-v3-nofma --jobs 15 \\
        --frames 40 --out $OUT/pipeline.json

The machine is split into processor groups (``--groups``): ``big``, TVM's kernels for the host
CPU (AVX-512 with FMA on the device machine) on one core set; ``little``, kernels built for a
narrower instruction set on another; ``gpu``, PoCL on its own cores (the calling shell sets
``POCL_CPU_MAX_CU_COUNT`` and ``POCL_AFFINITY=1``, so PoCL's workers are on cores
``0..CU-1``; the GPU stage's host thread is pinned to the group's cores).

How the big/little ratio is calibrated: the cores are alike (one socket, no SMT), so the
per-core gap is the instruction set alone, chosen by the little preset and *measured* every
run: the sum of every layer's one-core latency on ``little`` over the same on ``big``,
reported per model as ``little_over_big_1core`` (and in the summary). Pipe-it's clusters are
2-5x apart per core. ``x86-64-v2`` (SSE4.2: 4-wide vectors, no FMA) measured 4.7-7.0x against
AVX-512, outside that range; the default ``x86-64-v3-nofma`` (AVX2 with LLVM's ``-fma``:
8-wide vectors, a multiply and an add apiece) halves the vector gap, aiming at about 2.5-3.5x;
``x86-64-v3`` (AVX2 and FMA) narrows it further, ``x86-64`` (SSE2) widens it. A run whose
``little_over_big_1core`` falls outside 2-5x is not Pipe-it's setting: change the preset.

Phases (builds in ``--jobs`` spawned processes, timing one thing at a time):

1. **build**: per model, the model cut at every layer for each group (the time matrix's
   libraries) and the single-stage builds of the baselines.
2. **measure**: Pipe-it's time matrix per model: every layer on 1..n cores of each CPU group
   and on the GPU (:func:`codl_tvm.profiling.layers.measure_layers`), each layer alone as
   Pipe-it does, and (unless ``--no-under-load``) again with every other core running the
   model's layers, as a stream's other stages keep them (``under_load``).
3. **plan**: Pipe-it's heuristic (``exact`` and the published ``pipe-it`` balancing) and the
   exhaustive search (up to three stages) on the CPU groups and on all groups; a Pipe-it model
   (Eq. 5/8) fitted on the *other* models' measured layers predicts this model's table, and the
   pipeline chosen from it is re-costed with the measured table (predicted vs measured choice).
4. **build pipelines** of the chosen plans; **stream** ``--frames`` frames through every
   configuration, in the same process one after another, ``--rounds`` times in rotated order
   (rates are medians over the rounds, ratios to ``big`` medians of per-round ratios):

   - ``pipe_cpu``: the best pipeline on big + little; ``pipe_gpu``: on big + little + GPU;
     ``pipe_pred``: chosen from predicted latencies (when it differs from ``pipe_gpu``);
     ``pipe_cpu_loaded``, ``pipe_gpu_loaded``: the same searches on the table timed under
     load; ``pipe_cpu_staged``, ``pipe_gpu_staged``: from the loaded table, the chosen
     stages timed running together and the search repeated on those times until its choice
     runs on measured stages (:func:`codl_tvm.planner.stages.refine.refine_with_stages`, what
     ``compile --objective throughput --stage-rounds N`` builds); each streamed where it
     differs from the plans above; every streamed plan is also costed on every table,
     ``planned_fps``, to show which one the stream follows;
   - ``big``: all layers on the big cluster (Pipe-it's baseline);
   - ``kernel_all``: every layer on all CPU cores at once (kernel-level parallelism, Pipe-it's
     "all cores" baseline), built for the *little* group's ISA. On a real big.LITTLE one
     binary runs on both clusters, and TVM's parallel loops give each thread an equal static
     chunk (``step = ceil(extent / num_task)``, thread ``task_id`` runs
     ``[task_id * step, (task_id + 1) * step)``: ``CodeGenCPU::VisitStmt_(const ForNode*)``
     in TVM's ``src/target/llvm/codegen_cpu.cc``; the thread pool does not steal work), so
     every kernel ends when its little threads end: the makespan is the whole model in the
     little ISA on big + little cores. Here the "little" cores are physically big ones, so the
     little-ISA build on all of them is that makespan, measured;
   - ``kernel_all_big_isa``: the same with the host ISA on every core: 15 big cores on this
     machine, a configuration a big.LITTLE phone does not have. Reported as an upper bound
     on kernel-level parallelism, not as the target's baseline;
   - ``replicas``: a whole model per group (big, little, GPU), each taking the next frame
     from a shared queue (frames alternate between the replicas as they free up);
   - ``codl``: codl-tvm's latency plan (GPU + big cores co-executing each layer) back to back,
     built with ``--cost-model`` scaled to the groups' core counts;
   - ``gpu``: the whole model on the GPU alone.

Output: one JSON with per model the measured tables' summary, the searches (predicted and
measured bottlenecks, heuristic vs exhaustive), every configuration's frames/s and per-frame
latency (median, p99), and a summary over models (mean throughput ratios). Each number comes
from this one run on one machine; compare configurations within it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

DEFAULT_MODELS = "bvlc_alexnet,inception_v1,posenet,resnet50,squeezenet"
DEFAULT_GROUPS = "gpu:0,big:1-8,little:9-15"
DEFAULT_COST_MODEL = "codl_tvm/data/cost_models/emulated-soc-k12.json"


def _model_file(name: str, directory: Path) -> Path:
    import onnx

    from codl_tvm.frontend.models import benchmark_model, bundled_model_path

    if name == "codl_small_cnn":
        return bundled_model_path()
    path = directory / f"{name}.onnx"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        onnx.save(benchmark_model(name), str(path))
    return path


def _groups(spec: str):
    from codl_tvm.planner.stages.search import parse_groups

    return parse_groups(spec)


def _single_stage_plan(model, group):
    from codl_tvm.passes.stages import layer_starts

    from codl_tvm.planner.stages.search import PipelinePlan, PipelineStage

    n = len(layer_starts(model.mod["main"]))
    count = len(group.cores) if group.kind == "cpu" else 1
    return PipelinePlan((PipelineStage(group.name, count, group.cores, 0, n, 0.0),), "whole")


def _build_job(job: dict) -> tuple[str, str, str | None, float]:
    """One build in a spawned worker: ``layers``, ``whole`` (one stage), ``pipeline`` or
    ``codl``; returns (model, tag, error or None, seconds)."""
    t0 = time.perf_counter()
    try:
        from codl_tvm.frontend.importer import load_onnx
        from codl_tvm.objectives.stage_build import build_pipeline
        from codl_tvm.planner.stages.search import PipelinePlan, PipelineStage
        from codl_tvm.profiling.layers import build_layer_libraries

        model = load_onnx(job["model_path"])
        groups = _groups(job["groups"])
        isa = job["isa"]
        if job["kind"] == "layers":  # one group's (or the host's) layer library
            only = [g for g in groups if g.name == job["group"]]
            only_isa = {k: v for k, v in isa.items() if k == job["group"]}
            build_layer_libraries(model, only, job["out"], isa=only_isa, host=not only)
        elif job["kind"] == "whole":
            group = next(g for g in groups if g.name == job["group"])
            plan = _single_stage_plan(model, group)
            build_pipeline(model, plan, groups, job["out"], isa=isa, force=True)
        elif job["kind"] == "pipeline":
            plan = PipelinePlan(
                tuple(
                    PipelineStage(
                        s["group"],
                        s["core_count"],
                        tuple(s["cores"]),
                        *s["layers"],
                        s["latency_ms"],
                    )
                    for s in job["plan"]["stages"]
                ),
                job["plan"]["method"],
            )
            build_pipeline(model, plan, groups, job["out"], isa=isa, force=True)
        elif job["kind"] == "codl":
            from codl_tvm.objectives.latency import compile_artifact
            from codl_tvm.options import CompileOptions

            options = CompileOptions(
                device="coexec",
                mode="codl",
                cost_model=job["cost_model"],
                preset="emulated-soc",
                reference=False,
                processor_scale=tuple(job["processor_scale"]),
                force=True,
            )
            compile_artifact(job["model_path"], job["out"], options)
    except Exception as exc:  # one failing build must not lose the others
        return job["name"], job["tag"], f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    return job["name"], job["tag"], None, time.perf_counter() - t0


def _run_builds(jobs: list[dict], n_jobs: int, log) -> dict[tuple[str, str], str]:
    failed = {}
    if n_jobs > 1 and len(jobs) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawned workers: TVM's state is not fork-safe
        with ProcessPoolExecutor(n_jobs, mp_context=mp.get_context("spawn")) as pool:
            results = [f.result() for f in as_completed([pool.submit(_build_job, j) for j in jobs])]
    else:
        results = [_build_job(j) for j in jobs]
    for name, tag, err, secs in results:
        log(f"built {name} {tag} in {secs:.1f} s" + (f": FAILED {err}" if err else ""))
        if err:
            failed[(name, tag)] = err
    return failed


# How phase 3 predicts a model's time matrix (the first plans ``pipe_pred``):
# - "on_demand": this model's one-core and all-core columns per group, Amdahl's law between
#   adjacent measured core counts (pipe_model.piecewise_amdahl_table), and every column the
#   pipeline chosen on that table runs on measured in turn until the choice runs on measured
#   columns alone (pipe_model.on_demand_table): the search exploits underestimates, and the
#   measured tables' errors against a smooth scaling law are mostly whole columns of one model
#   (no fit on other columns or other models predicts them), so the choice's own columns are
#   measured and the rest predicted; on the stored runs' tables it measured 6-11 of 16
#   columns, and its choice was never further from the measured choice than amdahl's;
# - "amdahl": no fit, two measured columns per group (one core, every core) and
#   ``serial + parallel / H`` through them per layer
#   (codl_tvm.planner.stages.layer_model.amdahl_table):
#   on the device's tables its per-layer errors were 3-14 % against Eq. 5/8's 18-39 %;
# - "eq8": Pipe-it's Eq. 8 (multi-core scaling, fitted on the other models) applied to this
#   model's *measured* one-core latency of each layer (Eq. 8 takes the one-core latency as its
#   input): one column per group measured instead of every core count;
# - "relative", "absolute": Eq. 5 and Eq. 8 fitted on the other models alone (relative errors
#   with non-negative Eq. 5 coefficients, or the paper's least squares on milliseconds).
# Every predictor's choice is reported (keys with a ``_<method>`` suffix; the first has none).
PREDICTORS = ("on_demand", "amdahl", "eq8", "relative", "absolute")


def _fit_predictor(records, groups, exclude: str, method: str, table):
    """A Pipe-it model per layer type fitted on the other models' records (a fit pooled over
    layer types for the types the others lack); returns ``predict(index, layer, group,
    cores)``. With ``method="eq8"`` the one-core latency Eq. 8 scales is ``table``'s measured
    one (the excluded model's own), else Eq. 5's prediction. ``"amdahl"`` and ``"on_demand"``
    fit nothing: they read the columns of ``table`` they measure (``predict.columns_measured``
    says which)."""
    from codl_tvm.core.errors import CodlError
    from codl_tvm.planner.stages.layer_model import (
        MIN_LATENCY_MS,
        LayerShape,
        PipeModel,
        PipeRecord,
        amdahl_table,
        on_demand_table,
    )
    from codl_tvm.planner.stages.search import optimal_pipeline

    sizes = {g.name: g.most_stage_cores for g in groups}
    if method in ("amdahl", "on_demand"):
        if method == "amdahl":  # the two measured anchors per group, the rest through them
            anchors = {(g, c) for g, most in sizes.items() for c in {1, most}}
            predicted = amdahl_table({k: table[k] for k in anchors}, sizes)
        else:
            # the groups were checked against the machine where they were parsed; planning
            # on them again needs no more cores than they name
            cores = sorted({c for g in groups for c in g.cores})

            def used(ptable):
                plan = optimal_pipeline(ptable, groups, available=cores)
                return [(s.group, s.core_count) for s in plan.stages]

            found = on_demand_table(lambda g, c: table[(g, c)], sizes, used)
            predicted, anchors = found.table, set(found.measured)

        def predict(i, layer, group, cores):
            return max(float(predicted[(group, cores)][i]), MIN_LATENCY_MS)

        predict.columns_measured = sorted(anchors)
        return predict
    loss = "absolute" if method == "absolute" else "relative"
    train = [r for name, rs in records.items() if name != exclude for r in rs]
    typed = PipeModel(sizes)
    try:
        typed.fit(train, loss=loss)
    except CodlError:
        typed = None
    pooled = PipeModel(sizes).fit(
        [
            PipeRecord(
                LayerShape(
                    r.layer.name, "any", r.layer.out_pixels, r.layer.filter_size, r.layer.out_maps
                ),
                r.group,
                r.cores,
                r.latency_ms,
            )
            for r in train
        ],
        loss=loss,
    )

    def any_type(layer):
        return LayerShape(layer.name, "any", layer.out_pixels, layer.filter_size, layer.out_maps)

    def fit_of(layer, group):
        if typed is not None and (group, layer.layer_type) in typed.fits:
            return typed, layer
        return pooled, any_type(layer)

    def predict(i, layer, group, cores):
        model, shape = fit_of(layer, group)
        if method != "eq8":
            try:
                return model.predict(shape, group, cores)
            except CodlError:
                return pooled.predict(any_type(layer), group, cores)
        t1 = float(table[(group, 1)][i])
        alpha = model.fits[(group, shape.layer_type)].alpha
        if cores == 1 or alpha is None:
            return max(t1, MIN_LATENCY_MS)
        a1, a2_ts, a3 = alpha
        return max((t1 - a1) / cores + a2_ts * shape.out_pixels / cores + a3, MIN_LATENCY_MS)

    return predict


def _plan_model(entry: dict, n: str, table, records, shapes, groups, handoff, available=None):
    """Phase 3 for one model: the searches on its measured ``table`` (with the executor's
    ``handoff``) into ``entry``, and the plans to stream (``pipe_cpu``, ``pipe_gpu``,
    ``pipe_pred``)."""
    from codl_tvm.planner.stages.search import (
        LatencyTable,
        exhaustive_pipeline,
        optimal_pipeline,
        recost_plan,
        search_pipeline,
    )

    cpu_groups = tuple(g for g in groups if g.kind == "cpu")
    kw = {"handoff": handoff, "available": available}
    searches = {}
    # the planner's search (Pipe-it's heuristic, its local search, and the optimum over any
    # stage count where that is lower) and the heuristic alone, against both optima; the
    # planner's choice is put together here from the heuristic and the optimum as
    # search_pipeline does, so the heuristic (the costly part) runs once per group set
    cpu_h = search_pipeline(table, cpu_groups, exact_stages=False, **kw)
    searches["cpu_heuristic"] = _plan_json(cpu_h)
    cpu_opt = optimal_pipeline(table, cpu_groups, **kw)
    searches["cpu_optimal"] = _plan_json(cpu_opt)
    cpu = _planner_choice(cpu_h, cpu_opt)
    searches["cpu_search"] = _plan_json(cpu)
    searches["cpu_pipe_it_balance"] = _plan_json(
        search_pipeline(table, cpu_groups, balance="pipe-it", **kw)
    )
    ex_cpu = exhaustive_pipeline(table, cpu_groups, max_stages=3, **kw)
    searches["cpu_exhaustive3"] = _plan_json(ex_cpu)
    full_h = search_pipeline(table, groups, exact_stages=False, **kw)
    searches["all_heuristic"] = _plan_json(full_h)
    ex_all = exhaustive_pipeline(table, groups, max_stages=3, **kw)
    searches["all_exhaustive3"] = _plan_json(ex_all)
    all_opt = optimal_pipeline(table, groups, **kw)
    searches["all_optimal"] = _plan_json(all_opt)
    full = _planner_choice(full_h, all_opt)
    searches["all_search"] = _plan_json(full)
    # throughput ratios: >= 1 where the heuristic is at least as fast as the reference
    entry["heuristic_fps_over_exhaustive3"] = {
        "cpu": ex_cpu.bottleneck_ms / cpu_h.bottleneck_ms,
        "all": ex_all.bottleneck_ms / full_h.bottleneck_ms,
    }
    entry["heuristic_fps_over_optimal"] = {
        "cpu": cpu_opt.bottleneck_ms / cpu_h.bottleneck_ms,
        "all": all_opt.bottleneck_ms / full_h.bottleneck_ms,
    }
    pred = None
    # each predictor plans on its predicted table; the pipeline it picks is then costed on the
    # measured table (its layers' measured times + the hand-off): what that choice would
    # stream at, over what the choice from measurements streams at
    # the fitted predictors need other models to fit on; on_demand and amdahl need this
    # model's own columns only
    for method in PREDICTORS if len(records) > 1 else ("on_demand", "amdahl"):
        suffix = "" if method == PREDICTORS[0] else f"_{method}"
        try:
            predict = _fit_predictor(records, groups, n, method, table)
            entry["columns_measured" + suffix] = getattr(predict, "columns_measured", None)
            ptable = LatencyTable(
                {
                    (g.name, c): [predict(i, s, g.name, c) for i, s in enumerate(shapes)]
                    for g in groups
                    for c in range(1, g.most_stage_cores + 1)
                }
            )
            # the planner's choice on the predicted table: search_pipeline returns the optimum
            # wherever it is cheap (every table here) unless its heuristic ties it, so the
            # optimum's bottleneck is the planner's, without the heuristic's time
            chosen = optimal_pipeline(ptable, groups, **kw)
            measured_pred = recost_plan(chosen, table, handoff=handoff)
            searches["all_from_predicted" + suffix] = _plan_json(chosen)
            searches["all_from_predicted_measured" + suffix] = _plan_json(measured_pred)
            entry["predicted_choice_over_measured_choice" + suffix] = (
                measured_pred.bottleneck_ms / full.bottleneck_ms
            )
            errors = {
                g.name: [
                    abs(ptable[k][i] / table[k][i] - 1)
                    for k in table.keys()
                    if k[0] == g.name
                    for i in range(table.n_layers)
                    if table[k][i] > 0
                ]
                for g in groups
            }
            entry["layer_prediction_error_median" + suffix] = float(
                np.median([e for errs in errors.values() for e in errs])
            )
            entry["layer_prediction_error_median_by_group" + suffix] = {
                g: float(np.median(errs)) for g, errs in errors.items() if errs
            }
            if not suffix:
                pred = chosen
        except Exception as exc:  # a model the others cannot predict: reported, not fatal
            entry["prediction_error" + suffix] = f"{type(exc).__name__}: {exc}"
    entry["searches"] = searches
    plans = {"pipe_cpu": cpu, "pipe_gpu": full}
    if pred is not None and pred.describe() != full.describe():
        plans["pipe_pred"] = pred
    return plans


def _plan_loaded(entry: dict, plans: dict, table, groups, handoff) -> None:
    """The planner's searches on the table timed under load, into ``plans`` as
    ``pipe_cpu_loaded`` and ``pipe_gpu_loaded`` where they differ from a plan already there
    (``entry["loaded_plans"]`` says which it equals otherwise)."""
    from codl_tvm.planner.stages.search import search_pipeline

    cpu_groups = tuple(g for g in groups if g.kind == "cpu")
    found = {}
    for tag, gs in (("pipe_cpu_loaded", cpu_groups), ("pipe_gpu_loaded", groups)):
        if tag == "pipe_gpu_loaded" and len(gs) == len(cpu_groups):
            continue
        plan = search_pipeline(table, gs, handoff=handoff)
        same = next((t for t, p in plans.items() if p.describe() == plan.describe()), None)
        found[tag] = {"plan": _plan_json(plan), "same_as": same}
        if same is None:
            plans[tag] = plan
    entry["loaded_plans"] = found


def _plan_staged(entry: dict, plans: dict, table, groups, handoff, measure, rounds: int):
    """From ``table``, :func:`refine_with_stages` over the CPU groups and over all groups, into
    ``plans`` as ``pipe_cpu_staged`` and ``pipe_gpu_staged`` where they differ from a plan
    already there; returns ``table`` with every stage measured on the way."""
    from codl_tvm.planner.stages.refine import refine_with_stages

    cpu_groups = tuple(g for g in groups if g.kind == "cpu")
    found = {}
    for tag, gs in (("pipe_cpu_staged", cpu_groups), ("pipe_gpu_staged", groups)):
        if tag == "pipe_gpu_staged" and len(gs) == len(cpu_groups):
            continue
        t0 = time.perf_counter()
        refined = refine_with_stages(table, gs, measure, handoff=handoff, rounds=rounds)
        plan = refined.plan
        table = table.with_stages(refined.table.stage_ms)
        same = next((t for t, p in plans.items() if p.describe() == plan.describe()), None)
        found[tag] = {
            "plan": _plan_json(plan),
            "same_as": same,
            "refinement": refined.to_json(),
            "seconds": time.perf_counter() - t0,
        }
        if same is None:
            plans[tag] = plan
    entry["staged_plans"] = found
    return table


def _planner_choice(heuristic, optimum):
    """What :func:`~codl_tvm.planner.stages.search.search_pipeline` returns from its heuristic's
    pipeline and the optimum (where that is computed): the optimum where its bottleneck is
    lower."""
    if optimum.bottleneck_ms < heuristic.bottleneck_ms:
        return dataclasses.replace(optimum, method="pipe-it+optimal")
    return heuristic


def _summary(result: dict) -> dict:
    """Means and per-model ratios over the models of ``result``."""
    models = result["models"]

    def mean_of(key: str, sub: str) -> float | None:
        vals = [m[key][sub] for m in models.values() if sub in m.get(key, {})]
        return float(np.mean(vals)) if vals else None

    def per_model(key: str) -> dict:
        return {n: m.get(key) for n, m in models.items()}

    out: dict = {}
    for key in ("over_big", "over_big_with_fill"):
        tags = sorted({t for m in models.values() for t in m.get(key, {})})
        if tags:
            out[f"mean_throughput_{key}"] = {t: mean_of(key, t) for t in tags}
    ratios = [m.get("little_over_big_1core") for m in models.values()]
    out["little_over_big_1core"] = ratios
    # the calibration check: Pipe-it's clusters are 2-5x apart per core
    known = [r for r in ratios if r is not None]
    out["little_over_big_1core_in_pipe_it_range"] = (
        all(2.0 <= r <= 5.0 for r in known) if known else None
    )
    for method in PREDICTORS:
        suffix = "" if method == PREDICTORS[0] else f"_{method}"
        out[f"predicted_choice_over_measured_choice{suffix}"] = per_model(
            "predicted_choice_over_measured_choice" + suffix
        )
        out[f"layer_prediction_error_median_by_group{suffix}"] = per_model(
            "layer_prediction_error_median_by_group" + suffix
        )
    out["heuristic_fps_over_exhaustive3"] = per_model("heuristic_fps_over_exhaustive3")
    out["heuristic_fps_over_optimal"] = per_model("heuristic_fps_over_optimal")
    return out


def _cpu_topology() -> dict:
    """Per CPU, its physical core and SMT siblings (Linux sysfs): two stages on siblings share
    one core, which the time matrix (each layer timed alone) does not see."""
    out = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        topo = d / "topology"
        try:
            out[d.name] = {
                "package": int((topo / "physical_package_id").read_text()),
                "core_id": int((topo / "core_id").read_text()),
                "siblings": (topo / "thread_siblings_list").read_text().strip(),
            }
        except (OSError, ValueError):
            continue
    return out


def _replan(path: Path, out_path: Path, handoff_ms: float | None) -> None:
    """Phase 3 again on the time matrices of an earlier run's JSON (no build, no device):
    the searches and the predicted choices with this code, costed on that run's measured
    tables."""
    from codl_tvm.planner.stages.layer_model import LayerShape
    from codl_tvm.planner.stages.search import HandOff, LatencyTable, parse_groups
    from codl_tvm.profiling.layers import layer_records

    old = json.loads(path.read_text())
    cores = [c for part in old["groups"].split(",") for c in _spec_cores(part)]
    available = range(max(cores, default=0) + 1)
    groups = parse_groups(old["groups"], available)
    ms = old.get("handoff_ms_per_stage", 0.0) if handoff_ms is None else handoff_ms
    handoff = HandOff(ms)
    tables, shapes, records = {}, {}, {}
    for n, m in old["models"].items():
        tables[n] = LatencyTable(
            {(k.rpartition(":")[0], int(k.rpartition(":")[2])): v for k, v in m["table_ms"].items()}
        )
        shapes[n] = [LayerShape(*row) for row in m["layer_shapes"]]
        records[n] = layer_records(tables[n], shapes[n])
    result = {
        "replanned_from": path.name,
        "groups": old["groups"],
        "handoff_ms_per_stage": ms,
        "models": {},
    }
    for n in tables:
        entry = {
            k: old["models"][n][k]
            for k in ("layers", "one_core_ms", "whole_group_ms")
            if k in old["models"][n]
        }
        _plan_model(entry, n, tables[n], records, shapes[n], groups, handoff, available)
        result["models"][n] = entry
    result["summary"] = _summary(result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=1))


def _spec_cores(part: str) -> list[int]:
    """The core ids of one item of a group list (``big:1-8``, ``9``, ``gpu``)."""
    text = part.partition(":")[2] if ":" in part else part
    if not text or not text[0].isdigit():
        return []
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _plan_json(plan) -> dict:
    return plan.to_json() | {"describe": plan.describe(), "bottleneck_ms": plan.bottleneck_ms}


def _steady(starts: list[float], ends: list[float]) -> dict:
    """The rates every configuration reports alike, from per-frame start and end times:
    ``steady_frames_per_s`` between the first output and the last (the one the summary
    compares), ``frames_per_s`` from the first start (fill included), and ``fill_ms``."""
    ends = sorted(ends)
    t0 = min(starts)
    span = ends[-1] - ends[0]
    return {
        "frames": len(ends),
        "steady_frames_per_s": (len(ends) - 1) / span if span > 0 else 0.0,
        "frames_per_s": len(ends) / (ends[-1] - t0),
        "fill_ms": (ends[0] - t0) * 1e3,
    }


def _stream_stats(stream) -> dict:
    st = stream.stats()
    return {
        "frames": st.frames,
        "steady_frames_per_s": st.steady_frames_per_s,
        "fill_ms": st.fill_ms,
        "frames_per_s": st.frames_per_s,
        "latency_median_ms": st.latency_median_ms,
        "latency_p99_ms": st.latency_p99_ms,
        "stage_busy_ms_per_frame": {
            n: b * 1e3 / max(st.frames, 1)
            for n, b in zip(st.stage_names, st.stage_busy_s, strict=True)
        },
    }


def _stream_rounds(
    jobs: Mapping[str, Callable[[], dict]], rounds: int, log: Callable[[str], None]
) -> list[dict[str, dict]]:
    """Each job once per round, one at a time, the order rotated by one each round (so no
    configuration always follows the same one); the GPU alone (``gpu``, 100x slower than the
    rest) in the first round only. A job that raises is recorded as ``{"error": ...}``."""
    order = list(jobs)
    out = []
    for r in range(rounds):
        runs: dict[str, dict] = {}
        for tag in order[r % len(order) :] + order[: r % len(order)] if order else []:
            if tag == "gpu" and r > 0:
                continue
            try:
                runs[tag] = jobs[tag]()
            except Exception as exc:
                runs[tag] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"round {r} {tag}: {runs[tag].get('steady_frames_per_s', runs[tag].get('error'))}")
        out.append(runs)
    return out


def _pooled_runs(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Per configuration, its first round's record with the rates and each stage's busy time
    replaced by their medians over the rounds it ran without error, and the per-round rates
    (``steady_frames_per_s_rounds``)."""
    out: dict[str, dict] = {}
    for tag in dict.fromkeys(t for runs in rounds for t in runs):
        ok = [runs[tag] for runs in rounds if tag in runs and "error" not in runs[tag]]
        if not ok:
            out[tag] = next(runs[tag] for runs in rounds if tag in runs)
            continue
        rec = dict(ok[0])
        for rate in ("steady_frames_per_s", "frames_per_s", "latency_median_ms"):
            if rate in rec:
                rec[rate] = float(np.median([r[rate] for r in ok]))
        rec["steady_frames_per_s_rounds"] = [r["steady_frames_per_s"] for r in ok]
        if "stage_busy_ms_per_frame" in rec:
            rec["stage_busy_ms_per_frame"] = {
                name: float(np.median([r["stage_busy_ms_per_frame"][name] for r in ok]))
                for name in rec["stage_busy_ms_per_frame"]
            }
        out[tag] = rec
    return out


def _round_ratios(rounds: list[dict[str, dict]], rate: str, base: str) -> dict[str, float]:
    """Per configuration, the median over rounds of its ``rate`` over ``base``'s in the same
    round (a configuration run in one round only, the GPU alone, against that round's)."""
    ratios: dict[str, list[float]] = {}
    for runs in rounds:
        b = runs.get(base, {}).get(rate)
        if not b:
            continue
        for tag, rec in runs.items():
            if rec.get(rate):
                ratios.setdefault(tag, []).append(rec[rate] / b)
    return {t: float(np.median(v)) for t, v in ratios.items()}


def _run_pipeline(path: Path, frames: list, warmup: int) -> dict:
    from codl_tvm.runtime.staged_artifact import load_pipeline

    pipe = load_pipeline(path)
    with pipe.stream(frames[:warmup]) as s:  # PoCL compiles kernels, pools start
        list(s)
    with pipe.stream(frames) as s:
        for _ in s:
            pass
    return _stream_stats(s) | {"describe": pipe.describe()}


def _run_replicas(paths: list[Path], frames: list, warmup: int) -> dict:
    """Whole-model replicas, one per group, each taking the next frame from a shared queue."""
    from codl_tvm.runtime.staged_artifact import load_pipeline, pin_thread_pool

    pipes = [load_pipeline(p) for p in paths]
    for p in pipes:
        for _ in range(warmup):
            p(frames[0])
    todo: queue.Queue = queue.Queue()
    for i in range(len(frames)):
        todo.put(i)
    latencies = [0.0] * len(frames)
    starts = [0.0] * len(frames)
    ends = [0.0] * len(frames)
    done = [0] * len(pipes)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        stage = pipes[k].manifest["stages"][0]
        try:
            if stage["cores"]:
                if stage["kind"] == "cpu":
                    pin_thread_pool(stage["cores"])
                else:
                    os.sched_setaffinity(0, stage["cores"])
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                starts[i] = time.perf_counter()
                pipes[k](frames[i])
                ends[i] = time.perf_counter()
                latencies[i] = ends[i] - starts[i]
                done[k] += 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(pipes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    lat = np.asarray(latencies) * 1e3
    return _steady(starts, ends) | {
        "latency_median_ms": float(np.median(lat)),
        "latency_p99_ms": float(np.percentile(lat, 99)),
        "frames_per_replica": {p.describe(): d for p, d in zip(pipes, done, strict=True)},
    }


def _run_codl(path: Path, frames: list, cores: list[int], warmup: int) -> dict:
    """codl's latency plan back to back, its CPU kernels on ``cores``."""
    from codl_tvm.artifact import load_artifact
    from codl_tvm.runtime.staged_artifact import pin_thread_pool

    box: dict = {}

    def body() -> None:
        try:
            pin_thread_pool(cores)
            art = load_artifact(path)
            run = art.runner(frames[0])
            for _ in range(warmup):
                run()
            starts, ends = [], []
            for _ in frames:
                starts.append(time.perf_counter())
                run()
                ends.append(time.perf_counter())
            ms = (np.asarray(ends) - np.asarray(starts)) * 1e3
            box["value"] = _steady(starts, ends) | {
                "latency_median_ms": float(np.median(ms)),
                "latency_p99_ms": float(np.percentile(ms, 99)),
            }
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.environ.get("PIPE_MODELS", DEFAULT_MODELS))
    ap.add_argument("--groups", default=DEFAULT_GROUPS, help="processor groups (a gpu group: PoCL)")
    ap.add_argument("--isa", default="little=x86-64-v3-nofma", help="GROUP=ISA,... for CPU groups")
    ap.add_argument("--cost-model", default=DEFAULT_COST_MODEL, help="codl baseline's cost model")
    ap.add_argument("--frames", type=int, default=40, help="frames per streamed configuration")
    ap.add_argument(
        "--gpu-frames",
        type=int,
        default=8,
        help="frames for the GPU-alone baseline (100x slower than the CPU configurations here)",
    )
    ap.add_argument("--warmup", type=int, default=3, help="frames run before each measurement")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="stream every configuration this many times, in rotated order; rates and ratios "
        "to big are medians over the rounds",
    )
    ap.add_argument("--number", type=int, default=2, help="layer timing: runs per repeat")
    ap.add_argument("--repeat", type=int, default=3, help="layer timing: repeats (median)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--no-codl", action="store_true", help="skip the codl latency-plan baseline")
    ap.add_argument(
        "--stage-rounds",
        type=int,
        default=16,
        help="the most pipelines whose stages are timed together for the staged plans "
        "(0: no staged plans)",
    )
    ap.add_argument(
        "--skip",
        default="",
        help="configurations not streamed, comma-separated (e.g. gpu,replicas,kernel_all_big_isa)",
    )
    ap.add_argument(
        "--no-under-load",
        action="store_true",
        help="time the layers alone only (Pipe-it), not also beside a load on the other cores",
    )
    ap.add_argument("--work", default="/tmp/bench_pipeline", help="build directory")
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument(
        "--replan",
        metavar="RUN_JSON",
        help="only re-run the searches and predictions on an earlier run's time matrices",
    )
    ap.add_argument(
        "--handoff-ms",
        type=float,
        help="with --replan: the hand-off cost per stage (default: the run's measured one)",
    )
    args = ap.parse_args(argv)
    if args.replan:
        _replan(Path(args.replan), Path(args.out), args.handoff_ms)
        return

    from codl_tvm.build.stage_targets import resolve_isas
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.objectives.stage_build import layer_shapes
    from codl_tvm.objectives.throughput import parse_isa
    from codl_tvm.planner.stages.search import recost_plan
    from codl_tvm.profiling.layers import (
        layer_records,
        measure_handoff,
        measure_layers,
        stage_timer,
    )

    t_start = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out)
    groups = _groups(args.groups)
    isa = parse_isa(args.isa)
    by_name = {g.name: g for g in groups}
    cpu_groups = tuple(g for g in groups if g.kind == "cpu")
    gpu_groups = tuple(g for g in groups if g.kind == "gpu")
    all_cores = tuple(c for g in cpu_groups for c in g.cores)
    big = by_name.get("big", cpu_groups[0])
    little = by_name.get("little", cpu_groups[-1])
    little_isa = resolve_isas(groups, isa)[little.name]
    names = [m for m in args.models.split(",") if m]
    skip = {t for t in args.skip.split(",") if t}
    result: dict = {
        "groups": args.groups,
        "isa": isa,
        "frames": args.frames,
        "pocl_cu": os.environ.get("POCL_CPU_MAX_CU_COUNT"),
        "commit": os.environ.get("CODL_TVM_COMMIT"),
        "cpu_topology": _cpu_topology(),
        "models": {},
        "failed_builds": {},
    }

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2))

    # 1. builds ----------------------------------------------------------------------------
    paths = {n: _model_file(n, work / "models") for n in names}
    jobs = []
    for n in names:
        base = {"name": n, "model_path": str(paths[n]), "groups": args.groups, "isa": isa}
        for g in ("host", *(g.name for g in groups)):
            jobs.append(
                base
                | {
                    "kind": "layers",
                    "tag": f"layers_{g}",
                    "group": g,
                    "out": str(work / n / "layers"),
                }
            )
        for g in groups:
            jobs.append(
                base
                | {
                    "kind": "whole",
                    "tag": g.name,
                    "group": g.name,
                    "out": str(work / n / f"whole_{g.name}"),
                }
            )
        # kernel-level over every CPU core: built for the little ISA (the faithful baseline,
        # see the module docstring) and for the host's (an upper bound on this machine only)
        for tag, allcpu_isa in (("allcpu", little_isa), ("allcpu_big_isa", "host")):
            jobs.append(
                base
                | {
                    "kind": "whole",
                    "tag": tag,
                    "group": "allcpu",
                    "groups": f"allcpu:{','.join(map(str, all_cores))}",
                    "isa": {"allcpu": allcpu_isa},
                    "out": str(work / n / f"whole_{tag}"),
                }
            )
        if gpu_groups and not args.no_codl:
            k = int(os.environ.get("POCL_CPU_MAX_CU_COUNT") or len(gpu_groups[0].cores) or 4)
            jobs.append(
                base
                | {
                    "kind": "codl",
                    "tag": "codl",
                    "cost_model": args.cost_model,
                    # the cost model was profiled with TVM on 4 threads and PoCL on 12 cores
                    "processor_scale": [4 / len(big.cores), 12 / k],
                    "out": str(work / n / "codl"),
                }
            )
    jobs.sort(key=lambda j: -Path(j["model_path"]).stat().st_size)
    failed = _run_builds(jobs, args.jobs, log)
    result["failed_builds"] = {f"{n}/{t}": e for (n, t), e in failed.items()}
    save()

    # 2. measure ---------------------------------------------------------------------------
    models = {}
    tables = {}
    loaded = {}
    records = {}
    libraries = {}
    for n in names:
        if any(t.startswith("layers_") for m, t in failed if m == n):
            continue
        model = load_onnx(paths[n])
        models[n] = model
        libs = {p.stem.removeprefix("layers_"): p for p in (work / n / "layers").glob("*.so")}
        libraries[n] = libs
        t0 = time.perf_counter()
        tables[n] = measure_layers(model, groups, libs, number=args.number, repeat=args.repeat)
        records[n] = layer_records(tables[n], layer_shapes(model.mod))
        t1 = {g.name: float(tables[n][(g.name, 1)].sum()) for g in groups}
        entry = {
            "layers": tables[n].n_layers,
            "one_core_ms": t1,
            "whole_group_ms": {
                g.name: float(tables[n][(g.name, g.most_stage_cores)].sum()) for g in groups
            },
            "measure_s": time.perf_counter() - t0,
            # the whole time matrix and the layers' shapes: a Pipe-it model can be refitted
            # from the JSON alone
            "table_ms": {
                f"{g}:{c}": [float(v) for v in tables[n][(g, c)]] for g, c in tables[n].keys()
            },
            "layer_shapes": [
                [s.name, s.layer_type, s.out_pixels, s.filter_size, s.out_maps]
                for s in layer_shapes(model.mod)
            ],
        }
        if "little" in t1 and "big" in t1:
            entry["little_over_big_1core"] = t1["little"] / t1["big"]
        if not args.no_under_load:
            t0 = time.perf_counter()
            loaded[n] = measure_layers(
                model, groups, libs, number=args.number, repeat=args.repeat, under_load=True
            )
            entry["measure_loaded_s"] = time.perf_counter() - t0
            entry["table_loaded_ms"] = {
                f"{g}:{c}": [float(v) for v in loaded[n][(g, c)]] for g, c in loaded[n].keys()
            }
            # how much slower a layer runs beside the other cores' work than alone
            entry["loaded_over_alone_median_by_group"] = {
                g.name: float(
                    np.median(
                        [
                            loaded[n][k][i] / tables[n][k][i]
                            for k in tables[n].keys()
                            if k[0] == g.name
                            for i in range(tables[n].n_layers)
                            if tables[n][k][i] > 0
                        ]
                    )
                )
                for g in groups
            }
        result["models"][n] = entry
        log(f"measured {n}: {entry['whole_group_ms']}")
        save()

    # 3. plan ------------------------------------------------------------------------------
    # the executor's own cost per stage, measured here (the time matrix holds layers only)
    handoff = measure_handoff()
    result["handoff_ms_per_stage"] = handoff.stage_ms
    log(f"hand-off per stage: {handoff.stage_ms * 1e3:.1f} us")
    plans = {}
    staged = {}
    for n, table in tables.items():
        plans[n] = _plan_model(
            result["models"][n], n, table, records, layer_shapes(models[n].mod), groups, handoff
        )
        cpu, full = plans[n]["pipe_cpu"], plans[n]["pipe_gpu"]
        log(f"planned {n}: cpu {cpu.describe()} | all {full.describe()}")
        if n in loaded:
            _plan_loaded(result["models"][n], plans[n], loaded[n], groups, handoff)
        if args.stage_rounds > 0:
            measure = stage_timer(models[n], groups, libraries[n])
            staged[n] = _plan_staged(
                result["models"][n],
                plans[n],
                loaded.get(n, table),
                groups,
                handoff,
                measure,
                args.stage_rounds,
            )
            log(f"staged {n}: {json.dumps(result['models'][n]['staged_plans'])[:400]}")
        save()

    # 4. build the chosen pipelines, then stream everything ---------------------------------
    jobs = []
    for n, chosen in plans.items():
        for tag, plan in chosen.items():
            if tag == "pipe_gpu" and not gpu_groups:
                continue
            jobs.append(
                {
                    "name": n,
                    "model_path": str(paths[n]),
                    "groups": args.groups,
                    "isa": isa,
                    "kind": "pipeline",
                    "tag": tag,
                    "plan": plan.to_json(),
                    "out": str(work / n / tag),
                }
            )
    failed2 = _run_builds(jobs, args.jobs, log)
    result["failed_builds"].update({f"{n}/{t}": e for (n, t), e in failed2.items()})
    failed.update(failed2)
    save()
    for n in plans:
        rng = np.random.default_rng(0)
        frames = [
            [rng.standard_normal(t.shape).astype(t.dtype) for t in models[n].inputs]
            for _ in range(args.frames)
        ]
        jobs: dict[str, Callable[[], dict]] = {}
        todo = [(t, work / n / t) for t in plans[n] if (n, t) not in failed]
        todo += [("big", work / n / f"whole_{big.name}"), ("kernel_all", work / n / "whole_allcpu")]
        todo += [("kernel_all_big_isa", work / n / "whole_allcpu_big_isa")]
        todo += [("gpu", work / n / f"whole_{g.name}") for g in gpu_groups]
        for tag, path in todo:
            if (path / "pipeline.json").exists():
                some = frames[: args.gpu_frames] if tag == "gpu" else frames
                jobs[tag] = functools.partial(_run_pipeline, path, some, args.warmup)
        whole = {g.name: work / n / f"whole_{g.name}" for g in groups}
        whole = {g: p for g, p in whole.items() if (p / "pipeline.json").exists()}
        replica_sets = {"replicas": list(whole.values())}
        if gpu_groups:
            replica_sets["replicas_cpu"] = [whole[g.name] for g in cpu_groups if g.name in whole]
        for tag, ps in replica_sets.items():
            if len(ps) >= 2:
                jobs[tag] = functools.partial(_run_replicas, ps, frames, args.warmup)
        for tag in skip:
            jobs.pop(tag, None)
        if (work / n / "codl" / "manifest.json").exists():
            jobs["codl"] = functools.partial(
                _run_codl, work / n / "codl", frames, list(big.cores), args.warmup
            )
        rounds = _stream_rounds(jobs, args.rounds, lambda m, n=n: log(f"{n} {m}"))
        runs = _pooled_runs(rounds)
        # each stage's time in the stream over the time matrix's for its layers (alone):
        # above 1 where stages slow each other down (shared caches, memory, SMT siblings)
        for tag, plan in plans[n].items():
            if tag in runs:  # what each table promised this plan, beside what it streamed
                planned = {"alone": tables[n]} | ({"under_load": loaded[n]} if n in loaded else {})
                if n in staged:
                    planned["staged"] = staged[n]
                runs[tag]["planned_fps"] = {
                    k: recost_plan(plan, t, handoff=handoff).throughput_fps
                    for k, t in planned.items()
                }
            busy = runs.get(tag, {}).get("stage_busy_ms_per_frame")
            if busy and len(busy) == len(plan.stages):
                runs[tag]["busy_over_plan"] = [
                    b / st.latency_ms
                    for b, st in zip(busy.values(), plan.stages, strict=True)
                    if st.latency_ms > 0
                ]
        result["models"][n]["runs"] = runs
        for key, rate in (
            ("over_big", "steady_frames_per_s"),
            ("over_big_with_fill", "frames_per_s"),
        ):
            ratios = _round_ratios(rounds, rate, "big")
            if ratios:
                result["models"][n][key] = ratios
        save()

    # summary ------------------------------------------------------------------------------
    result["summary"] = _summary(result) | {"wall_s": time.perf_counter() - t_start}
    save()
    log(f"summary: {json.dumps(result['summary'])}")


if __name__ == "__main__":
    sys.exit(main())
