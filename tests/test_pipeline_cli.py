"""``codl-tvm compile --objective throughput`` and ``codl-tvm run PIPELINE/ [--stream N]``: the
artifact's outputs against onnxruntime, the stream report, and bad input refused with one line
before any frame runs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import ModelError
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
