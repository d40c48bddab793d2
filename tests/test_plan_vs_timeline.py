"""``scripts/plan_vs_timeline.py``: a plan report's predicted parts matched with the busy times
of the same splits in a timeline, and the ratios summarised per operator kind. Hand-worked
numbers; nothing is timed."""

from __future__ import annotations

import math

import pytest

from codl_tvm.planner.split.refine import SplitTime
from tests.scripts_util import ROOT, script_module


def _decision(ops, dim, ratio, cpu_part, gpu_part):
    return {
        "ops": ops,
        "dim": dim,
        "ratio": ratio,
        "cpu_part_ms": cpu_part,
        "gpu_part_ms": gpu_part,
    }


def test_parts_match_their_splits_and_whole_operators_are_left_out():
    decisions = [
        _decision(["conv2d_0", "conv2d_1"], "H", 0.5, 2.0, 4.0),  # a chain
        _decision(["matmul_8"], "OC", 0.7, 1.0, 2.0),
        _decision(["max_pool2d_2"], "H", 0.0, None, None),  # whole on the CPU
        _decision(["conv2d_3"], "H", 0.4, 1.0, 1.0),  # not in the timeline
    ]
    times = {
        "conv2d_0..conv2d_1": SplitTime(cpu_us=2500.0, gpu_us=2000.0, samples=1),
        "matmul_8": SplitTime(cpu_us=3000.0, gpu_us=3000.0, samples=1),
        "max_pool2d_2": SplitTime(cpu_us=100.0, gpu_us=0.0, samples=1),
    }
    with script_module("plan_vs_timeline") as m:
        rows = m.compare(decisions, times)
        assert [r["split"] for r in rows] == ["conv2d_0..conv2d_1", "matmul_8"]
        chain, dense = rows
        assert chain["kind"] == "chain" and dense["kind"] == "matmul"
        assert chain["cpu_ratio"] == pytest.approx(1.25)
        assert chain["gpu_ratio"] == pytest.approx(0.5)
        assert dense["cpu_meas_ms"] == pytest.approx(3.0)
        assert dense["cpu_ratio"] == pytest.approx(3.0)
        assert dense["gpu_ratio"] == pytest.approx(1.5)


def test_summary_per_kind_and_processor():
    rows = [
        {"kind": "matmul", "cpu_ratio": 2.0, "gpu_ratio": 1.0},
        {"kind": "matmul", "cpu_ratio": 8.0, "gpu_ratio": 1.1},
        {"kind": "conv2d", "cpu_ratio": 1.0, "gpu_ratio": None},
    ]
    with script_module("plan_vs_timeline") as m:
        s = m.summarise(rows)
    assert set(s) == {"conv2d:cpu", "matmul:cpu", "matmul:gpu"}
    assert s["matmul:cpu"]["parts"] == 2
    assert s["matmul:cpu"]["median"] == pytest.approx(5.0)
    assert s["matmul:cpu"]["geomean"] == pytest.approx(math.sqrt(16.0))
    assert s["matmul:cpu"]["within_20pct"] == 0.0
    assert s["matmul:gpu"]["within_20pct"] == 1.0
    assert s["conv2d:cpu"]["median"] == pytest.approx(1.0)


def test_decisions_record_the_predicted_parts_of_splits_and_chains(tmp_path):
    """The plan report carries each split's predicted parts (what the script reads), and they
    are the numbers its reason prints (YOLOv2 and the k = 12 cost model: a chain and splits)."""
    import re

    import onnx

    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.zoo import build_model
    from codl_tvm.planner import plan_model

    path = tmp_path / "yolov2.onnx"
    onnx.save(build_model("yolov2"), path)
    cost_model = load_model(ROOT / "codl_tvm/data/cost_models/emulated-soc-k12-alone.json")
    _, report = plan_model(load_onnx(path).mod, cost_model, "codl")
    with_parts = [d for d in report.decisions if d.cpu_part_ms is not None]
    assert any(d.is_chain for d in with_parts) and any(not d.is_chain for d in with_parts)
    for d in report.decisions:
        if d.cpu_part_ms is None:
            assert d.ratio in (0.0, 1.0) and d.split_ms != d.coexec_ms, d.reason
            continue
        assert 0.0 < d.ratio < 1.0
        m = re.search(r"cpu parts? ([\d.]+), gpu parts? ([\d.]+)", d.reason)
        assert m, d.reason
        assert float(m.group(1)) == pytest.approx(d.cpu_part_ms, abs=1e-3)
        assert float(m.group(2)) == pytest.approx(d.gpu_part_ms, abs=1e-3)
        assert d.to_dict()["sharing_ms"] == d.sharing_ms >= 0
