"""scripts/bench_pipeline.py end to end on the bundled model (two one-core CPU groups, no GPU):
every configuration streams, the searches agree with the exhaustive check, the JSON has the
summary the device run reports (no timing is checked)."""

from __future__ import annotations

import json

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
                "--work",
                str(tmp_path / "work"),
                "--out",
                str(out),
            ]
        )
    result = json.loads(out.read_text())
    assert result["failed_builds"] == {}
    entry = result["models"]["codl_small_cnn"]
    assert set(entry["runs"]) == {"pipe_cpu", "big", "kernel_all", "replicas"}
    assert all(r["frames"] == 4 for r in entry["runs"].values())
    assert entry["heuristic_fps_over_exhaustive3"]["cpu"] >= 1.0 - 1e-9
    assert entry["heuristic_fps_over_optimal"]["cpu"] <= 1.0 + 1e-9
    assert entry["little_over_big_1core"] > 0
    assert "pipe_cpu" in result["summary"]["mean_throughput_over_big"]
