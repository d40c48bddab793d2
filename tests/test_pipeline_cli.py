"""``codl-tvm compile --objective throughput`` and ``codl-tvm run PIPELINE/ [--stream N]``: the
artifact's outputs against onnxruntime, its manifest and reference (which ``run`` checks), the
stream report, and bad input refused with one line before any frame runs."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import shutil
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import ModelError
from codl_tvm.objectives.throughput import ThroughputOptions
from codl_tvm.options import OptionsError
from codl_tvm.runtime.staged_artifact import load_pipeline
from tests.test_transform_stages import _residual_cnn


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipe")
    model = tmp / "residual.onnx"
    onnx.save(_residual_cnn(), str(model))
    out = tmp / "art"
    assert (
        main(
            [
                "compile",
                str(model),
                "-o",
                str(out),
                "--objective",
                "throughput",
                "--groups",
                "big:0,little:1",
                "--isa",
                "little=x86-64-v2",
            ]
        )
        == 0
    )
    return model, out


def _ort(model, x):
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_compile_records_stages_groups_and_latencies(compiled):
    _, out = compiled
    manifest = json.loads((out / "pipeline.json").read_text())
    assert [g["name"] for g in manifest["groups"]] == ["big", "little"]
    assert {g["isa"] for g in manifest["groups"]} == {"host", "x86-64-v2"}
    layers = [s["layers"] for s in manifest["stages"]]
    assert layers[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(layers))
    assert layers[-1][1] == len(manifest["latencies"]["layers"])
    assert set(manifest["latencies"]["ms"]) == {"big:1", "little:1"}
    assert manifest["latencies"]["source"] == "measured on this machine under load"
    assert manifest["latencies"]["stages_ms"] == []


def test_stage_rounds_plan_on_measured_stages(tmp_path):
    model = tmp_path / "residual.onnx"
    onnx.save(_residual_cnn(), str(model))
    out = tmp_path / "art"
    argv = ["compile", str(model), "-o", str(out), "--objective", "throughput"]
    argv += ["--groups", "big:0,little:1", "--isa", "little=x86-64-v2", "--stage-rounds", "3"]
    assert main(argv) == 0
    manifest = json.loads((out / "pipeline.json").read_text())
    assert manifest["latencies"]["source"] == (
        "measured on this machine under load, stages timed together"
    )
    # the kept stages' times are measured stages (refine_with_stages), not sums of layers
    measured = {tuple(m[:4]): m[4] for m in manifest["latencies"]["stages_ms"]}
    for st in manifest["stages"]:
        key = (st["group"], st["core_count"], *st["layers"])
        assert key in measured
        assert st["predicted_ms"] == pytest.approx(
            measured[key] + manifest["latencies"]["handoff_ms_per_stage"]
        )


def test_run_single_inference_and_stream_equal_onnxruntime(compiled, tmp_path, capsys):
    model, out = compiled
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    for extra in ([], ["--stream", "7"]):
        saved = tmp_path / f"out{len(extra)}.npz"
        argv = ["run", str(out), "--inputs", str(tmp_path / "in.npz"), "--save-outputs", str(saved)]
        assert main([*argv, "--repeat", "1", "--number", "1", *extra]) == 0
        with np.load(saved) as data:
            np.testing.assert_allclose(data["y"], _ort(model, x), rtol=1e-4, atol=1e-4)
    text = capsys.readouterr().out
    assert "stream: 7 frames" in text and "frames/s steady" in text and "fill" in text
    assert "p99" in text


def test_stream_api_takes_an_iterator(compiled):
    model, out = compiled
    pipe = load_pipeline(out, available=[0, 1])
    frames = (
        {"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype("float32")}
        for i in range(5)
    )
    kept = []

    def source():
        for f in frames:
            kept.append(f["x"])
            yield f

    with pipe.stream(source(), pin=False) as stream:
        outs = list(stream)
    assert len(outs) == 5
    for x, o in zip(kept, outs, strict=True):
        np.testing.assert_allclose(o[0], _ort(model, x), rtol=1e-4, atol=1e-4)
    # a frame of another shape from an iterator stops the stream with the error
    bad = iter([np.zeros((1, 3, 8, 8), "float32"), np.zeros((1, 3, 4, 4), "float32")])
    with pytest.raises(ModelError, match=r"stream frame 1: input 'x' has shape \(1, 3, 4, 4\)"):
        with pipe.stream(bad, pin=False) as stream:
            list(stream)


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("codl-tvm: error: ")
    return err


def test_bad_input_one_line_before_any_frame(compiled, tmp_path, capsys):
    model, out = compiled
    assert main(["run", str(out), "--stream", "0"]) == 2
    assert "--stream must be a positive number of frames" in _error(capsys)
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 9, 9), "float32"))
    assert main(["run", str(out), "--stream", "3", "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert "(1, 3, 9, 9)" in _error(capsys)
    argv = ["compile", str(model), "-o", str(tmp_path / "x"), "--objective", "throughput"]
    assert main([*argv, "--groups", "big:0,little:1-4095"]) == 2
    assert "which this machine does not have" in _error(capsys)
    assert not (tmp_path / "x").exists()
    assert main([*argv, "--groups", "big:0", "--isa", "big=avx9000"]) == 2
    assert "unknown instruction set 'avx9000'" in _error(capsys)
    assert main(["compile", str(model), "-o", str(tmp_path / "y"), "--groups", "big:0"]) == 2
    assert "apply to --objective throughput only" in _error(capsys)
    assert main([*argv, "--groups", "big:0", "--layer-timing", "alone", "--pipe-model", "m"]) == 2
    assert "--pipe-model predicts them instead" in _error(capsys)
    assert main([*argv, "--groups", "big:0", "--stage-rounds", "-1"]) == 2
    assert "--stage-rounds must be >= 0, got -1" in _error(capsys)
    assert main([*argv, "--groups", "big:0", "--stage-rounds", "2", "--pipe-model", "m"]) == 2
    assert "--stage-rounds times the stages here" in _error(capsys)
    latency = ["compile", str(model), "-o", str(tmp_path / "z"), "--stage-rounds", "2"]
    assert main(latency) == 2
    assert "--stage-rounds apply to --objective" in _error(capsys)
    assert not (tmp_path / "z").exists()
    assert main([*argv, "--groups", "big:0", "--mode", "hope"]) == 2
    assert "--mode apply to --objective latency, not throughput" in _error(capsys)
    assert main(["run", str(model), "--stream", "3"]) == 2
    assert "--stream runs a pipeline artifact" in _error(capsys)


def test_manifest_reference_and_mode_like_any_directory(compiled):
    model, out = compiled
    manifest = json.loads((out / "pipeline.json").read_text())
    assert manifest["format"] == "codl-tvm-pipeline" and manifest["version"] == 1
    assert manifest["codl_tvm_version"] and manifest["tvm_version"]
    assert manifest["model"]["sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert [t["name"] for t in manifest["model"]["inputs"]] == ["x"]
    assert manifest["reference"] == {"file": "reference.npz", "seed": 0, "target": "host"}
    assert set(manifest["files"]) == {"reference.npz", *(s["library"] for s in manifest["stages"])}
    # the reference is the unpartitioned model's outputs on the stored inputs
    inputs, (expected,) = load_pipeline(out, available=[0, 1]).reference()
    np.testing.assert_allclose(expected, _ort(model, inputs["x"]), rtol=1e-4, atol=1e-4)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


def test_run_checks_the_reference(compiled, tmp_path, capsys):
    _, out = compiled
    for extra in ([], ["--stream", "3"]):
        assert main(["run", str(out), "--repeat", "1", "--number", "1", *extra]) == 0
        text = capsys.readouterr().out
        assert "max abs difference against the reference" in text and "-> OK" in text
    # a reference the pipeline does not compute: exit status 1, MISMATCH
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    with np.load(bad / "reference.npz") as data:
        arrays = {k: data[k] + (1.0 if k.startswith("output:") else 0.0) for k in data.files}
    np.savez(bad / "reference.npz", **arrays)
    manifest = json.loads((bad / "pipeline.json").read_text())
    manifest["files"]["reference.npz"] = hashlib.sha256(
        (bad / "reference.npz").read_bytes()
    ).hexdigest()
    (bad / "pipeline.json").write_text(json.dumps(manifest))
    assert main(["run", str(bad), "--repeat", "1", "--number", "1"]) == 1
    assert "-> MISMATCH" in capsys.readouterr().out


def test_options_name_their_fields():
    for kwargs, message in (
        ({"groups": " "}, "groups is empty"),
        ({"isa": {"big": "avx9000"}}, "isa: group 'big': unknown instruction set 'avx9000'"),
        ({"stage_rounds": -1}, "stage_rounds must be >= 0, got -1"),
        ({"stage_rounds": 2, "pipe_model": "m.json"}, "stage_rounds times the stages here"),
        ({"verify_frames": 1}, "verify_frames must be 0 .* or >= 2"),
        ({"verify_rounds": 0}, "verify_rounds must be >= 1, got 0"),
        ({"balance": "best"}, "balance must be one of"),
    ):
        with pytest.raises(OptionsError, match=message):
            ThroughputOptions(**{"groups": "big:0", **kwargs})


def test_bad_groups_and_instruction_sets_one_line(tmp_path, capsys):
    argv = ["compile", "-o", str(tmp_path / "x"), "--objective", "throughput"]
    for flags, message in (
        (["--groups", "big:0,,"], "empty item"),
        (["--groups", "big:0", "--isa", "little"], "expected GROUP=ISA, got 'little'"),
        (["--groups", "big:0", "--isa", "small=host"], "instruction sets given for unknown"),
        (["--groups", "big:0", "--isa", "big=avx9000"], "--isa: group 'big': unknown instruction"),
    ):
        assert main([*argv, *flags]) == 2
        assert message in _error(capsys)
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="little is x86-64-v2 on x86-64"
)
def test_little_group_instruction_set_is_said(tmp_path, capsys):
    # said before the model is read (this one does not exist): one line, and how to change it
    argv = ["compile", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "x")]
    assert main([*argv, "--objective", "throughput", "--groups", "little:0"]) == 2
    said = [line for line in capsys.readouterr().out.splitlines() if "'little'" in line]
    assert said == [
        "group 'little' is built for x86-64-v2 (SSE4.2, no AVX), as the little cores of an "
        "emulated big.LITTLE SoC; give it instruction set 'host' to build it for this CPU"
    ]
