"""The weight-streaming floor (``CostModel.streaming``, ``PlannerConfig.weight_gbps``,
``--weight-gbps``): no part is predicted faster than its weights' bytes over its processor's
in-model rate. Hand-worked bytes and rates; the build test checks the artifact against its
reference. Nothing is timed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from codl_tvm.cli import bundled_model_path
from codl_tvm.core.errors import ArtifactError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model import FlopsModel, OpParams, OpRecord, Partition, op_features, part_shape
from codl_tvm.cost_model.base import load_model
from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.cost_model.features import weight_bytes
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.planner import PlannerConfig, PlannerError, plan_model
from codl_tvm.runtime.artifact import load_artifact

CONV = OpParams("conv2d", 32, 32, 64, 128, kernel=3, padding=(1, 1, 1, 1))
DENSE = OpParams("dense", 1, 1, 4096, 1000)

# Both processors draw no faster than this (GB/s) in the planner tests: the floor decides.
SLOW = (1e-3, 3e-3)


def test_weight_bytes_of_parts():
    whole = part_shape(CONV, Partition("none", 0.0), "cpu")
    assert weight_bytes("conv2d", whole, 3) == 128 * 64 * 9 * 4
    # an H split reads every filter; an OC split its own output channels' filters
    h_part = part_shape(CONV, Partition("H", 0.5), "gpu")
    assert weight_bytes("conv2d", h_part, 3) == 128 * 64 * 9 * 4
    oc_part = part_shape(CONV, Partition("OC", 0.25), "gpu")
    assert weight_bytes("conv2d", oc_part, 3) == oc_part.oc * 64 * 9 * 4 == 32 * 64 * 9 * 4
    dw = OpParams("conv2d", 16, 16, 32, 32, kernel=3, padding=(1, 1, 1, 1), groups=32)
    assert weight_bytes("conv2d", part_shape(dw, Partition("none", 0.0), "cpu"), 3) == 32 * 9 * 4
    dense_part = part_shape(DENSE, Partition("OC", 0.5), "cpu")
    assert weight_bytes("dense", dense_part, 1) == 4096 * dense_part.oc * 4
    pool = OpParams("pool", 16, 16, 32, 32, kernel=2, stride=2)
    assert weight_bytes("pool", part_shape(pool, Partition("none", 0.0), "cpu"), 2) == 0


def _flops_model() -> FlopsModel:
    """1 ms + 0.001 ms per GFLOP on both processors: far below any floor used here."""
    records = []
    for proc in ("cpu", "gpu"):
        for oc in (8, 16, 32):
            p = OpParams("dense", 1, 1, 64, oc)
            fl = 2.0 * 64 * oc
            records.append(OpRecord(p, Partition("none", 0.0), proc, "direct", 1.0 + 1e-12 * fl, 3))
    return FlopsModel().fit(records)


def test_streaming_floor_bounds_every_part():
    model = _flops_model()
    slow = model.streaming(cpu_gbps=2.0, gpu_gbps=4.0)
    assert model.weight_gbps == {} and slow.weight_gbps == {"cpu": 2.0, "gpu": 4.0}
    whole = op_features(DENSE, "cpu", "direct")
    nbytes = 4096 * 1000 * 4
    # bytes / (GB/s * 1e6) is milliseconds: 16.4 MB at 2 GB/s is 8.192 ms
    assert slow.predict(whole) == pytest.approx(nbytes / 2e6)
    assert model.predict(whole) == pytest.approx(1.0 + 1e-12 * 2 * 4096 * 1000)
    gpu_part = op_features(DENSE, "gpu", "direct", Partition("OC", 0.25))
    assert slow.predict(gpu_part) == pytest.approx(gpu_part.part.oc * 4096 * 4 / 4e6)
    # the floor never lowers a prediction: a fast rate leaves the line as it was
    assert model.streaming(1e6, 1e6).predict(whole) == pytest.approx(model.predict(whole))
    # Eq. 2 sees the floored parts (dense OC cuts are aligned: 496 + 504 channels)
    half = Partition("OC", 0.5)
    with pytest.warns(UserWarning, match="no data-sharing measurements"):
        lat = slow.predict_coexec(DENSE, half, "direct")
    cpu_oc, gpu_oc = (part_shape(DENSE, half, p).oc for p in ("cpu", "gpu"))
    assert cpu_oc + gpu_oc == 1000
    assert lat.cpu_ms == pytest.approx(cpu_oc * 4096 * 4 / 2e6)
    assert lat.gpu_ms == pytest.approx(gpu_oc * 4096 * 4 / 4e6)
    for bad in (0.0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match=r"cpu rate \(GB/s\) must be a positive number"):
            model.streaming(bad, 1.0)
    with pytest.raises(ValueError, match="gpu rate"):
        model.streaming(1.0, 0.0)


def test_planner_balances_weights_on_the_streaming_rates():
    """With rates this low every part's time is its floor: an OC split balances at the rates'
    ratio (GPU share 3/4), an H split gains nothing (each part reads every filter), and the
    decision's parts are the floors."""
    mod = load_onnx(bundled_model_path()).mod
    cm = load_model(default_model_path())
    plain, _ = plan_model(mod, cm, "codl")
    plan, report = plan_model(mod, cm, "codl", PlannerConfig(weight_gbps=SLOW))
    assert plan.to_json() != plain.to_json()
    assert any("weights stream: CPU 0.001 GB/s, GPU 0.003 GB/s" in n for n in report.notes)
    convs_and_dense = [d for d in report.decisions if d.ops[0].startswith(("conv2d", "matmul"))]
    assert convs_and_dense
    for d in convs_and_dense:
        assert d.dim == "OC" and d.ratio in (0.7, 0.8), (d.ops, d.dim, d.ratio)
        # whole-operator predictions are floors too: the CPU's rate is a third of the GPU's
        assert d.cpu_ms == pytest.approx(3 * d.gpu_ms)
    dense = next(d for d in report.decisions if d.ops == ("matmul_8",))
    assert dense.gpu_part_ms == pytest.approx(dense.gpu_ms * dense.ratio, rel=0.15)
    with pytest.raises(PlannerError, match="weight_gbps"):
        plan_model(mod, cm, "codl", PlannerConfig(weight_gbps=(1.0, 0.0)))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "codl_tvm.cli", *args], capture_output=True, text=True
    )


@pytest.mark.slow
def test_plan_cli_takes_weight_rates(tmp_path):
    report = tmp_path / "report.json"
    done = _cli(
        "plan",
        str(bundled_model_path()),
        "--cost-model",
        str(default_model_path()),
        "--weight-gbps",
        "0.001,0.003",
        "--report",
        str(report),
    )
    assert done.returncode == 0, done.stderr
    assert "weights stream: CPU 0.001 GB/s, GPU 0.003 GB/s" in done.stdout
    rows = json.loads(report.read_text())["decisions"]
    dense = next(r for r in rows if r["ops"] == ["matmul_8"])
    assert dense["dim"] == "OC" and dense["gpu_part_ms"] > 0
    for bad in ("1", "1,0", "a,b", "1,2,3", "-1,2"):
        done = _cli("plan", str(bundled_model_path()), "--cost-model", str(default_model_path()),
                    f"--weight-gbps={bad}")  # fmt: skip
        assert done.returncode == 2
        assert f"--weight-gbps {bad!r}: expected two positive rates" in done.stderr
        assert "Traceback" not in done.stderr


def test_compile_plans_with_weight_rates(opencl, tmp_path):
    out = tmp_path / "art"
    options = CompileOptions(weight_gbps=SLOW, measure=False)  # the planned co-executed build
    compile_artifact(bundled_model_path(), out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "coexec"
    assert manifest["plan"]["weight_gbps"] == list(SLOW)
    # LRN-like row blocks stay whole unless asked for (split_row_blocks=True)
    assert manifest["split_row_blocks"] is False and manifest["split_channel_blocks"] is True
    entries = {e.ops[0]: e for e in PartitionPlan.load(out / "plan.json").entries()}
    assert entries["matmul_8"].dim == "OC" and entries["matmul_8"].ratio in (0.7, 0.8)
    art = load_artifact(out)
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))
    for bad in ((1.0,), (1.0, 0.0), ("1", 2.0), 3.0):
        with pytest.raises(ArtifactError, match="weight_gbps must be two positive rates"):
            compile_artifact(bundled_model_path(), tmp_path / "x", CompileOptions(weight_gbps=bad))
