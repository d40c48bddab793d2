"""scripts/noise_analysis.py --runs on two real profiling runs of the device machine.

The committed pair ``benchmarks/noise_ab/run_{a,b}.jsonl.gz`` is the same 71 compiled parts
profiled twice on the emulated SoC; the script's agreement figures must equal a plain
record-by-record comparison of the two files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.cost_model.evaluate import part_identity
from tests.scripts_util import script_module

ROOT = Path(__file__).resolve().parent.parent
RUNS = [ROOT / "benchmarks" / "noise_ab" / f"run_{r}.jsonl.gz" for r in "ab"]


@pytest.fixture(scope="module")
def noise_analysis():
    with script_module("noise_analysis") as module:
        yield module


def _plain_agreement(processor: str) -> tuple[int, float]:
    """Pairs and share within +-10% (each record taken as the other's prediction), by hand."""
    first = {r.key(): r for r in load_dataset(str(RUNS[0])).op_records}
    rel = []
    for r in load_dataset(str(RUNS[1])).op_records:
        o = first.get(r.key())
        if o is None or r.processor != processor:
            continue
        rel += [abs(r.latency_ms / o.latency_ms - 1), abs(o.latency_ms / r.latency_ms - 1)]
    return len(rel) // 2, sum(x <= 0.1 + 1e-12 for x in rel) / len(rel)


def test_compare_runs_matches_a_plain_comparison(noise_analysis, tmp_path, capsys):
    out = tmp_path / "runs.json"
    assert noise_analysis.main(["--runs", *map(str, RUNS), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python scripts/noise_analysis.py --runs")
    assert (
        report["timing"][0]
        == report["timing"][1]
        == {
            "warmup": 1,
            "repeats": 10,
            "number": 1,
            "min_repeat_ms": 2.0,
        }
    )
    for proc in ("cpu", "gpu"):
        pairs, acc10 = _plain_agreement(proc)
        assert report[proc]["pairs"] == pairs > 30
        assert math.isclose(report[proc]["acc10"], acc10)
        bands = report[proc]["by_latency"].values()
        assert sum(b["pairs"] for b in bands) == pairs
        # the recorded spread: (max - min) / median of each record's samples, never negative
        assert 0 <= report[proc]["recorded_spread_median"] <= report[proc]["recorded_spread_p90"]
    assert report["overall"]["pairs"] == report["cpu"]["pairs"] + report["gpu"]["pairs"]
    assert "within +-10%" in capsys.readouterr().out


def test_kernel_identity_is_the_cost_model_one(noise_analysis):
    """Identical parts are grouped by the same key as ``evaluate.noise_floor``."""
    (record, *_) = load_dataset(str(RUNS[0])).op_records
    assert noise_analysis._kernel_key("x.jsonl", record) == ("x.jsonl", *part_identity(record))
