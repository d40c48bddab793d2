"""Co-executed builds whose GPU parts compute on half images, the CPU parts in float32.

``codl.PackGpuParts(dtype="float16")`` structurally (the casts sit with the part's packing and
unpacking, its weights and bias are float16 constants, its conv writes float16, the CPU part
untouched), the decision of what a device gets (a device without ``cl_khr_fp16``: a caps
object, no device needed), and on this machine's OpenCL device the conv-pool model under an H
and an OC split against onnxruntime within the float16 tolerance of ``run --check``, and
``codl-tvm compile --device coexec --gpu-data-type image --gpu-dtype float16`` end to end.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes.parts import PARTS_ATTR, collect_parts
from codl_tvm.passes.texture_layout import pack_bias, pack_oihw
from codl_tvm.passes.texture_parts import TEXTURE_PARTS_ATTR, PackGpuParts
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from codl_tvm.build import texture_coexec
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.cli.run import CHECK_TOLERANCE
from codl_tvm.core.errors import DeviceSupportError
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.runtime.images import ImageCaps, image_caps
from tests.texture_graphs import conv_pool_model

CPU_PART = ["codl0_cpu_0_conv2d", "codl0_cpu_1_add", "codl0_cpu_2_relu"]


def _with_attrs(mod: tvm.IRModule, **attrs) -> tvm.IRModule:
    mod = mod.clone()
    gv = mod.get_global_var("main")
    func = mod[gv]
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    mod.update_func(gv, func)
    return mod


def _bound(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tvm.IRModule:
    return relax.transform.BindParams("main", params)(mod)


def _record(gpu: list[str]) -> str:
    """The part record of an OC split of ``conv2d_0`` (16 output channels, 8 each) reading
    ``x``."""
    parts = [
        {"processor": "gpu", "region": [0, 8], "input_region": [0, 8], "bindings": gpu},
        {"processor": "cpu", "region": [8, 16], "input_region": [0, 8], "bindings": CPU_PART},
    ]
    return json.dumps(
        [
            {
                "name": "conv2d_0",
                "ops": ["conv2d_0"],
                "dim": "OC",
                "axis": 1,
                "ratio": 0.5,
                "input": "x",
                "output": "codl0_out",
                "parts": parts,
                "foldable": [],
            }
        ]
    )


def test_gpu_part_computes_in_half_between_its_casts():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w0: R.Tensor((8, 8, 3, 3), "float32"),
            b0: R.Tensor((1, 8, 1, 1), "float32"),
            w1: R.Tensor((8, 8, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                codl0_gpu_0_conv2d = R.nn.conv2d(x, w0, padding=[1, 1, 1, 1])
                codl0_gpu_1_add = R.add(codl0_gpu_0_conv2d, b0)
                codl0_gpu_2_relu = R.nn.relu(codl0_gpu_1_add)
                codl0_cpu_0_conv2d = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_cpu_2_relu = R.nn.relu(codl0_cpu_1_add)
                codl0_out = R.concat((codl0_gpu_2_relu, codl0_cpu_2_relu), axis=1)
                R.output(codl0_out)
            return codl0_out

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w0: R.Tensor((2, 8, 3, 3, 4), "float16"),
            b0: R.Tensor((2, 1, 1, 4), "float16"),
            w1: R.Tensor((8, 8, 3, 3), "float32"),
            b1: R.Tensor((1, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 16, 6, 6), "float32"):
            with R.dataflow():
                # the part's start: the shared float32 input cast to half where it is packed
                x_f16 = R.astype(x, "float16")
                x_4c = R.layout_transform(
                    x_f16, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4)
                )
                # the conv writes half (accumulates in half, as the GPU-alone float16 build)
                codl0_gpu_0_conv2d_4c = R.nn.conv2d(
                    x_4c,
                    w0,
                    padding=[1, 1, 1, 1],
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                    out_dtype="float16",
                )
                codl0_gpu_1_add_4c = R.add(codl0_gpu_0_conv2d_4c, b0)
                codl0_gpu_2_relu_4c = R.nn.relu(codl0_gpu_1_add_4c)
                # its end: unpacked, then cast back to float32 for the merge
                codl0_gpu_2_relu_f16 = R.layout_transform(
                    codl0_gpu_2_relu_4c, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w)
                )
                codl0_gpu_2_relu = R.astype(codl0_gpu_2_relu_f16, "float32")
                # the CPU part: float32 buffers, untouched
                codl0_cpu_0_conv2d = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                codl0_cpu_1_add = R.add(codl0_cpu_0_conv2d, b1)
                codl0_cpu_2_relu = R.nn.relu(codl0_cpu_1_add)
                codl0_out = R.concat((codl0_gpu_2_relu, codl0_cpu_2_relu), axis=1)
                R.output(codl0_out)
            return codl0_out

    rng = np.random.default_rng(0)
    w0, w1 = (rng.standard_normal((8, 8, 3, 3)).astype("float32") for _ in range(2))
    b0, b1 = (rng.standard_normal((1, 8, 1, 1)).astype("float32") for _ in range(2))
    gpu = ["codl0_gpu_0_conv2d", "codl0_gpu_1_add", "codl0_gpu_2_relu"]
    before = _with_attrs(
        _bound(Before, {"w0": w0, "b0": b0, "w1": w1, "b1": b1}), **{PARTS_ATTR: _record(gpu)}
    )
    # the casts belong to the GPU part (the placement puts them on the GPU)
    packed_gpu = [
        "x_f16",
        "x_4c",
        "codl0_gpu_0_conv2d_4c",
        "codl0_gpu_1_add_4c",
        "codl0_gpu_2_relu_4c",
        "codl0_gpu_2_relu_f16",
        "codl0_gpu_2_relu",
    ]
    summary = [
        {
            "split": "conv2d_0",
            "dim": "OC",
            "data_type": "image",
            "packed_ops": "3/3",
            "dtype": "float16",
        }
    ]
    half = {"w0": pack_oihw(w0).astype("float16"), "b0": pack_bias(b0).astype("float16")}
    expected = _with_attrs(
        _bound(Expected, {**half, "w1": w1, "b1": b1}),
        **{PARTS_ATTR: _record(packed_gpu), TEXTURE_PARTS_ATTR: json.dumps(summary)},
    )
    after = PackGpuParts("float16")(before)
    relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)
    collect_parts(after)  # every recorded name is bound once


def test_pack_gpu_parts_refuses_other_types():
    with pytest.raises(ValueError, match="bfloat16"):
        PackGpuParts("bfloat16")


# --- what a device gets ---------------------------------------------------------------------------

_CAPS = ImageCaps(
    device="half-less",
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


def test_half_gpu_parts_on_a_device_without_fp16():
    # asked explicitly: one line naming the device and the extension
    with pytest.raises(DeviceSupportError, match="'half-less' lacks cl_khr_fp16") as err:
        texture_coexec.coexec_gpu_data_type(_CAPS, "image", "float16")
    assert "\n" not in str(err.value)
    # auto: images in float32, and why
    built, why = texture_coexec.coexec_gpu_data_type(_CAPS, "auto", "float16")
    assert built == "image" and "'half-less' lacks cl_khr_fp16" in why and "float32" in why
    assert texture_coexec.coexec_gpu_dtype(_CAPS, built, "float16") == "float32"
    # buffer GPU parts stay float32 whatever the device, with the note
    built, why = texture_coexec.coexec_gpu_data_type(_CAPS, "buffer", "float16")
    assert built == "buffer" and "applies to co-executed GPU parts on images" in why
    assert texture_coexec.coexec_gpu_dtype(_CAPS, built, "float16") == "float32"


def test_half_gpu_parts_where_the_device_has_them():
    caps = dataclasses.replace(_CAPS, fp16=True)
    for asked in ("image", "auto"):
        assert texture_coexec.coexec_gpu_data_type(caps, asked, "float16") == ("image", "")
        assert texture_coexec.coexec_gpu_dtype(caps, "image", "float16") == "float16"
    # no half images (CL_HALF_FLOAT): as without the extension
    no_half_images = dataclasses.replace(caps, rgba_half=False)
    with pytest.raises(DeviceSupportError, match="CL_HALF_FLOAT"):
        texture_coexec.coexec_gpu_data_type(no_half_images, "image", "float16")
    # a cross-compiling preset (no caps): built as asked
    assert texture_coexec.coexec_gpu_data_type(None, "image", "float16") == ("image", "")
    assert texture_coexec.coexec_gpu_dtype(None, "image", "float16") == "float16"
    assert texture_coexec.coexec_gpu_dtype(None, "image", "float32") == "float32"


# --- on this machine's device ---------------------------------------------------------------------


def _library_bytes(built) -> bytes:
    return Path(built.library).read_bytes()


def _needs_fp16() -> None:
    caps = image_caps()
    if not caps.fp16:  # PoCL from pip has no cl_khr_fp16 on some CPUs
        pytest.skip(f"OpenCL device '{caps.device}' lacks cl_khr_fp16")


@pytest.mark.opencl
@pytest.mark.parametrize("dim", ["H", "OC"])
def test_conv_pool_half_gpu_parts_match_onnxruntime(opencl, tmp_path, dim):
    """OC 0.5 of 8 channels: 4 for the GPU, a whole pixel; H 0.5: half the rows."""
    ort = pytest.importorskip("onnxruntime")
    _needs_fp16()
    proto = onnx.load(conv_pool_model(tmp_path / "m.onnx"))
    model = load_onnx(proto)
    plan = uniform_plan(model.mod, dim, 0.5)
    built = compile_coexec(model.mod, plan, gpu_data_type="image", gpu_dtype="float16")
    x = random_inputs(model, seed=1)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, x)[0]
    got = built([x[s.name] for s in model.inputs])[0]
    assert got.dtype == np.float32 and got.shape == want.shape
    error = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
    assert error <= CHECK_TOLERANCE["float16"], error
    rows = {r["split"]: r for r in built.kernel_splits["gpu_parts"]}
    assert rows["conv2d_0"]["data_type"] == "image" and rows["conv2d_0"]["dtype"] == "float16"
    # the GPU kernels read and write half images
    library = _library_bytes(built)
    assert b"write_imageh" in library and b"read_imageh" in library


@pytest.mark.opencl
def test_compile_coexec_half_images_end_to_end(opencl, tmp_path, capsys):
    _needs_fp16()
    _, model = onnx.load(bundled_model_path()), load_onnx(onnx.load(bundled_model_path()))
    plan = tmp_path / "plan.json"
    plan.write_text(uniform_plan(model.mod, "OC", 0.5).to_json())
    out = tmp_path / "art"
    argv = ["compile", str(bundled_model_path()), "-o", str(out), "--device", "coexec"]
    flags = ["--gpu-data-type", "image", "--gpu-dtype", "float16"]
    code = main([*argv, "--plan", str(plan), "--no-measure", *flags])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu"] == {"asked": "image", "data_type": "image", "dtype": "float16"}
    rows = manifest["kernel_splits"]["gpu_parts"]
    assert rows[0]["split"] == "conv2d_0" and rows[0]["dtype"] == "float16"
    # parts left in buffers (a pool at a part's start) compute in float32
    assert all(r["dtype"] == "float32" for r in rows if r["packed_ops"].startswith("0/"))
    assert b"write_imageh" in (out / "model.so").read_bytes()
    # run --check: against the float32 reference within the float16 tolerance
    capsys.readouterr()
    assert main(["run", str(out), "--check", "--repeat", "1", "--number", "1"]) == 0
    printed = capsys.readouterr().out
    assert "GPU in float16" in printed and "-> OK" in printed
