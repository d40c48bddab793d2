"""``codl-tvm compile --objective throughput --verify N``: the candidate pipelines (planned on the
layers timed under load and alone, the whole model as one stage) built, streamed here, the
fastest kept with every candidate recorded; its outputs against onnxruntime; the user's files
never lost; bad input refused with one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from codl_tvm.passes.stages import layer_starts

from codl_tvm.cli import main
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.throughput import one_stage_plan
from codl_tvm.planner.stages.search import HandOff, LatencyTable, ProcessorGroup
from codl_tvm.runtime.staged_artifact import load_pipeline
from tests.test_transform_stages import _residual_cnn

GROUPS = ["--groups", "big:0,little:1", "--isa", "little=x86-64-v2"]


def _compile(model, out, *extra) -> int:
    argv = ["compile", str(model), "-o", str(out), "--objective", "throughput", *GROUPS]
    return main([*argv, *extra])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "residual.onnx"
    onnx.save(_residual_cnn(), str(path))
    return path


@pytest.fixture(scope="module")
def verified(tmp_path_factory, model_path):
    model = model_path
    out = tmp_path_factory.mktemp("verify") / "art"
    assert _compile(model, out, "--verify", "3") == 0
    return model, out


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("codl-tvm: error: ")
    return err


def test_verify_keeps_a_candidate_records_all_and_equals_onnxruntime(verified):
    model, out = verified
    manifest = json.loads((out / "pipeline.json").read_text())
    record = manifest["verify"]
    assert record["frames"] == 3 and record["rounds"] == 3
    candidates = record["candidates"]
    # every source named once, identical plans built once
    names = [n for c in candidates for n in c["name"].split("+")]
    assert sorted(names) == ["alone", "one-stage", "under-load"]
    assert len({c["describe"] for c in candidates}) == len(candidates)
    for c in candidates:
        assert c["predicted_fps"] > 0 and c["measured_fps"] > 0
        assert len(c["samples_fps"]) == 3
    kept = next(c for c in candidates if c["name"] == record["kept"])
    assert kept["measured_fps"] == max(c["measured_fps"] for c in candidates)
    assert manifest["plan"]["describe"] == kept["describe"]
    # the kept plan's table is the one it was planned on
    if kept["name"].split("+")[0] == "under-load":
        assert manifest["latencies"]["source"] == "measured on this machine under load"
    else:
        assert manifest["latencies"]["source"] == "measured on this machine"
    # the other candidates are gone: nothing beside OUT
    assert [p.name for p in out.parent.iterdir()] == ["art"]
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    pipe = load_pipeline(out, available=[0, 1])
    got = pipe({"x": x})
    np.testing.assert_allclose(got[0], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    # the kept candidate carries the reference, computed once for all of them
    assert manifest["reference"]["file"] == "reference.npz" and "reference.npz" in manifest["files"]
    inputs, (expected,) = pipe.reference()
    np.testing.assert_allclose(expected, sess.run(None, inputs)[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pipe(inputs)[0], expected, rtol=1e-4, atol=1e-4)


def test_existing_output_untouched_and_bad_verify_refused(model_path, tmp_path, capsys):
    model = model_path
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("the user's file")
    assert _compile(model, out, "--verify", "3") == 2
    assert "exists (pass --force to replace it)" in _error(capsys)
    assert _compile(model, out, "--verify", "3", "--force") == 2
    assert "is not a pipeline artifact: not replacing it" in _error(capsys)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "the user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    for n in ("0", "-2", "1"):
        assert _compile(model, tmp_path / "new", "--verify", n) == 2
        assert f"N must be >= 2, got {n}" in _error(capsys)
    assert _compile(model, tmp_path / "new", "--verify", "3", "--layer-timing", "alone") == 2
    assert "drop --layer-timing" in _error(capsys)
    assert not (tmp_path / "new").exists()


def test_one_stage_plan_takes_the_fastest_group():
    model = load_onnx(_residual_cnn())
    n = len(layer_starts(model.mod["main"]))
    # groups of cores this machine may lack: the plan is not checked against the machine
    groups = [ProcessorGroup("big", "cpu", (0, 1)), ProcessorGroup("little", "cpu", (2,))]
    table = LatencyTable({("big", 1): [2.0] * n, ("big", 2): [1.5] * n, ("little", 1): [1.0] * n})
    plan = one_stage_plan(model, table, groups, HandOff(0.5))
    (stage,) = plan.stages
    assert (stage.group, stage.core_count, stage.cores) == ("little", 1, (2,))
    assert (stage.first_layer, stage.stop_layer) == (0, n)
    assert stage.latency_ms == pytest.approx(n * 1.0 + 0.5)
    assert plan.min_cycle_ms == pytest.approx(1.0)


@pytest.mark.slow
def test_verify_force_replaces_a_pipeline_artifact(model_path, tmp_path, capsys):
    model = model_path
    out = tmp_path / "art"
    assert _compile(model, out) == 0
    assert "verify" not in json.loads((out / "pipeline.json").read_text())
    capsys.readouterr()
    assert _compile(model, out, "--verify", "2", "--force") == 0
    text = capsys.readouterr().out
    assert text.count("verify: ") == 1 + len(
        json.loads((out / "pipeline.json").read_text())["verify"]["candidates"]
    )
    assert "verify: keeping " in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
