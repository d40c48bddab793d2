"""Artifacts on machines and inputs nobody tuned for: the host CPU's real instruction set, a
CPU that cannot run an artifact, and failed compiles that keep the user's files.

Every artifact here is a real build of small ONNX models (the bundled CNN, or models made with
``onnx.helper``) for this machine's CPU; outputs are checked against the unpartitioned model's
reference outputs.
"""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.schedules import cpu_config
from onnx import TensorProto, helper

from codl_tvm.build.runner import default_target
from codl_tvm.build.targets import (
    _ISA_FEATURE,
    _cpu_features,
    cpu_record,
    get_preset,
    host_cpu,
    host_cpu_spec,
    missing_cpu_features,
)
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.errors import ArtifactError
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import Manifest, load_artifact
from codl_tvm.runtime.cpu_features import cpuinfo_features


def _quiet(_line: str) -> None:
    pass


def _outputs_match_reference(path) -> None:
    art = load_artifact(path)
    inputs, expected = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def cpu_artifact(tmp_path_factory):
    """The bundled CNN built for this machine's CPU (preset ``host``)."""
    out = tmp_path_factory.mktemp("art") / "cnn"
    compile_artifact(bundled_model_path(), out, CompileOptions(device="cpu", preset="host"))
    return out


def test_cpu_manifest_reads_back_as_written(cpu_artifact):
    """A build for the CPU alone writes no co-execution fields; its manifest reads back
    unchanged."""
    text = (cpu_artifact / "manifest.json").read_text()
    manifest = Manifest.from_json(text)
    assert manifest.to_json() == text
    raw = json.loads(text)
    assert "kernel_splits" not in raw and "program_binaries" not in raw and "plan" not in raw
    assert manifest.targets == raw["targets"] and list(raw["targets"]) == ["cpu"]


# -- the host CPU -----------------------------------------------------------------------------


def _isa(features) -> set[str]:
    import platform

    pattern = _ISA_FEATURE.get(platform.machine(), re.compile(""))
    return {f for f in features if pattern.match(f)}


@pytest.mark.parametrize("preset", ["host", "opencl", "pocl"])
def test_local_presets_compile_for_this_cpu(preset):
    """The presets for this machine name its CPU (TVM's ``llvm_get_system_cpu``) and enable
    exactly the instruction-set features it has, on the CPU target and as the GPU's host;
    without ``mcpu`` LLVM would emit baseline x86-64 code."""
    system_cpu = str(tvm.get_global_func("target.llvm_get_system_cpu")())
    p = get_preset(preset)
    targets = [p.target("cpu")] + ([p.target("opencl").host] if p.has_gpu else [])
    for target in targets:
        if system_cpu != "generic":
            assert str(target.attrs["mcpu"]) == system_cpu
        spec = {k: v for k, v in target.export().items() if k in ("kind", "mcpu", "mattr")}
        enabled = _cpu_features(spec)
        assert _isa(enabled) == _isa(host_cpu().features)
        assert not enabled & host_cpu().absent
    # the schedules follow the real vector width (an AVX-512 CPU gets the AVX-512 configs)
    config = cpu_config(p.target("cpu")).name
    assert config == (
        "avx512"
        if "avx512f" in host_cpu().features
        else "avx2"
        if "avx2" in host_cpu().features
        else config
    )
    # `run --device cpu` and the CPU side of local co-execution build for the same CPU
    assert default_target("cpu").export() == p.target("cpu").export()
    # a fixed CPU model stays as the preset names it
    assert str(get_preset("device-h100").target("cpu").attrs["mcpu"]) == "skylake-avx512"


def test_unknown_cpu_name_gets_its_features(monkeypatch):
    """A CPU LLVM cannot name ("generic": new models, some hypervisors) is compiled for the
    features it has, given one by one, instead of baseline x86-64."""
    from codl_tvm.build import targets

    real = host_cpu()
    monkeypatch.setattr(targets, "host_cpu", lambda: targets.HostCPU("generic", *_split(real)))
    targets._host_cpu_spec.cache_clear()
    try:
        spec = host_cpu_spec()
        assert "mcpu" not in spec
        assert _isa(_cpu_features(spec)) == _isa(real.features)
        assert cpu_record(tvm.target.Target(spec))["name"] == "generic"
    finally:
        targets._host_cpu_spec.cache_clear()


def _split(cpu):
    return cpu.features, cpu.absent


def test_cpuinfo_agrees_with_llvm():
    """Runtime-only TVM (a device) has no LLVM: the check reads /proc/cpuinfo instead, and must
    find the same features LLVM finds wherever the file can tell."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    present, known = cpuinfo_features(text)
    llvm = host_cpu().features
    required = cpu_record(get_preset("host").target("cpu"))["features"]
    disagree = [f for f in required if f in known and (f in present) != (f in llvm)]
    assert not disagree


def test_manifest_records_the_cpu(cpu_artifact):
    manifest = json.loads((cpu_artifact / "manifest.json").read_text())
    record = manifest["cpu"]
    assert record == cpu_record(get_preset("host").target("cpu"))
    assert record["name"] == host_cpu().name
    assert set(record["features"]) <= host_cpu().features
    assert manifest["targets"]["cpu"] == str(get_preset("host").target("cpu"))
    assert missing_cpu_features(record) == (None, [])


def _edited_copy(src, dst, **cpu):
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["cpu"].update(cpu)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dst


def test_artifact_for_a_cpu_this_machine_is_not_is_refused(cpu_artifact, tmp_path, capsys):
    """A manifest that needs a feature this CPU lacks is refused at load, with the feature
    named, and ``codl-tvm run`` prints one line and exits 2 instead of an illegal instruction."""
    lacking = sorted(_isa(host_cpu().absent))
    if not lacking:
        pytest.skip("this CPU has every instruction-set feature LLVM knows")
    feature = lacking[0]
    record = json.loads((cpu_artifact / "manifest.json").read_text())["cpu"]
    bad = _edited_copy(cpu_artifact, tmp_path / "bad", features=[*record["features"], feature])
    with pytest.raises(ArtifactError, match=rf"lacks \({re.escape(feature)}\)"):
        load_artifact(bad)
    load_artifact(bad, check_cpu=False)  # its files can still be read
    capsys.readouterr()
    assert main(["run", str(bad), "--number", "1", "--repeat", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("codl-tvm: error: ")
    assert feature in lines[0] and "Traceback" not in captured.err
    # another architecture is refused by name
    other = _edited_copy(cpu_artifact, tmp_path / "arm", arch="riscv64")
    with pytest.raises(ArtifactError, match="built for riscv64 CPUs"):
        load_artifact(other)


def test_a_different_but_compatible_cpu_is_fine(cpu_artifact, tmp_path):
    """Names do not decide: an artifact made for another CPU model whose features this CPU has
    loads, runs and matches its reference."""
    older = cpu_record(tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v2"}))
    assert older["name"] != host_cpu().name
    copy = _edited_copy(cpu_artifact, tmp_path / "v2", **older)
    _outputs_match_reference(copy)


# -- failed compiles keep the user's files ----------------------------------------------------


def _model(op: str, shape, domain: str = "") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], domain=domain)], "g", [x], [y])
    return helper.make_model(graph, opset_imports=opsets)


@pytest.fixture
def bad_inputs(tmp_path):
    """``name -> (model file, compile_artifact keywords, what the error names)`` for compiles
    that fail at different stages: reading the model, importing it, planning, linking."""
    tmp_path = tmp_path / "inputs"
    tmp_path.mkdir()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(bundled_model_path().read_bytes()[:600])
    unsupported = tmp_path / "unsupported.onnx"
    onnx.save(_model("Frobnicate", (1, 3, 8, 8), "com.example"), unsupported)
    dynamic = tmp_path / "dynamic.onnx"
    onnx.save(_model("Relu", ("N", 3, 8, 8)), dynamic)
    bad_cost_model = tmp_path / "cost.json"
    bad_cost_model.write_text("{}")
    cases = {
        "truncated": (truncated, {}, "truncated.onnx"),
        "unsupported op": (unsupported, {}, "Frobnicate"),
        "dynamic batch": (dynamic, {}, "dynamic dimension 'N'"),
        "planning": (bundled_model_path(), {"cost_model": bad_cost_model}, "cost model"),
    }
    if shutil.which("clang") is None or shutil.which("ld.lld") is None:
        # fails after the whole TVM build, when linking for the phone
        cases["link"] = (bundled_model_path(), {"preset": "android-arm64"}, "clang")
    return cases


_CASES = ["truncated", "unsupported op", "dynamic batch", "planning", "link"]


def _skip_missing(bad_inputs, case):
    if case not in bad_inputs:
        pytest.skip("clang and lld are installed: linking for the phone succeeds")


@pytest.mark.parametrize("case", _CASES)
def test_failed_compile_leaves_nothing(bad_inputs, case, tmp_path):
    _skip_missing(bad_inputs, case)
    model, kw, named = bad_inputs[case]
    kw = {"device": "cpu", **kw} if case != "planning" else kw
    out = tmp_path / "new" / "deeper" / "art"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(Exception, match=re.escape(named)) as info:
        compile_artifact(model, out, CompileOptions(**kw))
    assert "CodlError" in [c.__name__ for c in type(info.value).__mro__]
    assert not (tmp_path / "new").exists()  # nor the parents it created
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # an empty directory of the user's stays, empty
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(Exception, match=re.escape(named)):
        compile_artifact(model, mine, CompileOptions(**kw))
    assert mine.is_dir() and not any(mine.iterdir())


@pytest.mark.parametrize("case", _CASES)
def test_failed_force_compile_keeps_the_old_artifact(bad_inputs, case, cpu_artifact, tmp_path):
    _skip_missing(bad_inputs, case)
    model, kw, named = bad_inputs[case]
    kw = {"device": "cpu", **kw} if case != "planning" else kw
    out = tmp_path / "art"
    shutil.copytree(cpu_artifact, out)
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(Exception, match=re.escape(named)):
        compile_artifact(model, out, CompileOptions(force=True, **kw))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "inputs"]  # no staging left
    _outputs_match_reference(out)


def test_cli_force_compile_failure_is_one_line_and_keeps_the_artifact(
    bad_inputs, cpu_artifact, tmp_path, capsys
):
    out = tmp_path / "art"
    shutil.copytree(cpu_artifact, out)
    model = bad_inputs["truncated"][0]
    code = main(["compile", str(model), "-o", str(out), "--force", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "truncated.onnx" in err
    _outputs_match_reference(out)
    capsys.readouterr()
    assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out


def test_force_compile_replaces_the_artifact(cpu_artifact, tmp_path):
    """A --force compile that succeeds swaps the new artifact in whole (no file of the old one
    left, no staging directory beside it); without --force the old one is refused."""
    out = tmp_path / "art"
    shutil.copytree(cpu_artifact, out)
    with pytest.raises(ArtifactError, match="pass --force"):
        compile_artifact(bundled_model_path(), out, CompileOptions(device="cpu", preset="host"))
    compile_artifact(
        bundled_model_path(),
        out,
        CompileOptions(device="cpu", preset="host", reference=False, force=True),
    )
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.so"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]
    assert load_artifact(out).reference() is None
    # through a symbolic link: the directory it names is replaced, the link stays
    link = tmp_path / "link"
    link.symlink_to(out)
    compile_artifact(
        bundled_model_path(), link, CompileOptions(device="cpu", preset="host", force=True)
    )
    assert link.is_symlink() and load_artifact(out).reference() is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "link"]


# -- small: the manifest's model path and the log's wording ----------------------------------


def test_manifest_model_path_is_absolute_and_log_names_the_processor(tmp_path, monkeypatch, caplog):
    """The manifest is read from other directories (``refine`` finds the model through it):
    a relative model path is stored resolved. The log names the processor, then the preset."""
    shutil.copyfile(bundled_model_path(), tmp_path / "cnn.onnx")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="codl_tvm"):
        compile_artifact("cnn.onnx", "out", CompileOptions(device="cpu", preset="host"))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["model"]["file"] == str((tmp_path / "cnn.onnx").resolve())
    assert "building for the CPU alone (preset host)" in caplog.messages
    monkeypatch.chdir(tmp_path.parent)
    assert load_artifact(tmp_path / "out").model.path == str(tmp_path / "cnn.onnx")
