"""The texture build path: GPU operators computing in NCHW4c images (CoDL's hybrid data type).

The layout pass structurally; the NCHW <-> image conversion kernels and a conv model from ONNX
numerically, on a real OpenCL device (PoCL from pip) through pyopencl with TVM's generated
kernels (``tests/texture_opencl.py``; the runtime plugin does not create images yet); the
memory planner's texture sizes; the TIR pipeline's registration.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes.texture_layout import (
    ToTextureLayout,
    pack_bias,
    pack_nchw,
    pack_oihw,
)
from codl_tvm.schedules.opencl_texture import TextureLayoutTransform
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.runtime.vm import VirtualMachine
from tvm.script import relax as R
from tvm.script import tirx as T
from tvm.tirx import compilation_pipeline

from codl_tvm.build import texture

from .texture_opencl import TextureRunner, image_dims, launches

GPU = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
KERNEL_FILE = Path(__file__).parent / "data" / "texture_conv2d_bias_relu.cl"
UPDATE_ENV = "CODL_TVM_UPDATE_TEXTURE_KERNEL"


# --- the layout pass ---------------------------------------------------------------------------


def verify(before: tvm.IRModule, expected: tvm.IRModule) -> None:
    after = ToTextureLayout()(before)
    relax.analysis.well_formed(after)  # raises if not
    tvm.ir.assert_structural_equal(after, expected)


def _bound(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tvm.IRModule:
    return relax.transform.BindParams("main", params)(mod)


def test_conv_bias_relu_chain_computes_packed():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w: R.Tensor((8, 8, 3, 3), "float32"),
            b: R.Tensor((1, 8, 1, 1), "float32"),
            w2: R.Tensor((4, 8, 1, 1), "float32"),
        ) -> R.Tensor((1, 4), "float32"):
            with R.dataflow():
                y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                z = R.add(y, b)
                r = R.nn.relu(z)
                q = R.nn.conv2d(r, w2)
                o = R.mean(q, axis=[2, 3])
                R.output(o)
            return o

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 8, 6, 6), "float32"),
            w: R.Tensor((2, 8, 3, 3, 4), "float32"),
            b: R.Tensor((2, 1, 1, 4), "float32"),
            w2: R.Tensor((1, 8, 1, 1, 4), "float32"),
        ) -> R.Tensor((1, 4), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                y4 = R.nn.conv2d(
                    x4,
                    w,
                    padding=[1, 1, 1, 1],
                    data_layout="NCHW4c",
                    kernel_layout="OIHW4o",
                    out_layout="NCHW4c",
                )
                z4 = R.add(y4, b)
                r4 = R.nn.relu(z4)
                # r feeds only the next conv: no unpack between the two convs
                q4 = R.nn.conv2d(
                    r4, w2, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                # the chain's end: back to NCHW for the op the layout does not cover
                q = R.layout_transform(q4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                o = R.mean(q, axis=[2, 3])
                R.output(o)
            return o

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    b = rng.standard_normal((1, 8, 1, 1)).astype("float32")
    w2 = rng.standard_normal((4, 8, 1, 1)).astype("float32")
    before = _bound(Before, {"w": w, "b": b, "w2": w2})
    expected = _bound(Expected, {"w": pack_oihw(w), "b": pack_bias(b), "w2": pack_oihw(w2)})
    verify(before, expected)


def test_pools_behind_a_packed_value_compute_packed():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((4, 4, 1, 1), "float32")
        ) -> R.Tensor((1, 4, 5, 5), "float32"):
            with R.dataflow():
                y = R.nn.conv2d(x, w)
                p = R.nn.max_pool2d(y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
                q = R.nn.avg_pool2d(p, pool_size=[2, 2], padding=[1, 1, 1, 1])
                R.output(q)
            return q

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 4, 8, 8), "float32"), w: R.Tensor((1, 4, 1, 1, 4), "float32")
        ) -> R.Tensor((1, 4, 5, 5), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                y4 = R.nn.conv2d(
                    x4, w, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                p4 = R.nn.max_pool2d(
                    y4,
                    pool_size=[3, 3],
                    strides=[2, 2],
                    padding=[1, 1, 1, 1],
                    layout="NCHW4c",
                    out_layout="NCHW4c",
                )
                q4 = R.nn.avg_pool2d(
                    p4, pool_size=[2, 2], padding=[1, 1, 1, 1], layout="NCHW4c", out_layout="NCHW4c"
                )
                q = R.layout_transform(q4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                R.output(q)
            return q

    w = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype("float32")
    verify(_bound(Before, {"w": w}), _bound(Expected, {"w": pack_oihw(w)}))


def test_rgb_conv_pads_its_input_pixels():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((8, 3, 3, 3), "float32")
        ) -> R.Tensor((1, 8, 6, 6), "float32"):
            with R.dataflow():
                y = R.nn.conv2d(x, w)
                R.output(y)
            return y

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 3, 8, 8), "float32"), w: R.Tensor((2, 4, 3, 3, 4), "float32")
        ) -> R.Tensor((1, 8, 6, 6), "float32"):
            with R.dataflow():
                # 3 channels fill one pixel with a zero fourth channel (and a zero weight)
                x4 = R.layout_transform(
                    x,
                    index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4),
                    pad_value=R.prim_value(T.float32(0)),
                )
                y4 = R.nn.conv2d(
                    x4, w, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                y = R.layout_transform(y4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                R.output(y)
            return y

    w = np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype("float32")
    packed = pack_oihw(w)
    assert packed.shape == (2, 4, 3, 3, 4) and not packed[:, 3].any()
    verify(_bound(Before, {"w": w}), _bound(Expected, {"w": packed}))


def test_uncovered_conv_is_left_alone():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 8, 8, 8), "float32"), w: R.Tensor((8, 4, 3, 3), "float32")
        ) -> R.Tensor((1, 8, 6, 6), "float32"):
            with R.dataflow():
                # grouped: TVM's Adreno conv computes dense convs only
                y = R.nn.conv2d(x, w, groups=2)
                R.output(y)
            return y

    before = _bound(Before, {"w": np.ones((8, 4, 3, 3), "float32")})
    verify(before, before)


def test_weight_packing_is_tvms_oihw4o():
    w = np.arange(8 * 4 * 1 * 1, dtype="float32").reshape(8, 4, 1, 1)
    packed = pack_oihw(w)
    assert packed.shape == (2, 4, 1, 1, 4)
    for o in range(8):
        np.testing.assert_array_equal(packed[o // 4, :, :, :, o % 4], w[o])


# --- conversion kernels and a model, on OpenCL -------------------------------------------------


def _conv_module(shape: tuple[int, int, int, int], seed: int = 0):
    """y = relu(conv(x) + b); z = conv(y); out = mean(y, axis=1) + mean(z, axis=1): y is read
    by a conv (an image) and by a reduction that reads NCHW (an image-to-buffer conversion)."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    weight = (rng.standard_normal((c, c, 3, 3)) / c).astype("float32")
    bias = rng.standard_normal((1, c, 1, 1)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=[1, 1, 1, 1]))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(bias))))
            z = bb.emit(relax.op.nn.conv2d(y, relax.const(weight), padding=[1, 1, 1, 1]))
            m = bb.emit(relax.op.mean(y, axis=[1], keepdims=True))
            out = bb.emit_output(relax.op.add(m, relax.op.mean(z, axis=[1], keepdims=True)))
        bb.emit_func_output(out)
    return bb.get(), weight, bias


def _np_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A padded 3x3 conv in float64."""
    h, wd = x.shape[2:]
    xp = np.pad(x.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for kh in range(3):
        for kw in range(3):
            patch = xp[:, :, kh : kh + h, kw : kw + wd]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw])
    return out


def _calls(runner: TextureRunner, prefix: str):
    """(variable, PrimFunc name, PrimFunc) of ``main``'s calls of PrimFuncs named ``prefix*``."""
    for block in runner.scheduled["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Call) and value.op.name == "relax.call_tir":
                gv = value.args[0]
                if gv.name_hint.startswith(prefix):
                    yield b.var, gv.name_hint, runner.scheduled[gv]


@pytest.mark.opencl
@pytest.mark.parametrize(
    "shape, scope",
    [((1, 8, 10, 10), "global.texture-weight"), ((1, 8, 96, 96), "global.texture-nhwc")],
)
def test_conversion_kernels_match_numpy(shape, scope):
    mod, weight, bias = _conv_module(shape)
    runner = TextureRunner.for_model(mod, GPU)
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    runner.run(x)

    # NCHW -> image: the first conversion kernel writes x's pixels into an image
    (packed_var, _, to_image), *_ = _calls(runner, "te_layout_transform")
    assert to_image.params[-1].scope() == scope
    got = runner.read(runner.env[packed_var])
    np.testing.assert_array_equal(got, pack_nchw(x))

    # image -> NCHW: y lives in an image (a conv reads it); the reduction reads NCHW y, which
    # TVM's scope annotation gets by a copy of the image into a buffer (a VM to_device)
    copies = [
        b
        for block in runner.scheduled["main"].body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call) and b.value.op.name == "relax.to_vdevice"
    ]
    assert len(copies) == 1 and "texture" in str(copies[0].value.args[0].ty.vdevice.memory_scope)
    y = np.maximum(_np_conv(x, weight) + bias, 0)
    got = runner.read(runner.env[copies[0].var])
    np.testing.assert_allclose(got, pack_nchw(y), rtol=1e-4, atol=1e-4)
    m = y.mean(axis=1, keepdims=True) + _np_conv(y, weight).mean(axis=1, keepdims=True)
    np.testing.assert_allclose(
        runner.read(runner.env[runner.scheduled["main"].body.body]), m, rtol=1e-4, atol=1e-4
    )


def _pack_func(shape: tuple[int, int, int, int], scope: str) -> tvm.tirx.PrimFunc:
    """NCHW -> NCHW4c image, looping over the input as topi's layout_transform does."""
    n, c, h, w = shape

    @T.prim_func(private=True, s_tir=True)
    def pack(
        x: T.Buffer((n, c, h, w), "float32"),
        y: T.Buffer((n, c // 4, h, w, 4), "float32", scope=scope),
    ):
        for i0, i1, i2, i3 in T.grid(n, c, h, w):
            with T.sblock("te_layout_transform"):
                v0, v1, v2, v3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
                y[v0, v1 // 4, v2, v3, v1 % 4] = x[v0, v1, v2, v3]

    return pack


def _unpack_func(shape: tuple[int, int, int, int], scope: str) -> tvm.tirx.PrimFunc:
    """NCHW4c image -> NCHW."""
    n, c, h, w = shape

    @T.prim_func(private=True, s_tir=True)
    def unpack(
        y: T.Buffer((n, c // 4, h, w, 4), "float32", scope=scope),
        x: T.Buffer((n, c, h, w), "float32"),
    ):
        for i0, i1, i2, i3, i4 in T.grid(n, c // 4, h, w, 4):
            with T.sblock("te_layout_transform"):
                v0, v1, v2, v3, v4 = T.axis.remap("SSSSS", [i0, i1, i2, i3, i4])
                x[v0, v1 * 4 + v4, v2, v3] = y[v0, v1, v2, v3, v4]

    return unpack


@pytest.mark.opencl
@pytest.mark.parametrize(
    "shape, scope",
    [
        ((1, 12, 7, 9), "global.texture-weight"),  # 189 pixels: a workgroup of 189
        ((2, 8, 5, 6), "global.texture"),
        ((1, 8, 96, 96), "global.texture-nhwc"),
    ],
)
def test_conversion_kernels_both_ways_match_numpy(shape, scope):
    """codl-tvm's conversion kernels, scheduled by TextureLayoutTransform, round-trip through
    an image of each texture scope, each half checked against numpy's packing."""
    target = texture.texture_target(GPU)
    rule = TextureLayoutTransform()
    funcs = {}
    for name, make in (("pack", _pack_func), ("unpack", _unpack_func)):
        with target:
            sch = rule.apply(make(shape, scope), target, False)
        assert sch is not None, rule.explain(make(shape, scope), target)
        funcs[name] = sch.mod["main"]
    runner = TextureRunner.for_primfuncs(funcs, GPU)
    x = np.random.default_rng(5).standard_normal(shape).astype("float32")
    packed_shape = (shape[0], shape[1] // 4, shape[2], shape[3], 4)
    src = runner.tensor(shape, "float32", "global", x)
    image = runner.tensor(packed_shape, "float32", scope)
    back = runner.tensor(shape, "float32", "global")
    runner.call("pack", [src, image])
    np.testing.assert_array_equal(runner.read(image), pack_nchw(x))
    runner.call("unpack", [image, back])
    np.testing.assert_array_equal(runner.read(back), x)


def _onnx_conv_relu(seed: int = 0) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    shape = (1, 16, 28, 28)
    w1 = (rng.standard_normal((16, 16, 3, 3)) / 12).astype("float32")
    b1 = rng.standard_normal(16).astype("float32")
    w2 = (rng.standard_normal((8, 16, 3, 3)) / 12).astype("float32")
    b2 = rng.standard_normal(8).astype("float32")
    inits = [
        helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.ravel())
        for name, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 14, 14))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, shape


@pytest.mark.opencl
def test_onnx_conv_relu_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model, shape = _onnx_conv_relu()
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    runner = TextureRunner.for_model(from_onnx(model), GPU)
    got = runner.run(x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

    # both convs compute on images: each conv kernel reads its input from a texture scope,
    # and the first writes its output (the second conv's input) into one
    convs = list(_calls(runner, "fused_conv2d_NCHWc_OIHWo"))
    assert len(convs) == 2
    assert all("texture" in f.params[0].scope() for _, _, f in convs)
    assert "texture" in convs[0][2].params[-1].scope()
    # one kernel per conv: the padding is read from the image, not copied to a buffer first
    assert [len(launches(runner.tir[name], runner.kernels)) for _, name, _ in convs] == [1, 1]
    assert "write_imagef" in runner.source and "READ_IMAGEF" in runner.source


def _onnx_residual_pools(seed: int = 0) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """An RGB input, conv-relu, conv, residual add, relu, max pool 3x3/2, average pool 2x2
    (pad 1)."""
    rng = np.random.default_rng(seed)
    shape = (1, 3, 20, 20)
    inits = [
        helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.ravel())
        for name, v in (
            ("w1", (rng.standard_normal((8, 3, 3, 3)) / 3).astype("float32")),
            ("b1", rng.standard_normal(8).astype("float32")),
            ("w2", (rng.standard_normal((8, 8, 3, 3)) / 8).astype("float32")),
        )
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a"]),
        helper.make_node("Conv", ["a", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "c2"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node(
            "MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
        ),
        helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[2, 2], pads=[1] * 4),
    ]
    graph = helper.make_graph(
        nodes,
        "residual_pools",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 11, 11))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, shape


@pytest.mark.opencl
def test_onnx_residual_and_pools_match_onnxruntime():
    """A residual add of two image tensors (fused into the second conv) and both pools
    computing on images."""
    ort = pytest.importorskip("onnxruntime")
    model, shape = _onnx_residual_pools()
    x = np.random.default_rng(4).standard_normal(shape).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    runner = TextureRunner.for_model(from_onnx(model), GPU)
    np.testing.assert_allclose(runner.run(x), expected, rtol=1e-4, atol=1e-4)
    pools = list(_calls(runner, "max_pool2d")) + list(_calls(runner, "fused_avg_pool2d"))
    pools += list(_calls(runner, "avg_pool2d"))
    assert len(pools) == 2
    assert all("texture" in f.params[0].scope() for _, _, f in pools)
    assert all(f.attrs["codl.algorithm"] == "pool" for _, _, f in pools)


@pytest.mark.opencl
@pytest.mark.parametrize("make_model", [_onnx_conv_relu, _onnx_residual_pools])
def test_onnx_models_run_in_the_runtime_plugin(opencl, tmp_path, make_model):
    """The models through codl-tvm's OpenCL runtime and TVM's stock Relax VM: texture tensors
    are images the plugin allocates and passes to the kernels."""
    ort = pytest.importorskip("onnxruntime")
    model, shape = make_model()
    x = np.random.default_rng(3).standard_normal(shape).astype("float32")
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]

    build = texture.build_texture_gpu(from_onnx(model), GPU)
    assert any("texture" in scope for scope in build.scopes)
    build.executable.export_library(str(tmp_path / "model.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "model.so"))
    dev = tvm.opencl(0)
    vm = VirtualMachine(lib, build.vm_devices(dev))
    got = vm["main"](tvm.runtime.tensor(x, dev)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.opencl
def test_recorded_conv_kernel_source_is_current():
    """The generated kernels of a conv + bias + relu in images, kept for the docs; regenerate
    with CODL_TVM_UPDATE_TEXTURE_KERNEL=1 when a change of the build path changes them."""
    model, _ = _onnx_conv_relu()
    build = texture.build_texture_gpu(from_onnx(model), GPU)
    source = build.kernel_source()
    if os.environ.get(UPDATE_ENV) == "1":
        KERNEL_FILE.write_text(source)
    assert KERNEL_FILE.read_text() == source, f"kernels changed: rerun with {UPDATE_ENV}=1"


# --- build plumbing ----------------------------------------------------------------------------


def _storage_sizes(mod: tvm.IRModule) -> list[tuple[int, str, tuple[int, ...]]]:
    """(storage bytes, scope, shape) of every tensor ``main`` allocates from its own storage."""
    sizes: dict[relax.Var, int] = {}
    scopes = [str(v.memory_scope) for v in mod.global_infos["vdevice"]]
    found = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            if value.op.name == "relax.vm.alloc_storage":
                sizes[b.var] = int(value.args[0].values[0])
            elif value.op.name == "relax.vm.alloc_tensor":
                shape = tuple(int(v) for v in value.args[2].values)
                scope = scopes[int(value.args[4].value)]
                found.append((sizes[value.args[0]], scope, shape))
    return found


def test_texture_storage_is_sized_by_the_image():
    """TVM's planned storages (``image_storages=False``): a texture tensor's storage holds its
    image's rows, not four times as much."""
    model, _ = _onnx_conv_relu()
    texture.install_texture_size_fix()
    target = texture.texture_target(GPU)
    lowered = texture.texture_pipeline(target, image_storages=False)(from_onnx(model))
    images = [s for s in _storage_sizes(lowered) if "texture" in s[1]]
    assert images, "no tensor was placed in an image"
    for size, scope, shape in images:
        width, height, depth = image_dims(shape, scope)
        row_pitch = -(-width * 16 // 64) * 64  # RGBA float32 pixels, rows aligned to 64 bytes
        assert size == row_pitch * height * depth, (size, scope, shape)


def test_texture_tensors_get_image_storages_of_their_shape():
    model, _ = _onnx_conv_relu()
    target = texture.texture_target(GPU)
    lowered = texture.texture_pipeline(target)(from_onnx(model))
    scopes = [str(v.memory_scope) for v in lowered.global_infos["vdevice"]]
    storages, tensors = {}, []
    for block in lowered["main"].body.blocks:
        for b in block.bindings:
            name = getattr(getattr(b.value, "op", None), "name", None)
            if name == "relax.vm.alloc_storage":
                storages[b.var] = b.value
            elif name == "relax.vm.alloc_tensor":
                tensors.append(b.value)
    images = [t for t in tensors if "texture" in scopes[int(t.args[4].value)]]
    assert len(images) == 2  # the converted input and the first conv's output
    for t in images:
        storage = storages[t.args[0]]
        assert [int(v) for v in storage.args[0].values] == [int(v) for v in t.args[2].values]
        assert storage.args[3].value == scopes[int(t.args[4].value)]


def test_registration_is_idempotent():
    first = texture.register_texture_tir_pipeline()
    again = texture.register_texture_tir_pipeline()
    assert first == again == texture.TEXTURE_TIR_PIPELINE
    assert compilation_pipeline.PIPELINE_MAP[first] is texture.texture_tir_pipeline
    device, host, device_final = compilation_pipeline.get_tir_pipeline(first)
    assert isinstance(device, tvm.transform.Pass) and callable(host) and callable(device_final)
    texture.install_texture_size_fix()
    texture.install_texture_size_fix()
    assert tvm.get_global_func("DeviceGetMemSize.opencl") is not None


def test_texture_target_adds_keys_once():
    target = texture.texture_target(texture.texture_target(GPU))
    assert list(target.keys).count("texture") == 1 and "adreno" in target.keys
    assert target.host is not None and target.host.kind.name == "llvm"
    with pytest.raises(ValueError, match="gpu"):
        texture.texture_target(tvm.target.Target({"kind": "llvm"}))


def test_concat_of_whole_pixels_computes_packed():
    @tvm.script.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 4, 6, 6), "float32"),
            w1: R.Tensor((8, 4, 1, 1), "float32"),
            w2: R.Tensor((4, 4, 1, 1), "float32"),
        ) -> R.Tensor((1, 14, 6, 6), "float32"):
            with R.dataflow():
                a = R.nn.conv2d(x, w1)
                b = R.nn.conv2d(x, w2)
                c = R.concat((a, b), axis=1)
                # x has 4 channels but no packed producer; 2 channels are half a pixel
                d = R.concat((c, R.zeros((1, 2, 6, 6), "float32")), axis=1)
                R.output(d)
            return d

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 4, 6, 6), "float32"),
            w1: R.Tensor((2, 4, 1, 1, 4), "float32"),
            w2: R.Tensor((1, 4, 1, 1, 4), "float32"),
        ) -> R.Tensor((1, 14, 6, 6), "float32"):
            with R.dataflow():
                x4 = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 4, h, w, c % 4))
                a4 = R.nn.conv2d(
                    x4, w1, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                b4 = R.nn.conv2d(
                    x4, w2, data_layout="NCHW4c", kernel_layout="OIHW4o", out_layout="NCHW4c"
                )
                # the two branches join along C/4: no conversion between them
                c4 = R.concat((a4, b4), axis=1)
                c = R.layout_transform(c4, index_map=lambda n, c, h, w, i: (n, c * 4 + i, h, w))
                d = R.concat((c, R.zeros((1, 2, 6, 6), "float32")), axis=1)
                R.output(d)
            return d

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((8, 4, 1, 1)).astype("float32")
    w2 = rng.standard_normal((4, 4, 1, 1)).astype("float32")
    before = _bound(Before, {"w1": w1, "w2": w2})
    verify(before, _bound(Expected, {"w1": pack_oihw(w1), "w2": pack_oihw(w2)}))


def _onnx_instance_norm(hw: int):
    """A conv to 8 channels (offset by 3: a mean far from zero), InstanceNorm and ReLU on an
    ``hw`` x ``hw`` map, and its float64 answer on a seeded input."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype("float32")
    b = rng.standard_normal(8).astype("float32") + 3
    s, t = (rng.standard_normal(8).astype("float32") for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
            helper.make_node("InstanceNormalization", ["c", "s", "t"], ["n"], epsilon=1e-5),
            helper.make_node("Relu", ["n"], ["y"]),
        ],
        "instance_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, hw, hw))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, hw, hw))],
        [onnx.numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (s, "s"), (t, "t"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.uniform(0.0, 1.0, (1, 4, hw, hw)).astype("float32")
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    c = np.einsum("nchwij,ocij->nohw", windows, w.astype(np.float64)) + b[:, None, None]
    mean, var = c.mean(axis=(2, 3), keepdims=True), c.var(axis=(2, 3), keepdims=True)
    y = (c - mean) / np.sqrt(var + 1e-5) * s[:, None, None] + t[:, None, None]
    return model, x, np.maximum(y, 0.0)


@pytest.mark.opencl
def test_a_mean_over_a_whole_image_is_summed_row_by_row():
    """InstanceNorm's mean of a 256x256 image (65536 pixels): each row summed apart in a
    register, then added; from the float64 answer 5e-6 (one accumulator for the whole map:
    1.1e-4, beyond the builds' 1e-4 tolerance)."""
    model, x, want = _onnx_instance_norm(256)
    runner = TextureRunner.for_model(from_onnx(model), GPU)
    (pool,) = (f for _, _, f in _calls(runner, "adaptive_avg_pool2d"))
    assert "texture" in pool.params[0].scope()
    assert "adaptive_pool_sum_rf" in pool.script()  # the row sums
    assert np.abs(runner.run(x) - want).max() < 2e-5
