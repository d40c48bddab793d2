"""NaN and inf through Relu, Clip, Max, Min and MaxPool: codl.PropagateNaN's rewrite (structural)
and every build path against onnxruntime (NaN equal to NaN)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes.nan_semantics import propagate_nan
from onnx import TensorProto, numpy_helper
from onnx import helper as oh
from tvm import te, topi
from tvm.script import tirx as T

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.runner import build
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx

ort = pytest.importorskip("onnxruntime")


# ---- the rewrite, structurally ---------------------------------------------------------------


def verify(before: tvm.tirx.PrimFunc, expected: tvm.tirx.PrimFunc) -> None:
    tvm.ir.assert_structural_equal(propagate_nan(before), expected)


def test_relu_gets_one_select():
    @T.prim_func(private=True, check_well_formed=False)
    def before(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("relu"):
                vi = T.axis.spatial(4, i)
                y[vi] = T.max(x[vi], T.float32(0))

    @T.prim_func(private=True, check_well_formed=False)
    def expected(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("relu"):
                vi = T.axis.spatial(4, i)
                y[vi] = T.Select(T.isnan(x[vi]), x[vi], T.max(x[vi], T.float32(0)))

    verify(before, expected)


def test_maximum_checks_both_operands():
    @T.prim_func(private=True, check_well_formed=False)
    def before(
        a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")
    ):
        for i in range(4):
            with T.sblock("max"):
                vi = T.axis.spatial(4, i)
                y[vi] = T.min(a[vi], b[vi])

    @T.prim_func(private=True, check_well_formed=False)
    def expected(
        a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")
    ):
        for i in range(4):
            with T.sblock("max"):
                vi = T.axis.spatial(4, i)
                y[vi] = T.Select(
                    T.isnan(a[vi]), a[vi], T.Select(T.isnan(b[vi]), b[vi], T.min(a[vi], b[vi]))
                )

    verify(before, expected)


def test_integer_and_reduction_kernels_are_unchanged():
    x = te.placeholder((1, 2, 4, 4), "float32", name="x")
    pool = te.create_prim_func([x, topi.nn.pool2d(x, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "max")])
    assert propagate_nan(pool).same_as(pool)
    n = te.placeholder((4,), "int32", name="n")
    relu_int = te.create_prim_func([n, topi.nn.relu(n)])
    assert propagate_nan(relu_int).same_as(relu_int)


# ---- every path against onnxruntime ----------------------------------------------------------

SHAPE = (1, 2, 4, 4)
X = np.array(
    [np.nan, -np.inf, np.inf, -1, 0, 1, 2, 7, np.nan, 3, -2, np.inf, -np.inf, np.nan, 0.5, -0.5]
    * 2,
    dtype=np.float32,
).reshape(SHAPE)
X2 = np.array(
    [1, np.nan, np.nan, 5, np.inf, -np.inf, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9] * 2, dtype=np.float32
).reshape(SHAPE)


def _model(op: str, inputs: int = 1, out_shape=SHAPE, inits=(), **attrs) -> onnx.ModelProto:
    names = [f"x{i}" for i in range(inputs)]
    graph = oh.make_graph(
        [oh.make_node(op, names + [t.name for t in inits], ["y"], **attrs)],
        op.lower(),
        [oh.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in names],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        initializer=list(inits),
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _bound(name: str, value: float):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


CASES = {
    "relu": (_model("Relu"), [X]),
    "clip": (_model("Clip", inits=(_bound("lo", 0.0), _bound("hi", 6.0))), [X]),
    "max": (_model("Max", 2), [X, X2]),
    "min": (_model("Min", 2), [X, X2]),
    # ONNX leaves NaN inside a pooling window undefined; onnxruntime's answer depends on where
    # the NaN falls, and TVM's max reduction agrees with it on these windows
    "maxpool": (
        _model("MaxPool", out_shape=(1, 2, 2, 2), kernel_shape=[2, 2], strides=[2, 2]),
        [X],
    ),
}


def _onnxruntime(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: x for i, x in zip(model.graph.input, inputs)})


@pytest.mark.opencl
@pytest.mark.parametrize("device", ["cpu", "opencl"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_nan_and_inf_like_onnxruntime(opencl, op, device):
    model, inputs = CASES[op]
    expected = _onnxruntime(model, inputs)
    got = build(load_onnx(model).mod, device)(inputs)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=0, equal_nan=True)


def _small_cnn(pool: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [
        weight("w1", (8, 3, 3, 3)),
        weight("b1", (8,)),
        weight("w2", (8, 8, 3, 3)),
        weight("b2", (8,)),
        weight("wf", (10, 8 * 4 * 4)),
        weight("bf", (10,)),
        _bound("lo", 0.0),
        _bound("hi", 6.0),
    ]
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c1"], ["r1"]),
        oh.make_node(pool, ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        oh.make_node("Clip", ["c2", "lo", "hi"], ["k2"]),
        oh.make_node("Max", ["k2", "p1"], ["m2"]),
        oh.make_node("Flatten", ["m2"], ["f"]),
        oh.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = oh.make_graph(
        nodes,
        "cnn",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 8, 8))],
        [
            oh.make_tensor_value_info("y", TensorProto.FLOAT, (1, 10)),
            oh.make_tensor_value_info("m2", TensorProto.FLOAT, (1, 8, 4, 4)),
        ],
        initializer=inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _cnn_input() -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    x[0, 0, 1, 1], x[0, 1, 6, 5], x[0, 2, 6, 1] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.opencl
@pytest.mark.parametrize("dim", ["H", "OC"])
def test_small_cnn_with_nan_and_inf_coexecuted_like_onnxruntime(opencl, dim):
    # average pooling: every window with a NaN is NaN in both (see test_..._max_pool below)
    model = _small_cnn("AveragePool")
    x = _cnn_input()
    expected = _onnxruntime(model, [x])
    assert np.isnan(expected[1]).any() and np.isfinite(expected[1]).any()
    mod = load_onnx(model).mod
    got = compile_coexec(mod, uniform_plan(mod, dim, 0.5))([x])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.opencl
@pytest.mark.parametrize("dim", ["H", "OC"])
def test_small_cnn_with_max_pool_coexecuted_like_the_cpu_build(opencl, dim):
    # onnxruntime's MaxPool drops or keeps a NaN depending on its place in the window (2-D
    # windows differ from TVM's order), so the co-executed build is held to the CPU build
    model = _small_cnn("MaxPool")
    x = _cnn_input()
    mod = load_onnx(model).mod
    expected = build(mod, "cpu")([x])
    assert np.isnan(expected[1]).any()
    got = compile_coexec(mod, uniform_plan(mod, dim, 0.5))([x])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, equal_nan=True)
