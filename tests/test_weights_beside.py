"""Weights stored beside the library (``compile --weights beside``): the artifact equals
onnxruntime and the embedded build on the CPU, on OpenCL and co-executed, in this process and in
a fresh process's first run (the cold path, where the loader overlaps the run); a truncated or
altered weights file gives one clear error naming the file and the weight. Nothing is timed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import ArtifactError
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.weights import WEIGHTS
from tests.scripts_util import script_module


def _onnxruntime(inputs: dict) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(bundled_model_path()), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def _compile(out: Path, weights: str, **kwargs) -> Path:
    return compile_artifact(bundled_model_path(), out, CompileOptions(weights=weights, **kwargs))


def _run(path: Path) -> tuple[dict, list[np.ndarray]]:
    art = load_artifact(path)
    inputs, _ = art.reference()
    return inputs, art([inputs[s.name] for s in art.model.inputs])


def _first_run_in_fresh_process(path: Path, tmp: Path) -> list[np.ndarray]:
    """The outputs of a new process's first run (``python -m codl_tvm.profiling.cold_start``)."""
    save = tmp / f"{path.name}-first.npz"
    proc = subprocess.run(
        [sys.executable, "-m", "codl_tvm.profiling.cold_start", str(path), "--save", str(save)],
        env={**os.environ, "CODL_TVM_CACHE_DIR": str(tmp / "cache")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["weights"] == "beside"
    with np.load(save) as data:
        return [data[k] for k in sorted(data.files, key=lambda k: int(k[4:]))]


def _check_beside(tmp: Path, **kwargs) -> None:
    """A beside build equals onnxruntime and the embedded build, here and in a first run."""
    beside = _compile(tmp / "beside", "beside", **kwargs)
    embedded = _compile(tmp / "embedded", "embedded", reference=False, **kwargs)
    manifest = load_artifact(beside).manifest
    record = manifest["weights"]
    assert record["placement"] == "beside" and record["tensors"]
    assert (beside / WEIGHTS).stat().st_size == record["bytes"]
    assert manifest["files"][WEIGHTS]  # hashed like every file of the artifact
    assert load_artifact(embedded).manifest["weights"] == {"placement": "embedded"}
    # the beside library holds only the small constants
    assert (beside / "model.so").stat().st_size < (embedded / "model.so").stat().st_size
    inputs, outs = _run(beside)
    art = load_artifact(embedded)
    ref = art([inputs[s.name] for s in art.model.inputs])
    for got, want, onnx_out in zip(outs, ref, _onnxruntime(inputs), strict=True):
        np.testing.assert_array_equal(got, want)  # the same kernels on the same weights
        np.testing.assert_allclose(got, onnx_out, rtol=1e-4, atol=1e-4)
    for got, want in zip(_first_run_in_fresh_process(beside, tmp), ref, strict=True):
        np.testing.assert_array_equal(got, want)


def test_cpu_weights_beside_equal_embedded_and_onnxruntime(tmp_path):
    _check_beside(tmp_path, device="cpu")


@pytest.mark.opencl
def test_opencl_weights_beside_equal_embedded_and_onnxruntime(tmp_path, opencl):
    _check_beside(tmp_path, device="opencl")


@pytest.mark.slow  # 16 s on 2 cores; CI keeps the GPU-alone and CPU siblings
@pytest.mark.opencl
def test_coexec_weights_beside_equal_embedded_and_onnxruntime(tmp_path, opencl):
    plan = uniform_plan(load_onnx(bundled_model_path()).mod, "OC", 0.5)
    _check_beside(tmp_path, device="coexec", plan=plan)


@pytest.fixture(scope="module")
def cpu_beside(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("weights") / "cpu", "beside", device="cpu")


def test_truncated_weights_file_is_one_clear_error(cpu_beside, tmp_path, capsys):
    art = tmp_path / "art"
    shutil.copytree(cpu_beside, art)
    size = (art / WEIGHTS).stat().st_size
    os.truncate(art / WEIGHTS, size - 100)
    assert main(["run", str(art)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("codl-tvm: error: ") and WEIGHTS in err[-1]
    assert "Traceback" not in "\n".join(err)
    # the loader's own check, where the files' hashes are not verified (a cold start)
    loaded = load_artifact(art, verify=False)
    with pytest.raises(ArtifactError, match=rf"{WEIGHTS}: {size - 100} bytes .*truncated"):
        loaded.vm


def test_altered_weight_names_the_file_and_the_weight(cpu_beside, tmp_path):
    art = tmp_path / "art"
    shutil.copytree(cpu_beside, art)
    record = json.loads((art / "manifest.json").read_text())["weights"]
    last = len(record["tensors"]) - 1
    with open(art / WEIGHTS, "r+b") as f:  # flip bytes inside the last weight
        f.seek(record["tensors"][last]["offset"] + 8)
        f.write(b"\xff\xff\xff\xff")
    loaded = load_artifact(art, verify=False)
    inputs, _ = loaded.reference()
    with pytest.raises(ArtifactError, match=rf"{WEIGHTS}: weight {last} .* CRC-32"):
        loaded([inputs[s.name] for s in loaded.model.inputs])


def test_unknown_placement_is_refused(tmp_path, capsys):
    with pytest.raises(ArtifactError, match="'inline' is not one of embedded, beside"):
        _compile(tmp_path / "x", "inline", device="cpu")
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as exc:
        main(["compile", "--weights", "inline", "-o", str(tmp_path / "y")])
    assert exc.value.code == 2
    capsys.readouterr()
    argv = ["compile", "--objective", "throughput", "--groups", "big:0-1,gpu", "--weights"]
    assert main([*argv, "beside", "-o", str(tmp_path / "z")]) == 2
    assert "--weights apply to --objective latency" in capsys.readouterr().err


def test_build_cache_keeps_the_weights_with_the_library(tmp_path, caplog):
    cache = tmp_path / "cache"
    first = _compile(tmp_path / "a", "beside", device="cpu", build_cache=cache)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="codl_tvm"):
        second = _compile(tmp_path / "b", "beside", device="cpu", build_cache=cache)
    assert any("reusing the cpu library from the build cache" in m for m in caplog.messages)
    assert (first / WEIGHTS).read_bytes() == (second / WEIGHTS).read_bytes()
    assert load_artifact(second).manifest["weights"] == load_artifact(first).manifest["weights"]
    _, outs = _run(second)
    for got, want in zip(outs, load_artifact(second).reference()[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.opencl
def test_verify_builds_the_chosen_library_again_with_its_weights_beside(tmp_path, opencl):
    out = _compile(tmp_path / "v", "beside", device="coexec", verify=1)
    manifest = load_artifact(out).manifest
    assert manifest["weights"]["placement"] == "beside" and manifest["verify"]["chosen"]
    _, outs = _run(out)
    for got, want in zip(outs, load_artifact(out).reference()[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _row(scenario: str, weight_read: float, first_run: float, warm: float | None = None) -> dict:
    phases = {"process_start": 5.0, "library_load": 100.0, "weight_read": weight_read}
    row = {"model": "m", "build": "gpu", "scenario": scenario, "first_output_ms": 0.0}
    row["phases_ms"] = {**phases, "first_run": first_run}
    return row if warm is None else {**row, "warm_median_ms": warm}


def test_bench_cold_summary_has_the_beside_scenario_and_its_ablation():
    rows = [
        _row("aot", 30.0, 20.0, warm=10.0),
        _row("beside", 2.0, 23.0, warm=12.5),
        _row("beside_sequential", 32.0, 20.0),
    ]
    with script_module("bench_cold") as bench:
        entry = bench.summarize(rows)["gpu"]
    m = entry["m"]
    assert (m["cold_ms"], m["beside_cold_ms"], m["beside_sequential_cold_ms"]) == (50, 25, 52)
    assert m["beside_cold_over_warm"] == entry["_mean_beside_cold_over_warm"] == 25 / 12.5
    assert m["beside_speedup_over_embedded"] == 2.0


def test_bench_cold_compiles_the_beside_sibling_of_an_artifact(tmp_path):
    original = _compile(tmp_path / "m" / "cpu", "embedded", device="cpu")
    with script_module("bench_cold") as bench:
        line = bench._compile_beside(str(tmp_path), "m/cpu")
    sibling = tmp_path / "m" / "cpu-beside"
    assert line == f"{sibling}: cpu"
    assert load_artifact(sibling).manifest["weights"]["placement"] == "beside"
    inputs, outs = _run(sibling)
    art = load_artifact(original)
    for got, want in zip(outs, art([inputs[s.name] for s in art.model.inputs]), strict=True):
        np.testing.assert_array_equal(got, want)
