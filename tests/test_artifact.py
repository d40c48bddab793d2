"""``codl-tvm compile MODEL -o OUT/`` and ``codl-tvm run OUT/`` (the main job).

Artifacts are built for the local OpenCL device with planner cost models fitted on synthetic
records (``codl_tvm.cost_model.synthetic``) or the shipped default; every run is checked against
the unpartitioned model's outputs on the host CPU.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from codl_tvm.schedules import cpu_config

from codl_tvm.build.targets import get_preset
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.errors import ArtifactError
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model import Partition
from codl_tvm.cost_model.base import CostModelFallbackWarning, ModelFileError, load_model
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.cost_model.features import OpParams, op_features
from codl_tvm.cost_model.measured import MeasuredModel
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import Manifest, load_artifact

pytestmark = pytest.mark.opencl


@pytest.fixture(scope="module")
def balanced_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cm") / "balanced.json"
    synthetic_cost_model(SyntheticDevice()).save(path)
    return path


@pytest.fixture(scope="module")
def cpu_heavy_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cm") / "cpu_heavy.json"
    synthetic_cost_model(SyntheticDevice(cpu_gflops=500.0, gpu_gflops=2.0)).save(path)
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, balanced_model, opencl):
    out = tmp_path_factory.mktemp("art") / "small_cnn"
    # the co-executed build as planned (measuring may keep one processor on this machine's
    # CPU OpenCL device; tests/test_measure.py covers that)
    options = CompileOptions(cost_model=balanced_model, measure=False)
    compile_artifact(bundled_model_path(), out, options)
    return out


def _reference_outputs(out):
    with np.load(out / "reference.npz") as data:
        return {k[7:]: data[k] for k in data.files if k.startswith("output:")}


def test_artifact_contents_and_plan(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["device"] == "coexec"
    assert manifest["vm_devices"] == ["opencl", "cpu"]
    assert manifest["plan"]["mode"] == "codl"
    assert manifest["plan"]["summary"]["n_split_h"] + manifest["plan"]["summary"]["n_split_oc"] > 0
    assert set(manifest["files"]) >= {"model.so", "plan.json", "reference.npz", "placement.json"}
    placement = json.loads((artifact / "placement.json").read_text())
    assert any(len(row["parts"]) == 2 for row in placement)  # something really is split


def test_manifest_reads_back_as_written(artifact):
    """The typed Manifest writes exactly the JSON it read (the on-disk format is the contract),
    and its fields are what the JSON says."""
    text = (artifact / "manifest.json").read_text()
    manifest = Manifest.from_json(text)
    assert manifest.to_json() == text
    assert manifest.device == "coexec" and manifest.plan["mode"] == "codl"
    assert manifest.model.inputs == list(load_onnx(bundled_model_path()).inputs)
    assert dict(manifest) == json.loads(text)
    art = load_artifact(artifact)
    assert art.manifest["plan"] == json.loads(text)["plan"]  # indexable as the JSON mapping


def test_artifact_runs_and_matches_reference(artifact):
    art = load_artifact(artifact)
    inputs, expected = art.reference()
    outs = art([inputs[s.name] for s in art.model.inputs])
    for o, e in zip(outs, expected):
        np.testing.assert_allclose(o, e, rtol=1e-4, atol=1e-5)


def test_cli_run_artifact_checks_and_saves(artifact, tmp_path, capsys):
    saved = tmp_path / "out.npz"
    assert (
        main(["run", str(artifact), "--save-outputs", str(saved), "--number", "1", "--repeat", "1"])
        == 0
    )
    text = capsys.readouterr().out
    assert "-> OK" in text and "device: coexec" in text
    ref = _reference_outputs(artifact)
    with np.load(saved) as got:
        for name, value in ref.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


def test_cli_run_artifact_rejects_compile_time_flags(artifact, capsys):
    assert main(["run", str(artifact), "--ratio", "0.5"]) == 2
    assert "fixed at compile time" in capsys.readouterr().err


def test_artifact_detects_tampering(artifact, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    with open(copy / "model.so", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match=r"model\.so does not match its SHA-256"):
        load_artifact(copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format version 99"):
        load_artifact(copy)


def test_compile_never_overwrites_user_files(tmp_path, balanced_model, opencl):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ArtifactError, match="holds no codl-tvm artifact"):
        compile_artifact(bundled_model_path(), out, CompileOptions(cost_model=balanced_model))
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_compile_refuses_existing_artifact_without_force(artifact, balanced_model, capsys):
    code = main(
        [
            "compile",
            str(bundled_model_path()),
            "-o",
            str(artifact),
            "--cost-model",
            str(balanced_model),
        ]
    )
    assert code == 2
    assert "pass --force" in capsys.readouterr().err


def test_compile_bad_inputs_give_clear_errors(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o")]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["compile", "-o", str(tmp_path / "o2"), "--cost-model", str(bad)]) == 2
    assert "not a codl-tvm cost model" in capsys.readouterr().err
    assert main(["compile", "-o", str(tmp_path / "o3"), "--mode", "fastest"]) == 2
    assert "planner mode 'fastest'" in capsys.readouterr().err


def test_plan_favouring_cpu_builds_cpu_alone(tmp_path, cpu_heavy_model, opencl):
    """Unmeasured, the prediction's fallback stands."""
    out = tmp_path / "cpu"
    options = CompileOptions(cost_model=cpu_heavy_model, measure=False)
    compile_artifact(bundled_model_path(), out, options)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "cpu" and manifest["vm_devices"] == ["cpu"]
    assert "CPU" in manifest["plan"]["fallback"]
    art = load_artifact(out)
    inputs, expected = art.reference()
    outs = art([inputs[s.name] for s in art.model.inputs])
    np.testing.assert_allclose(outs[0], expected[0], rtol=1e-4, atol=1e-5)


def test_given_plan_and_single_device_artifacts(tmp_path, capsys, opencl):
    out = tmp_path / "uniform"
    assert main(["compile", "-o", str(out), "--dim", "OC", "--ratio", "0.25"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["plan"] == {"source": "given"}
    assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out
    gpu = tmp_path / "gpu"
    assert main(["compile", "-o", str(gpu), "--device", "opencl", "--no-reference"]) == 0
    art = load_artifact(gpu)
    assert art.reference() is None and art.manifest["vm_devices"] == ["opencl"]
    ref = load_artifact(out).reference()
    outs = art([ref[0][s.name] for s in art.model.inputs])
    np.testing.assert_allclose(outs[0], ref[1][0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compile_with_winograd(tmp_path, monkeypatch, capsys, opencl):
    """``--winograd``: the 32->32 3x3 conv of the bundled CNN becomes a Winograd conv on both
    processors (H split), and the artifact still matches the unpartitioned direct model."""
    out = tmp_path / "wino"
    dump = tmp_path / "ir"
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(dump))
    args = ["compile", "-o", str(out), "--dim", "H", "--ratio", "0.5", "--winograd"]
    assert main(args) == 0
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    assert json.loads((out / "manifest.json").read_text())["winograd"] is True
    # the co-executed build, then the reference build (direct: checked against below)
    coexec, reference = sorted(dump.glob("*-schedule.py"), key=lambda p: p.stat().st_mtime)
    assert '"codl.algorithm": "winograd"' not in reference.read_text()
    text = coexec.read_text()
    cpu = cpu_config(get_preset("opencl").target("cpu")).name  # this machine's CPU's config
    assert f'"codl.algorithm": "winograd", "codl.config": "{cpu}"' in text
    assert '"codl.algorithm": "winograd", "codl.config": "opencl-generic"' in text
    capsys.readouterr()
    assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out
    # without the flag nothing is Winograd (the default)
    plain = tmp_path / "plain"
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "ir2"))
    assert main(["compile", "-o", str(plain), "--dim", "H", "--ratio", "0.5"]) == 0
    for schedule in (tmp_path / "ir2").glob("*-schedule.py"):
        assert '"codl.algorithm": "winograd"' not in schedule.read_text()
    assert json.loads((plain / "manifest.json").read_text())["winograd"] is False


def _host_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


@pytest.mark.parametrize("flag", [None, "--no-winograd"], ids=["default", "no-winograd"])
def test_cpu_alone_builds_use_winograd_on_avx512(tmp_path, monkeypatch, capsys, flag):
    """A CPU artifact for an AVX-512 preset enables Winograd by default (measured faster on
    whole models there), for convs of at least ``winograd_min_channels`` channels (128 in the
    CPU-alone settings): the bundled model's 16-32-channel 3x3 convs are packed instead, with
    tail-free tiles. ``--no-winograd`` disables it. Both match the direct reference."""
    args = ["compile", "--device", "cpu", "--preset", "emulated-soc"] + ([flag] if flag else [])
    dump = tmp_path / "ir"
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(dump))
    assert main([*args, "-o", str(tmp_path / "dumped"), "--no-reference"]) == 0
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    text = (dump / "03-schedule.py").read_text()
    assert '"codl.algorithm": "winograd"' not in text  # 32 channels < winograd_min_channels
    assert '"codl.algorithm": "packed", "codl.config": "avx512"' in text
    assert '"codl.algorithm": "direct", "codl.config": "avx512"' in text  # the 3->16 stem
    out = tmp_path / "cpu"
    assert main([*args, "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["winograd"] is (flag is None)
    assert manifest["winograd_cpu_alone"] is (flag is None)
    if _host_has_avx512():
        capsys.readouterr()
        assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
        assert "-> OK" in capsys.readouterr().out


# -- the measured (oracle) model ---------------------------------------------------------------


def _records():
    p = OpParams("conv2d", 28, 28, 64, 64, 3, 1, (1, 1, 1, 1))
    recs = []
    for ratio, (cpu_ms, gpu_ms) in {0.3: (0.7, 0.4), 0.5: (0.5, 0.6), 0.7: (0.3, 0.9)}.items():
        part = Partition("H", ratio)
        recs.append(OpRecord(p, part, "cpu", "direct", cpu_ms, 3))
        recs.append(OpRecord(p, part, "gpu", "direct", gpu_ms, 3))
    recs.append(OpRecord(p, Partition("none", 0.0), "cpu", "direct", 1.0, 3))
    recs.append(OpRecord(p, Partition("none", 1.0), "gpu", "direct", 1.2, 3))
    return p, recs


def test_measured_model_looks_up_parts_and_round_trips(tmp_path):
    p, recs = _records()
    model = MeasuredModel().fit(recs)
    feats = op_features(p, "gpu", "direct", Partition("H", 0.5))
    assert model.predict(feats) == pytest.approx(0.6)
    est = model.predict_coexec(p, Partition("H", 0.3), "direct", chained=True)
    assert est.total_ms == pytest.approx(0.7)
    path = tmp_path / "m.json"
    model.save(path)
    again = load_model(path)
    assert again.dumps() == model.dumps()
    assert again.predict(op_features(p, "gpu", "direct", Partition("H", 0.4))) == np.inf
    other = OpParams("conv2d", 14, 14, 64, 64, 3, 1, (1, 1, 1, 1))
    with pytest.warns(CostModelFallbackWarning, match="conv2d"):
        again.predict(op_features(other, "gpu", "direct", Partition("none", 1.0)))
    obj = json.loads(path.read_text())
    obj["model"]["table"] = {"npu|x": 1.0}
    path.write_text(json.dumps(obj))
    with pytest.raises(ModelFileError, match="names no processor"):
        load_model(path)


def test_measured_model_plans_the_measured_best_split(tmp_path):
    """The oracle: planning with measured latencies picks the measured best split."""
    import onnx
    from onnx import TensorProto, helper

    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import plan_model

    w = helper.make_tensor(
        "w", TensorProto.FLOAT, (64, 64, 3, 3), np.zeros(64 * 64 * 9, np.float32).tolist()
    )
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])],
        "one_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64, 28, 28))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 64, 28, 28))],
        [w],
    )
    path = tmp_path / "one_conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    mod = load_onnx(path).mod
    _, recs = _records()
    plan, report = plan_model(mod, MeasuredModel().fit(recs), mode="codl_no_chain")
    [entry] = plan.entries()
    assert (entry.dim.value, entry.ratio) == ("H", 0.5)
    assert report.summary.predicted_ms == pytest.approx(0.6)
    json.loads(report.to_json())


@pytest.mark.slow
@pytest.mark.parametrize("which", ["balanced", "cpu_heavy"])
def test_compile_verify_keeps_the_fastest_build(
    tmp_path, balanced_model, cpu_heavy_model, opencl, which
):
    """``--verify``: the co-executed build is timed against each processor alone and the
    fastest is kept, also where the prediction alone would have built one processor
    (cpu_heavy); whichever is kept, the artifact's outputs match the reference."""
    model = balanced_model if which == "balanced" else cpu_heavy_model
    out = tmp_path / "verified"
    args = ["compile", str(bundled_model_path()), "--cost-model", str(model)]
    args.append("--no-verify-calibrate")  # calibrated re-plans: test_compile_verify_calibrates
    assert main([*args, "--verify", "2", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert ("predicted_fallback" in manifest["plan"]) == (which == "cpu_heavy")
    v = manifest["verify"]
    assert v["rounds"] == 2 and set(v["median_ms"]) == {"coexec", "cpu", "opencl"}
    assert all(len(s) == 2 and min(s) > 0 for s in v["samples_ms"].values())
    assert v["chosen"] == min(v["median_ms"], key=v["median_ms"].get)
    assert manifest["device"] == v["chosen"]
    assert "verify_candidates" not in manifest["plan"]
    assert manifest["vm_devices"] == (
        ["opencl", "cpu"] if v["chosen"] == "coexec" else [v["chosen"]]
    )
    if v["chosen"] != "coexec":
        assert "--verify" in manifest["plan"]["fallback"]
    art = load_artifact(out)
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_compile_verify_modes_times_more_plans(tmp_path, balanced_model, opencl):
    """``--verify-modes``: the other planner modes' plans (where they differ) are built and
    timed too; the fastest build is kept, and when it is another mode's plan the artifact's
    plan files are that plan's. Whichever wins, the outputs match the reference."""
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import plan_model

    out = tmp_path / "modes"
    args = ["compile", str(bundled_model_path()), "--cost-model", str(balanced_model)]
    args.append("--no-verify-calibrate")
    modes = "codl_no_chain,h_only,oc_only,cpu_only"
    assert main([*args, "--verify", "1", "--verify-modes", modes, "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    cands = manifest["plan"]["verify_candidates"]
    assert cands[0] == "codl" and "cpu_only" not in cands  # one processor alone: the cpu build
    assert len(cands) >= 2, cands  # the bundled CNN's H-only and OC-only plans differ from codl's
    v = manifest["verify"]
    assert set(v["median_ms"]) == {"coexec", "cpu", "opencl", *(f"coexec:{m}" for m in cands[1:])}
    chosen = v["chosen"]
    assert chosen == min(v["median_ms"], key=v["median_ms"].get)
    model = load_onnx(bundled_model_path())
    if chosen.startswith("coexec"):
        mode = chosen.split(":", 1)[1] if ":" in chosen else "codl"
        assert manifest["device"] == "coexec" and manifest["plan"]["mode"] == mode
        want, _ = plan_model(model.mod, load_model(balanced_model), mode=mode)
        assert (out / "plan.json").read_text().strip() == want.to_json().strip()
        assert json.loads((out / "plan_report.json").read_text())["mode"] == mode
    else:
        assert manifest["device"] == chosen and "--verify" in manifest["plan"]["fallback"]
    art = load_artifact(out)
    inputs, want_out = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want_out):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_calibrated_plans_follow_the_measured_single_processor_latencies(balanced_model):
    """``--verify``'s calibration: each processor's predictions scaled by measured / predicted
    of the model on it alone; a CPU measured 3x slower than predicted re-plans towards the GPU
    (a candidate unless a plan timed already is the same); factors within 1.1x of each other
    re-plan nothing."""
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import plan_model
    from codl_tvm.planner.policy import calibrated_plans, planning_context

    model = load_onnx(bundled_model_path())
    cm = load_model(balanced_model)
    plan, report = plan_model(model.mod, cm, mode="codl")
    s = report.summary
    with planning_context("opencl", balanced_model) as config:
        ms = {"cpu": 3 * s.cpu_only_ms, "opencl": s.gpu_only_ms}
        seen = {plan.to_json()}
        found, cal = calibrated_plans(model.mod, balanced_model, "codl", report, ms, seen, config)
    assert cal["cpu_scale"] == pytest.approx(3.0) and cal["gpu_scale"] == pytest.approx(1.0)
    assert set(found) == {"coexec:codl:calibrated"} and cal["candidates"] == ["codl"]
    cand, rep = found["coexec:codl:calibrated"]
    share = sum(p.ratio for p in cand.ops) / len(cand.ops)
    assert share > sum(p.ratio for p in plan.ops) / len(plan.ops)
    assert any("calibrated: CPU x3" in n for n in rep.notes)
    assert cand.to_json() in seen  # later candidates are compared with it
    with planning_context("opencl", balanced_model) as config:
        ms = {"cpu": 2 * s.cpu_only_ms, "opencl": 2.05 * s.gpu_only_ms}
        found, cal = calibrated_plans(
            model.mod, balanced_model, "codl", report, ms, {plan.to_json()}, config
        )
    assert not found and cal["candidates"] == []


def test_calibration_multiplies_the_configured_processor_scale(balanced_model):
    """A plan made with ``processor_scale`` (another core split than the profiled one) predicts
    with those factors, so ``--verify``'s measured / predicted multiplies them: CPU x2 set and a
    CPU measured 3x slower than that prediction re-plans with CPU x6, not x3."""
    import dataclasses

    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import plan_model
    from codl_tvm.planner.policy import calibrated_plans, planning_context

    model = load_onnx(bundled_model_path())
    cm = load_model(balanced_model)
    with planning_context("opencl", balanced_model) as config:
        config = dataclasses.replace(config, processor_scale=(2.0, 1.0))
        _, report = plan_model(model.mod, cm, mode="codl", config=config)
        s = report.summary
        ms = {"cpu": 3 * s.cpu_only_ms, "opencl": s.gpu_only_ms}
        found, cal = calibrated_plans(model.mod, balanced_model, "codl", report, ms, set(), config)
    assert cal["cpu_scale"] == pytest.approx(3.0)
    _, rep = found["coexec:codl:calibrated"]
    assert any("calibrated: CPU x6" in n for n in rep.notes), rep.notes


def test_compile_rejects_bad_processor_scale(tmp_path):
    for bad in ((0.0, 1.0), (1.0, float("nan")), (1.0,)):
        with pytest.raises(ArtifactError, match="processor_scale"):
            compile_artifact(
                bundled_model_path(), tmp_path / "out", CompileOptions(processor_scale=bad)
            )
    assert not (tmp_path / "out").exists()


def test_compile_verify_calibrates(tmp_path, cpu_heavy_model, opencl):
    """End to end: a cost model far off on this machine (CPU 250x the GPU) gets calibration
    factors from the verify timing; any calibrated plan was built and timed again with the
    others, and whichever build is kept matches the reference."""
    out = tmp_path / "calibrated"
    args = ["compile", str(bundled_model_path()), "--cost-model", str(cpu_heavy_model)]
    assert main([*args, "--verify", "1", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    cal = manifest["plan"]["calibration"]
    # this machine's CPU is not 250x its OpenCL device: the CPU was predicted far too fast
    assert cal["cpu_scale"] > 1.1 * cal["gpu_scale"]
    v = manifest["verify"]
    names = {f"coexec:{m}:calibrated" for m in cal["candidates"]}
    assert set(v["median_ms"]) == {"coexec", "cpu", "opencl", *names}
    assert ("first_timing" in v) == bool(names)
    assert v["chosen"] == min(v["median_ms"], key=v["median_ms"].get)
    if v["chosen"] in names:
        assert manifest["plan"]["calibrated"] is True and manifest["device"] == "coexec"
    art = load_artifact(out)
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_build_cache_reuses_only_matching_libraries(tmp_path, balanced_model, opencl, caplog):
    """``build_cache``: a later compile of the same model, plan and targets copies the library
    instead of building it (``--verify`` then only builds what no earlier compile built); a
    different plan is built anew; artifacts from the cache still match the reference."""
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx

    cache = tmp_path / "cache"
    model = bundled_model_path()

    def compile_logged(name, **kw):
        caplog.clear()
        kw.setdefault("cost_model", balanced_model)
        with caplog.at_level(logging.INFO, logger="codl_tvm"):
            compile_artifact(model, tmp_path / name, CompileOptions(build_cache=cache, **kw))
        return caplog.text

    first = compile_logged("coexec", reference=False, measure=False)
    assert "reusing" not in first and len(list(cache.glob("*.so"))) == 1
    compile_logged("cpu", device="cpu", reference=False)
    assert len(list(cache.glob("*.so"))) == 2
    verified = compile_logged("verified", verify=1, verify_calibrate=False)
    assert "reusing the coexec library" in verified and "reusing the cpu library" in verified
    assert "building for the GPU alone" in verified and "for co-execution" not in verified
    assert len(list(cache.glob("*.so"))) == 3
    # The same plan as a given plan hits the cache; another ratio is another library.
    same = PartitionPlan.load(tmp_path / "coexec" / "plan.json")
    assert "reusing the coexec library" in compile_logged("given", plan=same, reference=False)
    other = uniform_plan(load_onnx(model).mod, "OC", 0.3)
    assert other.to_json() != same.to_json()
    assert "reusing" not in compile_logged("other", plan=other, reference=False)
    assert len(list(cache.glob("*.so"))) == 4
    art = load_artifact(tmp_path / "verified")
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_compile_verify_bad_values(tmp_path, balanced_model, capsys):
    with pytest.raises(ArtifactError, match="'h_onyl' not among the planner modes"):
        compile_artifact(
            bundled_model_path(), tmp_path / "m", CompileOptions(verify=1, verify_modes=["h_onyl"])
        )
    with pytest.raises(ArtifactError, match="verify_modes needs verify > 0"):
        compile_artifact(
            bundled_model_path(), tmp_path / "m", CompileOptions(verify_modes=["h_only"])
        )
    with pytest.raises(ArtifactError, match="cannot be combined with a given plan"):
        compile_artifact(
            bundled_model_path(),
            tmp_path / "m",
            CompileOptions(plan=PartitionPlan(ops=()), verify=1, verify_modes=["h_only"]),
        )
    assert not (tmp_path / "m").exists()
    with pytest.raises(ArtifactError, match="verify must be a number of rounds >= 0, got -1"):
        compile_artifact(bundled_model_path(), tmp_path / "a", CompileOptions(verify=-1))
    with pytest.raises(ArtifactError, match="cross-compiles for aarch64"):
        compile_artifact(
            bundled_model_path(),
            tmp_path / "b",
            CompileOptions(preset="android-arm64", cost_model=balanced_model, verify=2),
        )
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_planning_context_matches_what_compile_plans_with():
    """Scripts that re-plan measured builds (`model_level_check.py`) plan as `compile` does:
    the preset's schedule configs, with the algorithms the cost model covers switched on."""
    from codl_tvm.schedules import cpu_config

    from codl_tvm.build.targets import get_preset
    from codl_tvm.objectives.latency import default_cost_model_for
    from codl_tvm.planner.policy import planning_context

    cpu_target = get_preset("emulated-soc").target("cpu")
    assert not cpu_config(cpu_target).conv_packed
    with planning_context("emulated-soc", chain_min_gain=0.0) as config:
        # the shipped emulated-soc model has packed and Winograd CPU data
        assert config.cpu.conv_packed and config.cpu.winograd
        assert config.gpu is not None and config.chain_min_gain == 0.0
    assert not cpu_config(cpu_target).conv_packed  # switched off again
    with planning_context("emulated-soc", default_cost_model_for("device-h100")) as config:
        assert not config.cpu.conv_packed and not config.cpu.winograd  # direct data only


def test_fallback_margin_is_the_best_on_the_measured_plans(tmp_path):
    """`MIN_PREDICTED_SPEEDUP` is a margin that decides best (most right choices, least summed
    latency) on the co-executed plans measured on the emulated SoC (committed model-level
    checks); the aggregate is recomputed from those files by the script."""
    import subprocess
    import sys
    from pathlib import Path

    from codl_tvm.planner.policy import MIN_PREDICTED_SPEEDUP

    root = Path(__file__).resolve().parent.parent
    files = [
        "benchmarks/model_level/soc_k8.json",
        *(f"benchmarks/model_level/soc_k12_run{i}.json" for i in range(1, 7)),
    ]
    out = tmp_path / "margins.json"
    cmd = [sys.executable, "scripts/model_level_check.py", "--aggregate", ",".join(files)]
    subprocess.run([*cmd, "--out", str(out)], check=True, cwd=root, capture_output=True)
    table = json.loads(out.read_text())["results"]["margins"]
    assert len(json.loads(out.read_text())["results"]["plans"]) == 28
    best_right = max(t["right"] for t in table.values())
    best_latency = min(t["relative_latency"] for t in table.values())
    chosen = table[f"{MIN_PREDICTED_SPEEDUP:g}"]
    assert chosen["right"] == best_right and chosen["relative_latency"] == best_latency
    assert table["1.05"]["right"] < best_right  # the old margin was not
