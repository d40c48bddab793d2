"""``codl-tvm compile --device opencl --gpu-data-type image|auto --gpu-dtype float16``: whole
models on the GPU alone with their tensors in OpenCL images (CoDL's GPU data type), checked
against onnxruntime; the device checks behind them (images, image limits, ``cl_khr_fp16``) as
one line and exit status 2; the options and flags."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.build import texture
from codl_tvm.build.cache import Libraries
from codl_tvm.build.targets import get_preset
from codl_tvm.cli import main
from codl_tvm.core.errors import DeviceSupportError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.measure import MEASURE_ROUNDS, gpu_data_measurement
from codl_tvm.options import CompileOptions, OptionsError
from codl_tvm.runtime.artifact import Manifest, ModelRecord, file_sha256, load_artifact
from codl_tvm.runtime.images import ImageCaps, image_caps
from tests.texture_graphs import conv_pool_model

REPO = Path(__file__).resolve().parent.parent


def _compile(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["compile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _against_onnxruntime(artifact: Path, model: Path, seed: int = 3) -> float:
    """Max abs difference of the artifact's output from onnxruntime's, over the output's
    scale."""
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(seed).standard_normal(load_onnx(model).inputs[0].shape)
    x = x.astype("float32")
    expected = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    got = load_artifact(artifact)([x])[0]
    assert got.shape == expected.shape and got.dtype == np.float32
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.opencl
def test_compile_on_images_matches_onnxruntime(opencl, tmp_path, capsys):
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu"] == {"asked": "image", "data_type": "image", "dtype": "float32"}
    # one VM slot per memory scope, each the OpenCL device
    assert manifest["vm_devices"] == ["opencl"] * texture.VM_DEVICE_SLOTS
    # the library's kernels write images (TVM's texture codegen)
    assert b"write_imagef" in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out, model) <= 1e-4
    # run --check: the stored host-CPU reference
    assert main(["run", str(out), "--check", "--repeat", "1", "--number", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out


@pytest.mark.opencl
def test_buffers_stay_the_default(opencl, tmp_path, capsys):
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(capsys, str(model), "-o", str(out), "--device", "opencl")
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu"]["data_type"] == "buffer" and manifest["vm_devices"] == ["opencl"]
    assert b"write_imagef" not in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out, model) <= 1e-4


def _wide(caps: ImageCaps) -> int:
    """A row width no image of the device holds, even as ``H * W`` pixels with ``H = 1``."""
    return caps.image2d_max_width + 4


@pytest.mark.opencl
def test_image_beyond_the_device_limits_is_one_line(opencl, tmp_path, capsys):
    caps = image_caps()
    model = conv_pool_model(tmp_path / "wide.onnx", h=1, w=_wide(caps))
    out = tmp_path / "art"
    code, stdout, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"
    )
    assert code == 2 and stdout == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("codl-tvm: error: ")
    assert f"'{caps.device}'" in lines[0] and "CL_DEVICE_IMAGE2D_MAX_WIDTH" in lines[0]
    assert str(caps.image2d_max_width) in lines[0] and "--gpu-data-type" in lines[0]
    assert not out.exists()


@pytest.mark.opencl
def test_auto_builds_buffers_where_images_do_not_fit(opencl, tmp_path, capsys, caplog):
    caps = image_caps()
    model = conv_pool_model(tmp_path / "wide.onnx", h=1, w=_wide(caps))
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"
    )
    assert code == 0, err
    gpu = json.loads((out / "manifest.json").read_text())["gpu"]
    assert gpu["asked"] == "auto" and gpu["data_type"] == "buffer"
    assert "CL_DEVICE_IMAGE2D_MAX_WIDTH" in gpu["why"]
    # measured (this machine runs the preset), but only the buffers: no image build to time
    assert list(gpu["measured_ms"]) == ["buffer"] and gpu["measured_on"] == "this machine"
    assert "unchecked" not in gpu
    kept = [m for m in caplog.messages if "GPU data type measured on this machine" in m]
    assert len(kept) == 1 and "keeping buffers" in kept[0]
    assert "images not timed" in kept[0] and "CL_DEVICE_IMAGE2D_MAX_WIDTH" in kept[0]
    assert b"write_imagef" not in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out, model) <= 1e-4


@pytest.mark.opencl
def test_auto_takes_images_where_they_fit_without_measuring(opencl, tmp_path, capsys, caplog):
    """``--no-measure``: the capability rule, recorded as unchecked, nothing timed."""
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys,
        *(str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"),
        "--no-measure",
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu"] == {
        "asked": "auto",
        "data_type": "image",
        "dtype": "float32",
        "unchecked": "not measured: measuring was switched off",
    }
    assert "(unchecked)" in caplog.text and "GPU data type measured" not in caplog.text
    assert manifest["vm_devices"] == ["opencl"] * texture.VM_DEVICE_SLOTS
    assert b"write_imagef" in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out, model) <= 1e-4


def _platform_caps(platform: str) -> dict | None:
    """The image caps of ``platform``'s first device (a child process: a process uses one
    platform), or None where it is not installed."""
    code = (
        "import json; from codl_tvm.runtime import images; "
        "print(json.dumps(images.image_caps().__dict__))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "CODL_OPENCL_PLATFORM": platform},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None


@pytest.mark.opencl
def test_float16_on_a_device_without_cl_khr_fp16_is_one_line(opencl, tmp_path):
    """PoCL from pip has no cl_khr_fp16 (Intel's CPU runtime has it)."""
    caps = _platform_caps("pocl")
    if caps is None:
        pytest.skip("PoCL is not installed")
    if caps["fp16"]:
        pytest.skip(f"PoCL's device '{caps['device']}' has cl_khr_fp16 here")
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    argv = ["compile", str(model), "-o", str(out), "--device", "opencl", "--gpu-dtype", "float16"]
    proc = subprocess.run(
        [sys.executable, "-m", "codl_tvm.cli", *argv],
        env={**os.environ, "CODL_OPENCL_PLATFORM": "pocl"},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"'{caps['device']}'" in lines[0] and "lacks cl_khr_fp16" in lines[0]
    assert "--gpu-dtype" in lines[0]
    assert not out.exists()


def test_gpu_options_name_their_flags(tmp_path, capsys):
    code, _, err = _compile(
        capsys, "-o", str(tmp_path / "a"), "--device", "cpu", "--gpu-data-type", "image"
    )
    assert code == 2 and "--gpu-data-type and --gpu-dtype describe GPU builds" in err
    with pytest.raises(OptionsError, match="gpu_dtype 'float64' is not one of"):
        CompileOptions(gpu_dtype="float64")
    with pytest.raises(OptionsError, match="gpu_data_type 'texture' is not one of"):
        CompileOptions(gpu_data_type="texture")
    assert not (tmp_path / "a").exists()


# --- the device checks, on the imported model ------------------------------------------------


def _caps(**changes) -> ImageCaps:
    """A device like PoCL's CPU device as pip installs it (images of 16384 x 16384 x 2048)."""
    base = ImageCaps(
        device="test-device",
        image_support=True,
        image2d_max_width=16384,
        image2d_max_height=16384,
        image_max_array_size=2048,
        pitch_alignment_pixels=1,
        base_address_alignment_pixels=1,
        image2d_from_buffer=False,
        rgba_float=True,
        rgba_half=True,
        fp16=False,
        from_buffer_refused=0,
        from_buffer_refused_why="",
    )
    return dataclasses.replace(base, **changes)


def test_device_checks(tmp_path):
    """No device here lacks images, so what a driver without them reports
    (``CL_DEVICE_IMAGE_SUPPORT`` false) is given as the device's caps."""
    mod = load_onnx(conv_pool_model(tmp_path / "m.onnx", h=16, w=64)).mod
    assert texture.check_device(mod, _caps(), "image", "float32") == ("image", "")
    assert texture.check_device(mod, _caps(), "buffer", "float32") == ("buffer", "")

    no_images = _caps(image_support=False)
    with pytest.raises(DeviceSupportError, match="'test-device' has no image support") as err:
        texture.check_device(mod, no_images, "image", "float32")
    assert err.value.fields == ("gpu_data_type",)
    built, why = texture.check_device(mod, no_images, "auto", "float32")
    assert built == "buffer" and "CL_DEVICE_IMAGE_SUPPORT" in why

    # the first conv's output, (1, 8, 16, 64) as NCHW4c: 64 pixels a row in global.texture,
    # 1024 in texture-nhwc, 2048 in texture-weight; 63 pixels hold none of them
    narrow = _caps(image2d_max_width=63)
    with pytest.raises(DeviceSupportError, match="CL_DEVICE_IMAGE2D_MAX_WIDTH = 63"):
        texture.check_device(mod, narrow, "image", "float32")
    assert texture.check_device(mod, _caps(image2d_max_width=64), "image", "float32")[0] == "image"
    # 16 rows of 64 pixels (global.texture) or 2 rows of 1024 (texture-nhwc): rows are no limit
    # where another layout fits
    assert texture.check_device(mod, _caps(image2d_max_height=2), "image", "float32")[0] == "image"

    with pytest.raises(DeviceSupportError, match="'test-device' lacks cl_khr_fp16") as err:
        texture.check_device(mod, _caps(fp16=False), "buffer", "float16")
    assert err.value.fields == ("gpu_dtype",)
    no_half_images = _caps(fp16=True, rgba_half=False)
    assert "CL_HALF_FLOAT" in texture.check_device(mod, no_half_images, "auto", "float16")[1]


def test_image_extents_follow_the_scopes():
    shape = (1, 8, 16, 64, 4)  # N, C/4, H, W, pixel
    assert texture.image_extents(shape, "global.texture") == (64, 16, 8)
    assert texture.image_extents(shape, "global.texture-nhwc") == (1024, 8, 1)
    assert texture.image_extents(shape, "global.texture-weight") == (8192, 1, 1)


def test_packed_tensors_are_the_convs_and_pools(tmp_path):
    mod = load_onnx(conv_pool_model(tmp_path / "m.onnx", h=16, w=64)).mod
    found = dict((shape, op) for op, shape in texture.packed_tensors(mod))
    # the RGB input padded to a pixel, the convs' outputs, the pool's output
    assert found == {
        (1, 1, 16, 64, 4): "conv2d",
        (1, 2, 16, 64, 4): "conv2d",
        (1, 2, 16, 32, 4): "max_pool2d",
    }


@pytest.mark.opencl
@pytest.mark.parametrize("data_type", ["image", "buffer"])
def test_half_precision_on_the_gpu(opencl, tmp_path, capsys, data_type):
    """GPU tensors in float16 (images or buffers), inputs and outputs float32: within half
    precision's error of onnxruntime, and not float32's (the kernels compute in half)."""
    caps = image_caps()
    if not caps.fp16:
        pytest.skip(f"OpenCL device '{caps.device}' lacks cl_khr_fp16")
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys,
        *(str(model), "-o", str(out), "--device", "opencl"),
        *("--gpu-data-type", data_type, "--gpu-dtype", "float16"),
    )
    assert code == 0, err
    gpu = json.loads((out / "manifest.json").read_text())["gpu"]
    assert gpu == {"asked": data_type, "data_type": data_type, "dtype": "float16"}
    library = (out / "model.so").read_bytes()
    assert b"half" in library
    assert (b"write_imageh" in library) == (data_type == "image")
    error = _against_onnxruntime(out, model)
    assert 1e-5 < error <= 1e-2
    # `run` checks the stored float32 reference with half precision's tolerance
    assert main(["run", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GPU in float16: tolerance 0.05 of the scale) -> OK" in printed


@pytest.mark.opencl
def test_images_with_weights_beside(opencl, tmp_path, capsys):
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys,
        *(str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"),
        *("--weights", "beside"),
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["weights"]["placement"] == "beside" and (out / "weights.bin").is_file()
    assert manifest["gpu"]["data_type"] == "image"
    assert _against_onnxruntime(out, model) <= 1e-4


@pytest.mark.opencl
def test_the_build_spec_carries_the_gpu_data(opencl, tmp_path, caplog):
    """The GPU-alone library's spec (and so its cache key) carries images and half; a
    co-executed compile's GPU parts take half images (the spec carries both), its GPU-alone
    library keeping buffers."""
    path = conv_pool_model(tmp_path / "m.onnx")
    model = load_onnx(path)
    manifest = Manifest(model=ModelRecord(str(path), file_sha256(path), [], []))
    libraries = Libraries(tmp_path, None, model, manifest, get_preset("opencl"))
    buffers = libraries.spec("opencl", None)
    assert (buffers.gpu_data_type, buffers.gpu_dtype) == ("buffer", "float32")

    # half where the device has cl_khr_fp16 (PoCL on some CPUs has not: float32 images)
    half = "float16" if image_caps().fp16 else "float32"
    with caplog.at_level(logging.INFO, logger="codl_tvm.build.cache"):
        coexec = libraries.set_gpu_data("image", half, "coexec")
    assert (coexec["data_type"], coexec["dtype"]) == ("image", half)
    assert "float32" not in caplog.text  # image GPU parts as asked: nothing to note
    assert libraries.spec("coexec", None).gpu_data_type == "image"
    assert libraries.spec("coexec", None).gpu_dtype == half
    assert libraries.spec("opencl", None) == buffers
    assert libraries.gpu_vm_devices() == ["opencl", "cpu", "opencl", "opencl"]

    record = libraries.set_gpu_data("image", "float32", "opencl")
    assert record == {"asked": "image", "data_type": "image", "dtype": "float32"}
    images = libraries.spec("opencl", None)
    assert images.gpu_data_type == "image" and images.key() != buffers.key()
    assert libraries.spec("cpu", None).gpu_data_type == "buffer"
    assert libraries.gpu_vm_devices() == ["opencl"] * texture.VM_DEVICE_SLOTS


# --- gpu_data_type auto: the data type chosen by measuring ------------------------------------


@pytest.mark.opencl
def test_measured_auto_keeps_the_faster_data_type(opencl, tmp_path, capsys, caplog):
    """Both builds timed on this machine; the artifact is the one with the lower median
    (which one is faster here says nothing about a phone: only the record's consistency is
    checked)."""
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    ms = gpu["measured_ms"]
    assert set(ms) == {"buffer", "image"} and all(v > 0 for v in ms.values())
    assert gpu["data_type"] == min(ms, key=ms.get)
    assert gpu["asked"] == "auto" and gpu["dtype"] == "float32"
    assert gpu["measured_on"] == "this machine" and gpu["rounds"] == MEASURE_ROUNDS
    assert all(len(gpu["samples_ms"][t]) == MEASURE_ROUNDS for t in ms)
    assert ms == {t: float(np.median(v)) for t, v in gpu["samples_ms"].items()}
    assert "unchecked" not in gpu and "why" not in gpu and "dropped" not in gpu
    # the kept library is the kept type's: image kernels and one VM slot per scope, or neither
    images = gpu["data_type"] == "image"
    assert (b"write_imagef" in (out / "model.so").read_bytes()) == images
    assert manifest["vm_devices"] == ["opencl"] * (texture.VM_DEVICE_SLOTS if images else 1)
    # one line says what was compared and what was kept
    kept = [m for m in caplog.messages if "GPU data type measured on this machine" in m]
    assert len(kept) == 1, caplog.messages
    assert f"buffers {ms['buffer']:.3f} ms" in kept[0] and f"images {ms['image']:.3f} ms" in kept[0]
    assert kept[0].endswith(f"keeping {gpu['data_type']}s")
    assert _against_onnxruntime(out, model) <= 1e-4
    assert main(["run", str(out), "--check", "--repeat", "1", "--number", "1"]) == 0
    assert "-> OK" in capsys.readouterr().out


@pytest.mark.opencl
def test_measured_auto_with_weights_beside(opencl, tmp_path, capsys):
    """The candidates are timed with embedded weights; the kept one is built again with its
    weights beside (as for co-execution)."""
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys,
        *(str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"),
        *("--weights", "beside"),
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    assert gpu["data_type"] == min(gpu["measured_ms"], key=gpu["measured_ms"].get)
    assert manifest["weights"]["placement"] == "beside" and (out / "weights.bin").is_file()
    images = gpu["data_type"] == "image"
    assert (b"write_imagef" in (out / "model.so").read_bytes()) == images
    assert _against_onnxruntime(out, model) <= 1e-4


def test_auto_measures_where_the_target_is_reachable():
    """The rule of the co-executed compile's default measurement."""
    auto = CompileOptions(device="opencl", gpu_data_type="auto")
    assert gpu_data_measurement(dataclasses.replace(auto, verify=5), get_preset("host")) == (
        5,
        None,
    )
    rounds, why = gpu_data_measurement(auto, get_preset("android-adreno"))
    assert rounds == 0 and why.startswith("not measured: preset 'android-adreno' cross-compiles")
    # a device behind a tracker is reachable, also for a preset that cross-compiles
    # (tests/test_rpc_images.py times both builds there)
    remote = dataclasses.replace(auto, tracker="127.0.0.1:9190", key="adreno")
    assert gpu_data_measurement(remote, get_preset("android-adreno")) == (MEASURE_ROUNDS, None)
    assert gpu_data_measurement(auto, get_preset("host")) == (MEASURE_ROUNDS, None)
    off = dataclasses.replace(auto, measure=False)
    assert gpu_data_measurement(off, get_preset("android-adreno")) == (
        0,
        "not measured: measuring was switched off",
    )
    # buffers asked: nothing to choose
    assert gpu_data_measurement(CompileOptions(device="opencl"), get_preset("host")) == (0, None)
    # a co-executed compile measures as verify does: a given plan only with verify
    coexec = CompileOptions(device="coexec", gpu_data_type="auto")
    assert gpu_data_measurement(coexec, get_preset("host")) == (MEASURE_ROUNDS, None)
    given = dataclasses.replace(coexec, plan="plan.json")
    assert gpu_data_measurement(given, get_preset("host"))[1] == (
        "not measured: the plan was given (verify measures it)"
    )
    assert gpu_data_measurement(dataclasses.replace(given, verify=2), get_preset("host")) == (
        2,
        None,
    )


@pytest.mark.opencl
def test_auto_candidates_differ_in_the_data_type_only(opencl, tmp_path):
    path = conv_pool_model(tmp_path / "m.onnx")
    model = load_onnx(path)
    manifest = Manifest(model=ModelRecord(str(path), file_sha256(path), [], []))
    libraries = Libraries(tmp_path, None, model, manifest, get_preset("opencl"))
    libraries.set_gpu_data("auto", "float32", "opencl")
    specs = libraries.gpu_data_candidates()
    assert list(specs) == ["buffer", "image"]
    assert specs["buffer"] == dataclasses.replace(specs["image"], gpu_data_type="buffer")
    libraries.keep_gpu_data("buffer")
    assert libraries.spec("opencl", None) == specs["buffer"]
    assert libraries.gpu_vm_devices() == ["opencl"]
    assert libraries.gpu_vm_devices("image") == ["opencl"] * texture.VM_DEVICE_SLOTS
    # buffers decided: images are no candidate any more
    assert list(libraries.gpu_data_candidates()) == ["buffer"]
    with pytest.raises(ValueError, match="'image' is not a candidate"):
        libraries.keep_gpu_data("image")


@pytest.mark.opencl
def test_auto_in_a_coexecuted_compile_keeps_buffers(opencl, tmp_path, capsys, caplog):
    """A co-executed compile whose plan falls back to the GPU alone keeps buffers there (its
    record says so, and that nothing was measured): auto measures the co-executed plan's
    types (tests/test_texture_coexec_auto.py), and the GPU alone's only with --device opencl."""
    model = conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, _, err = _compile(
        capsys,
        *(str(model), "-o", str(out), "--mode", "gpu_only", "--no-measure"),
        *("--gpu-data-type", "auto"),
    )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "opencl" and manifest["gpu"]["data_type"] == "buffer"
    assert "the artifact runs on the GPU alone, built with buffers" in manifest["gpu"]["why"]
    assert manifest["gpu"]["unchecked"] == "not measured: measuring was switched off"
    assert "GPU data type measured" not in caplog.text
    assert b"write_imagef" not in (out / "model.so").read_bytes()
    assert _against_onnxruntime(out, model) <= 1e-4
