"""``codl-tvm profile --data-type``: the GPU data type of this machine's OpenCL device chosen by
measuring buffers against images on common operators (:mod:`codl_tvm.profiling.data_type`),
recorded in a copy of a cost model, and followed by ``compile`` on the device it was measured
on (:func:`codl_tvm.objectives.gpu_data.prepare_gpu_data`). Structure and numerics only:
nothing here asserts which data type is faster."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import ModelFileError, ProfileError
from codl_tvm.cost_model.defaults import shipped_model_path
from codl_tvm.cost_model.fitted_device import local_device
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions, OptionsError
from codl_tvm.profiling import data_type
from codl_tvm.profiling.data_type import (
    IMAGE_THRESHOLD,
    META_KEY,
    OPERATORS,
    DataTypeRecord,
    OperatorTiming,
    choose_data_type,
    write_record,
    write_with_record,
)
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.images import image_caps

REPO = Path(__file__).resolve().parent.parent
SMALL_CNN = REPO / "codl_tvm" / "data" / "codl_small_cnn.onnx"
OTHER_DEVICE = {"gpu": "Mali-G710", "platform": "ARM Platform (OpenCL 3.0)", "compute_units": 10}


def _timings(*pairs: tuple[float, float | None]) -> tuple[OperatorTiming, ...]:
    return tuple(OperatorTiming(f"op{i}", "", b, im) for i, (b, im) in enumerate(pairs))


# --- the rule -----------------------------------------------------------------------------------


def test_choice_rule_takes_images_only_when_clearly_faster():
    data_type, ratio, why = choose_data_type(_timings((2.0, 1.0), (1.0, 0.8)))
    assert data_type == "image" and ratio == pytest.approx(math.sqrt(0.5 * 0.8))
    assert "below 0.95" in why
    # one operator much faster on images, another much slower: the geometric mean decides
    assert choose_data_type(_timings((1.0, 0.25), (1.0, 4.0)))[:2] == ("buffer", 1.0)
    # within the noise of a tie: buffers
    assert choose_data_type(_timings((1.0, 0.96), (1.0, 0.97)))[0] == "buffer"
    assert choose_data_type(_timings((1.0, IMAGE_THRESHOLD)))[0] == "buffer"
    # an operator whose image build was dropped does not count
    assert choose_data_type(_timings((1.0, 0.5), (1.0, None)))[:2] == ("image", 0.5)
    assert choose_data_type(_timings((1.0, None))) == (
        "buffer",
        None,
        "no operator's image build could be timed: buffers",
    )
    assert choose_data_type(_timings((1.0, 0.9)), threshold=0.8)[0] == "buffer"


def test_record_round_trips_and_rejects_what_it_is_not():
    record = DataTypeRecord("image", "why", OTHER_DEVICE, 0.5, 0.95, _timings((1.0, 0.5)), 3)
    again = DataTypeRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record
    assert record.to_json()["operators"][0]["ratio"] == 0.5
    assert record.to_json()["device_description"] == "Mali-G710 (ARM Platform, 10 compute units)"
    for bad in ({"version": 1, "data_type": "texture", "device": {}}, {"version": 9}, []):
        with pytest.raises(ModelFileError, match=r"m\.json: not a GPU data-type record"):
            DataTypeRecord.from_json(bad, "m.json")


def test_operators_are_the_common_layers():
    kinds = {op.kind for op in OPERATORS}
    assert kinds == {"conv", "depthwise", "conv_pool"}
    assert {op.kernel for op in OPERATORS if op.kind == "conv"} == {1, 3}
    for op in OPERATORS:  # each builds a model of its declared shapes
        ret = load_onnx(op.onnx_model()).mod["main"].body.body.ty
        assert tuple(int(d) for d in ret.shape) == op.output_shape, op.name
    with pytest.raises(ProfileError, match="must be among conv3x3, "):
        data_type.operators_named(["conv7x7"])


# --- measuring on this machine's OpenCL device ------------------------------------------------


@pytest.mark.opencl
def test_profile_writes_a_cost_model_copy_with_the_record(opencl, tmp_path, capsys):
    original = tmp_path / "model.json"
    original.write_bytes(shipped_model_path("emulated-soc").read_bytes())
    before = original.read_bytes()
    out = tmp_path / "model-dt.json"
    argv = ["profile", "--data-type", "--data-type-ops", "conv3x3_s2,conv3x3_pool"]
    argv += ["--repeats", "2", "--cost-model", str(original), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    assert f"wrote {out}" in capsys.readouterr().out
    assert original.read_bytes() == before  # the user's file is never written

    copy = json.loads(out.read_text())
    record = DataTypeRecord.from_json(copy["meta"].pop(META_KEY))
    assert copy == json.loads(before)  # nothing else changed
    assert [t.name for t in record.operators] == ["conv3x3_s2", "conv3x3_pool"]
    for t in record.operators:  # both data types timed for each operator
        assert t.buffer_ms > 0 and t.image_ms is not None and t.image_ms > 0, t
        assert t.dropped is None
    assert record.rounds == 2
    assert (record.data_type, record.ratio) == choose_data_type(record.operators)[:2]
    assert (record.data_type == "image") == (record.ratio < IMAGE_THRESHOLD)
    here = {k: v for k, v in local_device().items() if k != "cpu_threads"}
    assert record.device == here

    # the same --out again: refused in one line, nothing touched
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists; give a new file" in err
    assert original.read_bytes() == before

    standalone = write_record(record, tmp_path / "record.json")
    assert DataTypeRecord.from_json(json.loads(standalone.read_text())) == record


def test_a_device_without_images_records_buffers_without_building(tmp_path, monkeypatch):
    pytest.importorskip("onnx")
    if local_device() is None:
        pytest.skip("no OpenCL device")
    no_images = dataclasses.replace(image_caps(), image_support=False)
    monkeypatch.setattr(data_type, "image_caps", lambda: no_images)

    def no_build(*args, **kwargs):
        raise AssertionError("nothing is built on a device without images")

    monkeypatch.setattr(data_type, "build_library", no_build)
    record = data_type.profile_data_type()
    assert record.data_type == "buffer" and record.operators == () and record.ratio is None
    assert "CL_DEVICE_IMAGE_SUPPORT is false" in record.reason


# --- compile follows a record of its device -----------------------------------------------------


def _model_with(tmp_path: Path, device: dict, data_type_: str = "image") -> Path:
    timings = _timings((1.0, 0.7))
    ratio = 0.7 if data_type_ == "image" else 1.2
    record = DataTypeRecord(data_type_, "given", device, ratio, IMAGE_THRESHOLD, timings, 3)
    return write_with_record(shipped_model_path("emulated-soc"), record, tmp_path / "m.json")


def _this_device() -> dict:
    return {k: v for k, v in local_device().items() if k != "cpu_threads"}


def _against_onnxruntime(artifact: Path) -> float:
    ort = pytest.importorskip("onnxruntime")
    model = load_onnx(SMALL_CNN)
    x = np.random.default_rng(3).standard_normal(model.inputs[0].shape).astype("float32")
    name = model.inputs[0].name
    expected = ort.InferenceSession(str(SMALL_CNN)).run(None, {name: x})[0]
    got = load_artifact(artifact)([x])[0]
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.opencl
def test_compile_builds_images_where_the_profile_of_this_device_says_so(
    opencl, tmp_path, capsys, caplog
):
    cost_model = _model_with(tmp_path, _this_device())
    out = tmp_path / "art"
    argv = ["compile", str(SMALL_CNN), "-o", str(out), "--device", "opencl"]
    with caplog.at_level(logging.INFO, logger="codl_tvm"):
        assert main([*argv, "--cost-model", str(cost_model)]) == 0, capsys.readouterr().err
    assert "GPU data type: image (profiled on " in caplog.text
    assert "images 0.7x the buffers' time" in caplog.text
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    assert (gpu["data_type"], gpu["source"], gpu["profile"]["data_type"]) == (
        "image",
        "profile",
        "image",
    )
    assert len(manifest["vm_devices"]) > 1  # one slot per memory scope: an image build
    assert b"write_imagef" in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out) <= 1e-4

    # the explicit flag wins; the buffer build gives the same result
    buffers = tmp_path / "buffers"
    flag = ["--cost-model", str(cost_model), "--gpu-data-type", "buffer", "--device", "opencl"]
    assert main(["compile", str(SMALL_CNN), "-o", str(buffers), *flag]) == 0
    manifest = json.loads((buffers / "manifest.json").read_text())
    assert manifest["gpu"] == {"asked": "buffer", "data_type": "buffer", "dtype": "float32"}
    x = np.random.default_rng(0).standard_normal(load_onnx(SMALL_CNN).inputs[0].shape)
    x = x.astype("float32")
    a, b = load_artifact(out)([x])[0], load_artifact(buffers)([x])[0]
    assert float(np.abs(a - b).max() / np.abs(b).max()) <= 1e-4


@pytest.mark.opencl
def test_a_profile_of_another_device_keeps_buffers_with_a_note(opencl, tmp_path, caplog):
    cost_model = _model_with(tmp_path, OTHER_DEVICE)
    options = CompileOptions(device="opencl", cost_model=cost_model)  # the Python API
    assert options.gpu_data_type is None
    with caplog.at_level(logging.INFO, logger="codl_tvm"):
        out = compile_artifact(SMALL_CNN, tmp_path / "art", options)
    assert "is for another device (profiled on Mali-G710 (ARM Platform" in caplog.text
    gpu = json.loads((out / "manifest.json").read_text())["gpu"]
    assert gpu["data_type"] == "buffer" and gpu["source"] == "default"
    assert gpu["profile_note"].startswith("profiled on Mali-G710 (ARM Platform, 10 compute units)")
    assert b"write_imagef" not in (out / "model.so").read_bytes()


@pytest.mark.opencl
def test_shipped_models_carry_only_the_h100s_profile(opencl, tmp_path):
    """The H100's model carries the profile measured on it (buffers: images took several times
    their time there), with its conversions; the emulated SoC's models none (their GPU is
    PoCL on whatever CPU emulates it). A compile here without the flag keeps buffers and its
    record as before."""
    for name in ("emulated-soc", "emulated-soc-k12", "emulated-soc-k12-alone"):
        meta = json.loads(shipped_model_path(name).read_text())["meta"]
        assert META_KEY not in meta, name
    meta = json.loads(shipped_model_path("device-h100").read_text())["meta"]
    record = DataTypeRecord.from_json(meta[META_KEY])
    assert record.data_type == "buffer" and record.ratio > 1 / IMAGE_THRESHOLD
    assert record.device["gpu"] == meta["device"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert len(record.operators) == len(OPERATORS) and record.conversion is not None
    out = compile_artifact(SMALL_CNN, tmp_path / "art", CompileOptions(device="opencl"))
    gpu = json.loads((out / "manifest.json").read_text())["gpu"]
    assert gpu == {"asked": "buffer", "data_type": "buffer", "dtype": "float32"}


@pytest.mark.slow  # 25 s on 2 cores; CI keeps the GPU-alone compile that follows the profile
@pytest.mark.opencl
def test_coexec_gpu_parts_follow_the_profile(opencl, tmp_path, capsys):
    """A co-executed build with a given split: its GPU parts on images, checked against
    onnxruntime."""
    cost_model = _model_with(tmp_path, _this_device())
    out = tmp_path / "art"
    argv = ["compile", str(SMALL_CNN), "-o", str(out), "--cost-model", str(cost_model)]
    assert main([*argv, "--dim", "OC", "--ratio", "0.5"]) == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "coexec"
    assert (manifest["gpu"]["data_type"], manifest["gpu"]["source"]) == ("image", "profile")
    assert _against_onnxruntime(out) <= 1e-4


# --- bad input: one line, exit status 2 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", "android-mali"], "preset 'android-mali' cross-compiles"),
        (["--preset", "host"], "preset 'host' has no GPU"),
        (["--model", "m.onnx"], "drop --model"),
        ([], "--data-type needs --out FILE.json"),
        (["--data-type-ops", "conv9x9"], "data-type operators must be among"),
    ],
)
def test_bad_data_type_input(tmp_path, capsys, extra, message):
    out = [] if extra == [] else ["--out", str(tmp_path / "r.json")]
    assert main(["profile", "--data-type", *extra, *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r.json").exists()


def test_no_opencl_device_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data_type, "local_device", lambda: None)
    assert main(["profile", "--data-type", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has none usable" in err


def test_data_type_flags_need_data_type(tmp_path, capsys):
    assert main(["profile", "--sample", "1", "--cost-model", "m.json", "-o", "d.jsonl"]) == 2
    assert "--cost-model goes with --data-type" in capsys.readouterr().err


def test_cost_model_must_be_one(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    argv = ["profile", "--data-type", "--cost-model", str(bad), "--out", str(tmp_path / "o.json")]
    assert main(argv) == 2
    assert "not a codl-tvm cost model file" in capsys.readouterr().err


def test_options_default_and_check():
    assert CompileOptions().gpu_data_type is None
    assert CompileOptions(device="cpu").gpu_data_type is None
    with pytest.raises(OptionsError, match="gpu_data_type 'texture' is not one of"):
        CompileOptions(gpu_data_type="texture")
    with pytest.raises(OptionsError, match="describe GPU builds; device is 'cpu'"):
        CompileOptions(device="cpu", gpu_data_type="image")


def test_a_malformed_record_is_one_line(tmp_path, capsys):
    model = tmp_path / "m.json"
    obj = json.loads(shipped_model_path("emulated-soc").read_text())
    obj["meta"][META_KEY] = {"version": 1, "data_type": "texture", "device": {}}
    model.write_text(json.dumps(obj))
    argv = ["compile", str(SMALL_CNN), "-o", str(tmp_path / "a"), "--device", "opencl"]
    assert main([*argv, "--cost-model", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a GPU data-type record" in err
