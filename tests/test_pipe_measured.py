"""Pipe-it's search and model on latency tables measured on the device machine.

``tests/data/pipe_tables.json`` holds the per-layer time matrices of five CNNs measured by
``scripts/bench_pipeline.py`` on the emulated SoC (``gpu`` = PoCL on 4 cores, ``big`` = AVX-512
kernels on 8 cores, ``little`` = x86-64-v2 kernels on 4 cores), with each layer's GEMM shape.
``tests/data/pipe_tables_gpu1.json`` holds three CNNs of a later run (``gpu`` = PoCL on 1 core,
``big`` = 8 cores, ``little`` = 7 x86-64-v2 cores, no SMT) with its measured hand-off per stage:
15 CPU cores have too many interleavings to start Algorithm 3 from each, and the optima there
alternate clusters (``little3 - big4 - little2 - big1 - little2 - big1 - big2``).
``tests/data/pipe_tables_avx2.json`` holds the same three CNNs of a run with an AVX2 (no FMA)
little cluster, which makes the little cores faster and the optima alternate in other blocks.
``tests/data/pipe_tables_h200.json`` holds AlexNet, Inception v1 and ResNet50 of the same
configuration on another VM, where AlexNet's optimum over the CPU groups has six stages and
the best pipeline of three is a local optimum the coarse restarts from the best end alone
cannot leave.
Real tables are less regular than synthetic ones (more cores can be slower, a layer's best group
changes along the model), which is where the search and the model fit missed before.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.planner.stages.layer_model import MIN_LATENCY_MS, LayerShape, PipeRecord
from codl_tvm.planner.stages.search import (
    HandOff,
    LatencyTable,
    ProcessorGroup,
    exhaustive_pipeline,
    optimal_pipeline,
    parse_groups,
    search_pipeline,
)
from tests.scripts_util import script_module

DATA = Path(__file__).parent / "data" / "pipe_tables.json"
DATA_GPU1 = Path(__file__).parent / "data" / "pipe_tables_gpu1.json"
DATA_AVX2 = Path(__file__).parent / "data" / "pipe_tables_avx2.json"
DATA_H200 = Path(__file__).parent / "data" / "pipe_tables_h200.json"
MACHINE = range(16)  # the device machine's cores; nothing runs on them here
MODELS = ("bvlc_alexnet", "inception_v1", "posenet", "resnet50", "squeezenet")


@functools.cache
def measured() -> dict:
    return json.loads(DATA.read_text())


def groups(which: str) -> tuple[ProcessorGroup, ...]:
    all_groups = parse_groups(measured()["groups"], MACHINE)
    return all_groups if which == "all" else tuple(g for g in all_groups if g.kind == "cpu")


def table(model: str) -> LatencyTable:
    entry = measured()["models"][model]["table_ms"]
    return LatencyTable({(k.split(":")[0], int(k.split(":")[1])): v for k, v in entry.items()})


def shapes(model: str) -> list[LayerShape]:
    return [LayerShape(*s) for s in measured()["models"][model]["layer_shapes"]]


def fps_ratio(plan, reference) -> float:
    """``plan``'s throughput over ``reference``'s (>= 1: plan is at least as fast)."""
    return reference.bottleneck_ms / plan.bottleneck_ms


def test_optimal_equals_exhaustive_without_a_stage_limit():
    # 2 big + 1 little cores and a GPU hold at most 4 stages: the exhaustive search of up to 4
    # stages is the optimum over every stage sequence, which the dynamic program must match.
    rng = np.random.default_rng(3)
    gs = parse_groups("big:0-1,little:2,gpu", MACHINE)
    for _ in range(5):
        base = rng.uniform(0.5, 3.0, size=7)
        raw = {
            ("big", 1): base,
            ("big", 2): base * rng.uniform(0.5, 1.1, size=7),
            ("little", 1): base * rng.uniform(2.0, 5.0, size=7),
            ("gpu", 1): base * rng.uniform(0.2, 4.0, size=7),
        }
        transfer = rng.uniform(0.0, 0.3, size=6)
        opt = optimal_pipeline(raw, gs, transfer_ms=transfer, available=MACHINE)
        ex = exhaustive_pipeline(raw, gs, max_stages=4, transfer_ms=transfer, available=MACHINE)
        assert opt.bottleneck_ms == pytest.approx(ex.bottleneck_ms, rel=1e-12)
        # its stages are real: contiguous, covering every layer, within each group's cores
        assert opt.stages[0].first_layer == 0 and opt.stages[-1].stop_layer == 7
        for a, b in zip(opt.stages, opt.stages[1:], strict=False):
            assert a.stop_layer == b.first_layer
        used = {}
        for s in opt.stages:
            used[s.group] = used.get(s.group, 0) + s.core_count
        assert used.get("big", 0) <= 2 and used.get("little", 0) <= 1 and used.get("gpu", 0) <= 1


def check_search(model: str, which: str) -> None:
    t, gs = table(model), groups(which)
    ex3 = exhaustive_pipeline(t, gs, max_stages=3, available=MACHINE)
    opt = optimal_pipeline(t, gs, available=MACHINE)
    heuristic = search_pipeline(t, gs, available=MACHINE, exact_stages=False)
    full = search_pipeline(t, gs, available=MACHINE)
    # the optimum over any stage count is at least the <= 3-stage optimum
    assert opt.bottleneck_ms <= ex3.bottleneck_ms * (1 + 1e-12)
    # Pipe-it's heuristic (with the local search) within 2 % of the <= 3-stage optimum ...
    assert fps_ratio(heuristic, ex3) >= 0.98, (heuristic.describe(), ex3.describe())
    # ... and of the optimum over any stage count (it stopped at 0.89-0.97 on these tables
    # before the alternating starts, stage moves and the tie-break)
    assert fps_ratio(heuristic, opt) >= 0.98, (heuristic.describe(), opt.describe())
    # ... and the search as the planner runs it within 2 % of the optimum
    assert fps_ratio(full, opt) >= 0.98, (full.describe(), opt.describe())
    assert fps_ratio(full, ex3) >= 0.98


@pytest.mark.parametrize("model", MODELS)
def test_search_on_measured_cpu_tables(model):
    check_search(model, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_search_on_measured_tables_with_gpu(model):
    check_search(model, "all")


def stored(path: Path, model: str, which: str) -> tuple[LatencyTable, tuple, HandOff]:
    """A stored run's table of ``model``, its CPU groups (``which="cpu"``) or all groups, and
    the run's measured hand-off per stage (as the benchmark plans)."""
    data = json.loads(path.read_text())
    gs = parse_groups(data["groups"], MACHINE)
    if which == "cpu":
        gs = tuple(g for g in gs if g.kind == "cpu")
    entry = data["models"][model]["table_ms"]
    t = LatencyTable({(k.split(":")[0], int(k.split(":")[1])): v for k, v in entry.items()})
    return t, gs, HandOff(data["handoff_ms_per_stage"])


# The 8 + 7-core runs' tables (the five-model run's are checked by check_search above); the
# Inception v1 table of the AVX2 run on CPU groups is the quick one CI runs.
FIFTEEN_CORE_TABLES = [
    pytest.param(
        path,
        model,
        which,
        id=f"{path.stem}-{model}-{which}",
        marks=()
        if (path, model, which) == (DATA_AVX2, "inception_v1", "cpu")
        else (pytest.mark.slow,),
    )
    for path in (DATA_GPU1, DATA_AVX2)
    for model in ("squeezenet", "inception_v1", "resnet50")
    for which in ("cpu", "all")
] + [
    pytest.param(
        DATA_H200, model, which, id=f"{DATA_H200.stem}-{model}-{which}", marks=pytest.mark.slow
    )
    for model in ("bvlc_alexnet", "inception_v1", "resnet50")
    for which in ("cpu", "all")
    # AlexNet over the CPU groups: test_coarse_restarts_from_several_block_structures
    if (model, which) != ("bvlc_alexnet", "cpu")
]


@pytest.mark.parametrize(("path", "model", "which"), FIFTEEN_CORE_TABLES)
def test_heuristic_within_two_percent_of_the_optimum_on_15_cpu_cores(path, model, which):
    # Pipe-it's Algorithms 1-3 with the local search and its restarts alone (no optimum
    # swapped in), with the run's measured hand-off. On the x86-64-v2 run's Inception v1 it
    # stopped at 0.94 of the optimum's throughput with every big stage before every little
    # one (before the alternating starts, the stage moves and the tie-break on the next
    # slowest stages); on the AVX2 run's at 0.979 (CPU groups) and 0.971 (all groups), in
    # other blocks of clusters than the optimum's (before the coarse restarts).
    t, gs, handoff = stored(path, model, which)
    heuristic = search_pipeline(t, gs, available=MACHINE, exact_stages=False, handoff=handoff)
    opt = optimal_pipeline(t, gs, available=MACHINE, handoff=handoff)
    assert heuristic.method == "pipe-it"
    assert fps_ratio(heuristic, opt) >= 0.98, (heuristic.describe(), opt.describe())


def test_coarse_restarts_leave_the_local_optimum_of_other_cluster_blocks():
    # The AVX2 run's Inception v1 on 8 big + 7 little cores: the local search ends in
    # little2 - big4 - big1 - big1 - big1 - little1 - big1 - little2 - little1 - little1 (the
    # clusters in blocks little2 - big7 - little1 - big1 - little4), 0.979 of the optimum
    # little2 - big4 - little3 - little1 - big1 - big1 - little1 - big1 - big1, which no single
    # move that lowers the bottleneck reaches; restarting from the moved blocks does.
    t, gs, handoff = stored(DATA_AVX2, "inception_v1", "cpu")
    kw = {"available": MACHINE, "exact_stages": False, "handoff": handoff}
    without = search_pipeline(t, gs, coarse_restarts=False, **kw)
    with_restarts = search_pipeline(t, gs, **kw)
    opt = optimal_pipeline(t, gs, available=MACHINE, handoff=handoff)
    assert fps_ratio(without, opt) < 0.98
    assert with_restarts.bottleneck_ms == pytest.approx(opt.bottleneck_ms, rel=1e-9)


def test_coarse_restarts_from_several_block_structures(monkeypatch):
    # Run B's AlexNet on 8 big + 7 little cores: the local search's best ends are
    # big6 - little7 - big2 (5.73 ms, the best pipeline of three stages) and its split
    # big5 - big1 - little7 - big2, one block structure; the coarse restarts from it stop
    # there, 0.961 of the optimum little4 - big3 - little1 - little1 - big5 - little1 (5.50 ms).
    # From the third-best end's blocks (little4 - big3 - little3 - big5) they reach it.
    import codl_tvm.planner.stages.search as pipe_search

    t, gs, handoff = stored(DATA_H200, "bvlc_alexnet", "cpu")
    kw = {"available": MACHINE, "exact_stages": False, "handoff": handoff}
    opt = optimal_pipeline(t, gs, available=MACHINE, handoff=handoff)
    assert len(opt.stages) == 6
    assert search_pipeline(t, gs, **kw).bottleneck_ms == pytest.approx(opt.bottleneck_ms)
    monkeypatch.setattr(pipe_search, "COARSE_STARTS", 1)
    assert fps_ratio(search_pipeline(t, gs, **kw), opt) < 0.97


def leave_one_model_out(loss: str) -> tuple[dict[str, list[float]], int]:
    """Each model's table predicted by the benchmark's predictor fitted on the other four:
    relative errors per group (pooled over models) and how many predictions hit the floor."""
    records = {}
    for m in MODELS:
        t, s = table(m), shapes(m)
        records[m] = [
            PipeRecord(layer, g, c, float(ms))
            for g, c in t.keys()
            for layer, ms in zip(s, t[(g, c)], strict=True)
        ]
    errors: dict[str, list[float]] = {}
    floored = 0
    with script_module("bench_pipeline") as bench:
        for m in MODELS:
            t = table(m)
            predict = bench._fit_predictor(records, groups("all"), m, loss, t)
            for g, c in t.keys():
                for i, (layer, ms) in enumerate(zip(shapes(m), t[(g, c)], strict=True)):
                    p = predict(i, layer, g, c)
                    floored += p <= MIN_LATENCY_MS
                    errors.setdefault(g, []).append(abs(p / ms - 1))
    return errors, floored


def test_relative_fit_predicts_unseen_models_better_than_the_absolute_fit():
    # Leave-one-model-out on five real tables (the benchmark's predicted-choice check). The
    # absolute (paper) fit floors 150+ predictions to 1 ns and is off by a median 53-97 % per
    # group; the relative, non-negative fit floors none and is better on every group (on this
    # data: gpu 63 %, big 37 %, little 26 %). Neither is near the 4 % choice target: see
    # docs/benchmarks.md.
    relative, rel_floored = leave_one_model_out("relative")
    absolute, abs_floored = leave_one_model_out("absolute")
    assert rel_floored == 0 and abs_floored > 0
    for g in ("gpu", "big", "little"):
        assert np.median(relative[g]) < np.median(absolute[g]), g
    assert np.median(relative["big"]) < 0.4 and np.median(relative["little"]) < 0.3
