"""A default compile measures what it chose: never slower than the best single processor.

The co-executed plan and each processor alone are built and timed on this machine's OpenCL
device (PoCL or Intel's CPU runtime: a CPU runtime on the same cores, where co-execution rarely
pays); the fastest is the artifact. Cost models record the device they were fitted on, and a
compile for another device says so. No test times anything: they check what was compared and
that the choice is the fastest of what was measured.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.build.targets import get_preset
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model.defaults import SHIPPED, shipped_model_path
from codl_tvm.cost_model.fitted_device import (
    describe_device,
    device_mismatch,
    fitted_device,
    merge_devices,
)
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.objectives.measure import MEASURE_ROUNDS, measurement
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import load_artifact

H100 = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "platform": "NVIDIA CUDA (OpenCL 3.0 CUDA 13.0.98)",
    "compute_units": 132,
    "svm_mode": "coarse",
    "cpu_threads": 16,
}


def test_same_device_with_another_driver_matches():
    newer = {**H100, "platform": "NVIDIA CUDA (OpenCL 3.0 CUDA 13.1.2)"}
    assert device_mismatch(H100, newer) is None


def test_another_device_is_named_with_what_differs():
    here = {"gpu": "AMD EPYC", "platform": "Intel(R) OpenCL (OpenCL 3.1)", "compute_units": 2,
            "cpu_threads": 2}  # fmt: skip
    why = device_mismatch(H100, here)
    assert "NVIDIA H100 80GB HBM3 (NVIDIA CUDA, 132 compute units) with 16 CPU threads" in why
    assert "AMD EPYC (Intel(R) OpenCL, 2 compute units) with 2 CPU threads" in why
    assert "device, platform, compute units, CPU threads differ" in why
    # the core split of an emulated SoC is part of its device
    assert "compute units" in device_mismatch(H100, {**H100, "compute_units": 8})
    assert device_mismatch(None, here) == "it does not record the device it was fitted on"


def test_merged_devices_say_when_datasets_disagree():
    assert merge_devices([H100, dict(H100)]) == H100
    assert merge_devices([H100, {**H100, "cpu_threads": 8}])["mixed"] is True
    assert merge_devices([]) is None


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_model_records_the_device_of_its_datasets(name):
    meta = json.loads(shipped_model_path(name).read_text())["meta"]
    device = fitted_device(meta)
    datasets = [meta["dataset"]] if isinstance(meta["dataset"], str) else meta["dataset"]
    root = Path(__file__).resolve().parents[1]
    with gzip.open(root / datasets[0], "rt") as f:
        lines = [json.loads(line) for line in f]
    recorded = next(x["desc"] for x in lines if x.get("type") == "device")
    assert device_mismatch(device, recorded) is None
    assert describe_device(device).startswith(recorded["gpu"])


def test_what_is_measured_where():
    opencl = get_preset("opencl")
    assert measurement(CompileOptions(verify=5), opencl) == (5, None)
    assert measurement(CompileOptions(measure=False), opencl)[0] == 0
    assert measurement(CompileOptions(device="cpu"), opencl) == (0, None)
    # a cross-compiling preset cannot be timed here; a tracker's device can
    rounds, why = measurement(CompileOptions(), get_preset("linux-arm64-pocl"))
    assert rounds == 0 and "cross-compiles" in why and "tracker" in why
    remote = CompileOptions(tracker="127.0.0.1:9190", key="board")
    assert measurement(remote, get_preset("linux-arm64-pocl")) == (MEASURE_ROUNDS, None)


@pytest.mark.opencl
@pytest.mark.parametrize("cost_model", ["shipped", "balanced"])
def test_default_compile_keeps_the_fastest_measured_build(cost_model, tmp_path, opencl, caplog):
    """The shipped model (an emulated SoC's) keeps the bundled CNN on the CPU here: the two
    processors alone are timed; a balanced synthetic model splits it: the co-executed build is
    timed too. Either way the fastest is the artifact, and it matches its reference."""
    options = CompileOptions()
    if cost_model == "balanced":
        synthetic_cost_model(SyntheticDevice()).save(tmp_path / "balanced.json")
        options = CompileOptions(cost_model=tmp_path / "balanced.json")
    out = tmp_path / "art"
    with caplog.at_level(logging.INFO):
        compile_artifact(bundled_model_path(), out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    measured, medians = manifest["verify"], manifest["verify"]["median_ms"]
    splits = {e.ratio for e in PartitionPlan.load(out / "plan.json").entries()} - {0.0, 1.0}
    assert set(medians) == {"cpu", "opencl"} | ({"coexec"} if splits else set())
    assert splits or cost_model == "shipped"  # the balanced model co-executes on paper
    assert all(len(s) == MEASURE_ROUNDS for s in measured["samples_ms"].values())
    assert measured["chosen"] == min(medians, key=medians.get)
    assert manifest["device"] == measured["chosen"]
    assert "unchecked" not in manifest["plan"]
    assert "measured on this machine" in caplog.text
    if cost_model == "shipped":
        # it describes an emulated SoC, not this machine: said, and recorded
        assert "it was fitted on" in manifest["plan"]["cost_model"]["device_mismatch"]
        assert "checked by measuring" in caplog.text
    art = load_artifact(out)
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.opencl
def test_no_measure_keeps_the_prediction_and_says_it_is_unchecked(tmp_path, opencl, capsys):
    out = tmp_path / "art"
    assert main(["compile", str(bundled_model_path()), "--no-measure", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert "verify" not in manifest
    assert "not measured" in manifest["plan"]["unchecked"]
    assert "unchecked" in capsys.readouterr().err
