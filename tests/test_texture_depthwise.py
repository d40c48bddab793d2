"""Depthwise convolutions and global average pools on OpenCL images (issue 46).

The layout pass structurally (a MobileNet-like block packed from its first conv to its global
average pool, what stays NCHW and why), the weight packing, and a small ONNX block compiled
with ``compile --device opencl --gpu-data-type image`` against onnxruntime on the local
OpenCL device (PoCL in CI), its depthwise conv and pool running as image kernels.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes.texture_layout import (
    ToTextureLayout,
    pack_bias,
    pack_depthwise,
    pack_function,
    pack_oihw,
    unpacked_reason,
)
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.script import relax as R

from codl_tvm.build import texture
from codl_tvm.cli import main
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.images import image_caps

from .texture_opencl import TextureRunner, launches

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    after = ToTextureLayout()(before)
    relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)


def _bound(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tvm.IRModule:
    return relax.transform.BindParams("main", params)(mod)


def _weights(*shapes: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in shapes]


# --- the layout pass ---------------------------------------------------------------------------


def test_depthwise_block_computes_packed_through_the_global_pool():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            wd: R.Tensor((8, 1, 3, 3), "float32"),
            b: R.Tensor((1, 8, 1, 1), "float32"),
            w2: R.Tensor((4, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 4, 1, 1), "float32"):
            with R.dataflow():
                d = R.nn.conv2d(x, wd, strides=[2, 2], padding=[1, 1, 1, 1], groups=8)
                z = R.add(d, b)
                r = R.nn.relu(z)
                g = R.mean(r, axis=[2, 3], keepdims=True)
                q = R.nn.conv2d(g, w2)
                R.output(q)
            return q

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            wd: R.Tensor((2, 1, 3, 3, 4), "float32"),
            b: R.Tensor((2, 1, 1, 4), "float32"),
            w2: R.Tensor((1, 8, 1, 1, 4), "float32"),
        ) -> R.Tensor((1, 4, 1, 1), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                # one input channel per group: output pixel k reads input pixel k only
                d4 = R.nn.conv2d(
                    x4,
                    wd,
                    strides=[2, 2],
                    padding=[1, 1, 1, 1],
                    groups=8,
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                )
                z4 = R.add(d4, b)
                r4 = R.nn.relu(z4)
                # the global average pool: an adaptive pool TVM's scope annotation lets read an
                # image (a reduction's input stays a buffer)
                g4 = R.nn.adaptive_avg_pool2d(
                    r4, output_size=[1, 1], layout="NCHW4c", out_layout="NCHW4c"
                )
                q4 = R.nn.conv2d(
                    g4, w2, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                q = R.layout_transform(q4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                R.output(q)
            return q

    wd, b, w2 = _weights((8, 1, 3, 3), (1, 8, 1, 1), (4, 8, 1, 1))
    before = _bound(Before, {"wd": wd, "b": b, "w2": w2})
    expected = _bound(Expected, {"wd": pack_depthwise(wd), "b": pack_bias(b), "w2": pack_oihw(w2)})
    verify(before, expected)


def test_global_pool_read_as_nchw_is_unpacked_once():
    """The pooled value read by an uncovered op (ONNX's Flatten) is unpacked after the pool:
    the conversion moves C values, not C*H*W."""

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 4, 5, 5), "float32"), wd: R.Tensor((4, 1, 3, 3), "float32")
        ) -> R.Tensor((1, 4), "float32"):
            with R.dataflow():
                d = R.nn.conv2d(x, wd, groups=4)
                g = R.mean(d, axis=[-2, -1], keepdims=True)
                f = R.reshape(g, (1, 4))
                R.output(f)
            return f

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 4, 5, 5), "float32"), wd: R.Tensor((1, 1, 3, 3, 4), "float32")
        ) -> R.Tensor((1, 4), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                d4 = R.nn.conv2d(
                    x4,
                    wd,
                    groups=4,
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                )
                g4 = R.nn.adaptive_avg_pool2d(
                    d4, output_size=[1, 1], layout="NCHW4c", out_layout="NCHW4c"
                )
                g = R.layout_transform(g4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                f = R.reshape(g, (1, 4))
                R.output(f)
            return f

    (wd,) = _weights((4, 1, 3, 3))
    verify(_bound(Before, {"wd": wd}), _bound(Expected, {"wd": pack_depthwise(wd)}))


def test_squeeze_excitation_scale_broadcasts_packed():
    """The scale of a squeeze-and-excitation block, ``(1, C, 1, 1)``, multiplies the packed
    feature map as it is: no conversion of the feature map around the multiply."""

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w1: R.Tensor((8, 8, 1, 1), "float32"),
            ws: R.Tensor((8, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 8, 6, 6), "float32"):
            with R.dataflow():
                y = R.nn.conv2d(x, w1)
                g = R.mean(y, axis=[2, 3], keepdims=True)
                s = R.nn.conv2d(g, ws)
                a = R.sigmoid(s)
                m = R.multiply(y, a)
                R.output(m)
            return m

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w1: R.Tensor((2, 8, 1, 1, 4), "float32"),
            ws: R.Tensor((2, 8, 1, 1, 4), "float32"),
        ) -> R.Tensor((1, 8, 6, 6), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                y4 = R.nn.conv2d(
                    x4, w1, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                g4 = R.nn.adaptive_avg_pool2d(
                    y4, output_size=[1, 1], layout="NCHW4c", out_layout="NCHW4c"
                )
                s4 = R.nn.conv2d(
                    g4, ws, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                a4 = R.sigmoid(s4)
                # (1, 2, 6, 6, 4) * (1, 2, 1, 1, 4): each pixel times its channels' scale
                m4 = R.multiply(y4, a4)
                m = R.layout_transform(m4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                R.output(m)
            return m

    w1, ws = _weights((8, 8, 1, 1), (8, 8, 1, 1))
    before = _bound(Before, {"w1": w1, "ws": ws})
    verify(before, _bound(Expected, {"w1": pack_oihw(w1), "ws": pack_oihw(ws)}))


def test_what_stays_nchw():
    """A grouped conv that is not depthwise, a depthwise conv over channels short of whole
    pixels or with a channel multiplier, and a mean that drops H and W or reads NCHW."""

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            wg: R.Tensor((8, 4, 3, 3), "float32"),
            x6: R.Tensor((1, 6, 6, 6), "float32"),
            w6: R.Tensor((6, 1, 3, 3), "float32"),
            wm: R.Tensor((16, 1, 3, 3), "float32"),
        ) -> R.Tuple(
            R.Tensor((1, 8, 4, 4), "float32"),
            R.Tensor((1, 6, 4, 4), "float32"),
            R.Tensor((1, 16), "float32"),
            R.Tensor((1, 8, 1, 1), "float32"),
        ):
            with R.dataflow():
                g = R.nn.conv2d(x, wg, groups=2)  # grouped: 4 input channels per group
                d6 = R.nn.conv2d(x6, w6, groups=6)  # 6 channels: no whole pixels
                dm = R.nn.conv2d(x, wm, groups=8)  # multiplier 2
                m = R.mean(dm, axis=[2, 3])  # (1, 16): no longer NCHW
                a = R.mean(x, axis=[2, 3], keepdims=True)  # behind no packed producer
                R.output(g, d6, m, a)
            return (g, d6, m, a)

    wg, w6, wm = _weights((8, 4, 3, 3), (6, 1, 3, 3), (16, 1, 3, 3))
    before = _bound(Before, {"wg": wg, "w6": w6, "wm": wm})
    verify(before, before)
    calls = [b.value for b in before["main"].body.blocks[0].bindings]
    assert unpacked_reason(calls[0]) == "conv2d: grouped or depthwise (groups=2)"


def test_default_coverage_keeps_depthwise_and_means_in_buffers():
    """``pack_function``'s default coverage (None): the depthwise conv and the pool stay NCHW,
    the dense conv behind them is packed."""

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            wd: R.Tensor((8, 1, 3, 3), "float32"),
            w2: R.Tensor((4, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 4, 1, 1), "float32"):
            with R.dataflow():
                d = R.nn.conv2d(x, wd, groups=8)
                g = R.mean(d, axis=[2, 3], keepdims=True)
                q = R.nn.conv2d(g, w2)
                R.output(q)
            return q

    wd, w2 = _weights((8, 1, 3, 3), (4, 8, 1, 1))
    func = _bound(Before, {"wd": wd, "w2": w2})["main"]
    packed = pack_function(func)
    assert packed.changed == 1 and set(packed.owners.values()) == {"q"}


def test_depthwise_weight_packing():
    w = np.arange(8 * 1 * 3 * 3, dtype="float32").reshape(8, 1, 3, 3)
    packed = pack_depthwise(w)
    assert packed.shape == (2, 1, 3, 3, 4)
    for c in range(8):
        np.testing.assert_array_equal(packed[c // 4, 0, :, :, c % 4], w[c, 0])


# --- a MobileNet-like block on OpenCL images ---------------------------------------------------


def _mobile_block(path: Path, stride: int, seed: int = 0, excite: bool = False) -> Path:
    """Pointwise conv-relu 16 -> 32, depthwise 3x3 conv-relu (stride ``stride``, pad 1),
    global average pool, pointwise conv 32 -> 8: MobileNet's block and head. ``excite``:
    the pointwise conv and a sigmoid make a squeeze-and-excitation scale of the depthwise
    conv's output (EfficientNet's block), pooled again for the output."""
    rng = np.random.default_rng(seed)
    values = {
        "w1": (rng.standard_normal((32, 16, 1, 1)) / 4).astype("float32"),
        "b1": rng.standard_normal(32).astype("float32"),
        "wd": (rng.standard_normal((32, 1, 3, 3)) / 3).astype("float32"),
        "bd": rng.standard_normal(32).astype("float32"),
        "w2": (rng.standard_normal((8, 32, 1, 1)) / 6).astype("float32"),
        "b2": rng.standard_normal(8).astype("float32"),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node(
            "Conv", ["r1", "wd", "bd"], ["d"], pads=[1] * 4, group=32, strides=[stride] * 2
        ),
        helper.make_node("Relu", ["d"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Conv", ["g", "w2", "b2"], ["y"]),
    ]
    if excite:
        values["we"] = (rng.standard_normal((32, 8, 1, 1)) / 3).astype("float32")
        nodes[-1].output[0] = "q"
        nodes += [
            helper.make_node("Relu", ["q"], ["qr"]),
            helper.make_node("Conv", ["qr", "we"], ["e"]),
            helper.make_node("Sigmoid", ["e"], ["es"]),
            helper.make_node("Mul", ["r2", "es"], ["scaled"]),
            helper.make_node("GlobalAveragePool", ["scaled"], ["y"]),
        ]
    inits = [
        helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel()) for k, v in values.items()
    ]
    out_channels = 32 if excite else 8
    graph = helper.make_graph(
        nodes,
        "mobile_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 14, 14))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, out_channels, 1, 1))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _onnxruntime(model: Path, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(model)).run(None, {"x": x})[0]


@pytest.mark.opencl
@pytest.mark.parametrize("stride", [1, 2])
def test_compile_mobile_block_on_images_matches_onnxruntime(opencl, tmp_path, capsys, stride):
    model = _mobile_block(tmp_path / "m.onnx", stride)
    out = tmp_path / "art"
    argv = [str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"]
    assert main(["compile", *argv]) == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu"]["data_type"] == "image"
    x = np.random.default_rng(3).standard_normal((1, 16, 14, 14)).astype("float32")
    expected = _onnxruntime(model, x)
    got = load_artifact(out)([x])[0]
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("dtype", "rtol"),
    # float16: convs accumulating in half, the pool's 49 pixels summed in half (5e-4 seen)
    [("float32", 1e-4), ("float16", 1e-2)],
)
def test_mobile_block_runs_as_image_kernels(opencl, tmp_path, caplog, dtype, rtol):
    """Every operator of the block is an image kernel: the depthwise conv (its bias and ReLU
    fused) reads its input image with the padding inlined, the pool reads an image; only the
    final unpacking writes a buffer."""
    caps = image_caps()
    if dtype == "float16" and not caps.fp16:
        pytest.skip(f"OpenCL device '{caps.device}' lacks cl_khr_fp16")
    model = _mobile_block(tmp_path / "m.onnx", stride=2)
    with caplog.at_level(logging.INFO, logger="codl_tvm.build.texture"):
        build = texture.build_texture_gpu(from_onnx(onnx.load(model)), GPU, caps=caps, dtype=dtype)
    kernels = dict(build.kernels)
    depthwise = [k for k in kernels if "depthwise_conv2d_NCHW4c" in k]
    pools = [k for k in kernels if "adaptive_avg_pool2d" in k]
    assert len(depthwise) == 1 and len(pools) == 1
    assert kernels[depthwise[0]] and kernels[pools[0]]
    # conversion in, two pointwise convs, the depthwise conv, the pool: images (a float16
    # build adds the input's cast, fused into nothing on the buffer side)
    assert build.image_kernels == 5
    assert "kernels read or write images" in caplog.text
    x = np.random.default_rng(5).standard_normal((1, 16, 14, 14)).astype("float32")
    dev = tvm.opencl(0)
    build.executable.export_library(str(tmp_path / "model.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "model.so"))
    vm = tvm.runtime.vm.VirtualMachine(lib, build.vm_devices(dev))
    got = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    expected = _onnxruntime(model, x)
    assert np.abs(got - expected).max() <= rtol * np.abs(expected).max()


@pytest.mark.opencl
def test_squeeze_excitation_block_runs_as_image_kernels(opencl, tmp_path):
    """EfficientNet's block: the excitation's scale multiplies the depthwise conv's image,
    with no conversion between; every kernel but the final unpacking is an image kernel."""
    model = _mobile_block(tmp_path / "m.onnx", stride=1, excite=True)
    build = texture.build_texture_gpu(from_onnx(onnx.load(model)), GPU)
    kernels = dict(build.kernels)
    assert [k for k, image in kernels.items() if not image] == ["te_layout_transform1"]
    assert sum(1 for k in kernels if k.startswith("te_layout_transform")) == 2
    x = np.random.default_rng(6).standard_normal((1, 16, 14, 14)).astype("float32")
    dev = tvm.opencl(0)
    build.executable.export_library(str(tmp_path / "model.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "model.so"))
    vm = tvm.runtime.vm.VirtualMachine(lib, build.vm_devices(dev))
    got = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    expected = _onnxruntime(model, x)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()


@pytest.mark.opencl
def test_depthwise_and_pool_kernels_read_images_with_codl_schedules(tmp_path):
    """Through TVM's generated kernels on pyopencl: the depthwise conv and the global pool
    are scheduled by codl-tvm's texture rules, read their input from an image, and the
    depthwise conv is one kernel launch (its padding read from the image, not copied)."""
    model = _mobile_block(tmp_path / "m.onnx", stride=1)
    runner = TextureRunner.for_model(from_onnx(onnx.load(model)), GPU)
    x = np.random.default_rng(8).standard_normal((1, 16, 14, 14)).astype("float32")
    expected = _onnxruntime(model, x)
    assert np.abs(runner.run(x) - expected).max() <= 1e-4 * np.abs(expected).max()
    kernels = {}
    for block in runner.scheduled["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_tir":
                gv = b.value.args[0]
                kernels[gv.name_hint] = runner.scheduled[gv]
    depthwise = [n for n in kernels if "depthwise_conv2d_NCHW4c" in n]
    pools = [n for n in kernels if "adaptive_avg_pool2d" in n]
    assert len(depthwise) == 1 and len(pools) == 1
    for name, algorithm in ((depthwise[0], "depthwise"), (pools[0], "pool")):
        func = kernels[name]
        assert func.attrs["codl.algorithm"] == algorithm
        assert "texture" in func.params[0].scope()
    assert len(launches(runner.tir[depthwise[0]], runner.kernels)) == 1
