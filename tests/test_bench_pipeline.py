"""scripts/bench_pipeline.py end to end on the bundled model (two one-core CPU groups, no GPU):
every configuration streams, the searches agree with the exhaustive check, the JSON has the
summary the device run reports (no timing is checked)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.scripts_util import script_module


@pytest.mark.slow
def test_bench_pipeline_runs_every_configuration(tmp_path):
    out = tmp_path / "pipeline.json"
    with script_module("bench_pipeline") as bench:
        bench.main(
            [
                "--models",
                "codl_small_cnn",
                "--groups",
                "big:0,little:1",
                "--jobs",
                "1",
                "--frames",
                "4",
                "--warmup",
                "1",
                "--number",
                "1",
                "--repeat",
                "1",
                "--no-codl",
                "--rounds",
                "2",
                "--stage-rounds",
                "3",
                "--skip",
                "kernel_all_big_isa",
                "--work",
                str(tmp_path / "work"),
                "--out",
                str(out),
            ]
        )
    result = json.loads(out.read_text())
    assert result["failed_builds"] == {}
    entry = result["models"]["codl_small_cnn"]
    # kernel_all: every core with the little ISA (kernel_all_big_isa, the host's, skipped)
    base = {"pipe_cpu", "big", "kernel_all", "replicas"}
    # the plans searched on the table timed under load and refined on measured stages stream
    # where they differ from the plans before them
    loaded = entry["loaded_plans"]["pipe_cpu_loaded"]
    staged = entry["staged_plans"]["pipe_cpu_staged"]
    extra = {"pipe_cpu_loaded"} if loaded["same_as"] is None else set()
    extra |= {"pipe_cpu_staged"} if staged["same_as"] is None else set()
    assert set(entry["runs"]) == base | extra
    assert loaded["same_as"] in (None, "pipe_cpu")
    assert staged["same_as"] in (None, "pipe_cpu", "pipe_cpu_loaded")
    assert 1 <= len(staged["refinement"]["rounds"]) <= 3
    assert set(entry["loaded_over_alone_median_by_group"]) == {"big", "little"}
    assert set(entry["runs"]["pipe_cpu"]["planned_fps"]) == {"alone", "under_load", "staged"}
    assert result["isa"] == {"little": "x86-64-v3-nofma"}
    assert isinstance(result["summary"]["little_over_big_1core_in_pipe_it_range"], bool)
    assert all(r["frames"] == 4 for r in entry["runs"].values())
    # two rounds of each configuration, pooled: the rate is the median of the rounds'
    assert all(len(r["steady_frames_per_s_rounds"]) == 2 for r in entry["runs"].values())
    big = entry["runs"]["big"]
    assert big["steady_frames_per_s"] == pytest.approx(np.median(big["steady_frames_per_s_rounds"]))
    assert entry["over_big"]["big"] == 1.0
    assert entry["heuristic_fps_over_exhaustive3"]["cpu"] >= 1.0 - 1e-9
    assert entry["heuristic_fps_over_optimal"]["cpu"] <= 1.0 + 1e-9
    assert entry["little_over_big_1core"] > 0
    assert "pipe_cpu" in result["summary"]["mean_throughput_over_big"]


def test_replan_costs_each_predicted_choice_on_the_measured_tables(tmp_path):
    # Three "models" whose time matrices follow Pipe-it's Eq. 5/8 exactly: every predictor,
    # fitted on the other two, predicts the third's table, so the pipeline it picks streams
    # as fast (on the measured table, hand-off counted) as the one picked from measurements.
    # Eq. 8 is serial + parallel / H per layer, so amdahl's two anchors predict it exactly.
    from codl_tvm.planner.stages.layer_model import LayerShape
    from tests.test_pipe_model import GROUPS, sample_layers, true_latency

    models = {}
    for seed in (3, 4, 5):
        layers = [
            LayerShape(f"l{i}", s.layer_type, s.out_pixels, s.filter_size, s.out_maps)
            for i, s in enumerate(sample_layers(12, seed))
        ]
        models[f"m{seed}"] = {
            "layers": len(layers),
            "one_core_ms": {},
            "whole_group_ms": {},
            "table_ms": {
                f"{g}:{c}": [true_latency(s, g, c) for s in layers]
                for g, most in GROUPS.items()
                for c in range(1, most + 1)
            },
            "layer_shapes": [
                [s.name, s.layer_type, s.out_pixels, s.filter_size, s.out_maps] for s in layers
            ],
        }
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"groups": "gpu:0,big:1-4,little:5-8", "models": models}))
    out = tmp_path / "replanned.json"
    with script_module("bench_pipeline") as bench:
        bench.main(["--replan", str(run), "--handoff-ms", "0.01", "--out", str(out)])
        predictors = bench.PREDICTORS
    result = json.loads(out.read_text())
    assert result["handoff_ms_per_stage"] == 0.01
    for name, entry in result["models"].items():
        assert entry["searches"]["all_search"]["min_cycle_ms"] > 0, name
        assert entry["heuristic_fps_over_optimal"]["all"] <= 1.0 + 1e-9
        assert predictors[0] == "on_demand"  # the predictor pipe_pred streams
        for method in ("on_demand", "amdahl", "eq8", "relative"):
            suffix = "" if method == predictors[0] else f"_{method}"
            ratio = entry["predicted_choice_over_measured_choice" + suffix]
            assert ratio == pytest.approx(1.0, rel=1e-3), (name, method)
