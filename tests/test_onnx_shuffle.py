"""ShuffleNet v2's channel split and shuffle as PyTorch exports them (opset 17), through
:func:`codl_tvm.frontend.static_shapes.fold_shape_computations` (structural) and built for the
CPU and co-executed, against onnxruntime (fp32, rtol=1e-4, atol=1e-5).

``x.chunk(2, dim=1)`` is exported as Shape -> Gather([1]) -> Add(1) -> Div(2) -> Mul -> Slice;
TVM's importer left that to run time, and the build failed in LegalizeOps ("emit_te now only
supports Tensor that has ShapeExpr shape").
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.runner import build
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.static_shapes import fold_shape_computations

RTOL, ATOL = 1e-4, 1e-5
C, H, W = 8, 6, 6


def _const(name: str, values) -> onnx.NodeProto:
    return helper.make_node(
        "Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name)
    )


def _chunk_nodes(x: str) -> list[onnx.NodeProto]:
    """``a, b = x.chunk(2, dim=1)`` as torch.onnx.export (TorchScript, opset 17) writes it."""
    return [
        helper.make_node("Shape", [x], ["shape"]),
        _const("one", [1]),
        helper.make_node("Gather", ["shape", "one"], ["channels"], axis=0),
        _const("zero", [0]),
        _const("one_b", [1]),
        helper.make_node("Add", ["channels", "one_b"], ["plus"]),
        _const("two", [2]),
        helper.make_node("Div", ["plus", "two"], ["half"]),
        _const("one_c", [1]),
        helper.make_node("Mul", ["half", "one_c"], ["end_a"]),
        helper.make_node("Slice", [x, "zero", "end_a", "one"], ["a"]),
        _const("two_b", [2]),
        helper.make_node("Mul", ["half", "two_b"], ["end_b"]),
        helper.make_node("Slice", [x, "end_a", "end_b", "one"], ["b"]),
    ]


def _shuffle_nodes(x: str, y: str) -> list[onnx.NodeProto]:
    """torchvision's ``channel_shuffle(x, 2)``: Reshape -> Transpose -> Reshape."""
    return [
        _const("groups_shape", [1, 2, C // 2, H, W]),
        helper.make_node("Reshape", [x, "groups_shape"], ["grouped"]),
        helper.make_node("Transpose", ["grouped"], ["swapped"], perm=[0, 2, 1, 3, 4]),
        _const("flat_shape", [1, C, H, W]),
        helper.make_node("Reshape", ["swapped", "flat_shape"], [y]),
    ]


def _model(nodes, inits, shape=(1, C, H, W)) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "shuffle_unit",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def shuffle_unit() -> onnx.ModelProto:
    """A stride-1 ShuffleNet v2 unit after a 1x1 conv: chunk, a 1x1 / depthwise 3x3 / 1x1
    branch on the second half, concat, channel shuffle."""
    rng = np.random.default_rng(0)
    half = C // 2

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)

    inits = [
        init("w0", (C, C, 1, 1)),
        init("w1", (half, half, 1, 1)),
        init("w2", (half, 1, 3, 3)),
        init("w3", (half, half, 1, 1)),
        init("bias", (half,)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Relu", ["c0"], ["t"]),
        *_chunk_nodes("t"),
        helper.make_node("Conv", ["b", "w1", "bias"], ["c1"]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=half, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3", "bias"], ["c3"]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("Concat", ["a", "r3"], ["cat"], axis=1),
        *_shuffle_nodes("cat", "y"),
    ]
    return _model(nodes, inits)


def _graph_of(model: onnx.ModelProto) -> list[tuple]:
    """Each node as (op type, inputs, outputs, constant value or attributes)."""
    rows = []
    for n in model.graph.node:
        if n.op_type == "Constant":
            attrs = numpy_helper.to_array(n.attribute[0].t).tolist()
        else:
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        rows.append((n.op_type, list(n.input), list(n.output), attrs))
    return rows


def verify(before: onnx.ModelProto, expected: onnx.ModelProto) -> None:
    after = fold_shape_computations(before)
    onnx.checker.check_model(after)
    assert _graph_of(after) == _graph_of(expected)


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _input() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((1, C, H, W)).astype("float32")


# ---- the fold, structurally ------------------------------------------------------------------


def test_chunk_arithmetic_becomes_constants():
    before = _model([*_chunk_nodes("x"), helper.make_node("Concat", ["b", "a"], ["y"], axis=1)], [])
    expected = _model(
        [
            # Shape, Gather, Add, Div and their constant operands are gone; C=8 splits at 4
            _const("one", [1]),
            _const("zero", [0]),
            _const("end_a", [C // 2]),
            helper.make_node("Slice", ["x", "zero", "end_a", "one"], ["a"]),
            _const("end_b", [C]),
            helper.make_node("Slice", ["x", "end_a", "end_b", "one"], ["b"]),
            helper.make_node("Concat", ["b", "a"], ["y"], axis=1),
        ],
        [],
    )
    for node in expected.graph.node:  # folded nodes keep their (empty) names
        node.name = ""
    verify(before, expected)


def test_model_without_shape_is_returned_unchanged():
    model = _model(_shuffle_nodes("x", "y"), [])
    assert fold_shape_computations(model) is model


def test_large_values_stay_computed():
    # ConstantOfShape(Shape(x)) would embed a whole tensor (2,048 numbers): only the shape is
    # folded
    shape = [1, C, 16, 16]
    before = _model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["zeros"]),
            helper.make_node("Add", ["x", "zeros"], ["y"]),
        ],
        [],
        shape,
    )
    big = fold_shape_computations(before)
    assert [n.op_type for n in big.graph.node] == ["Constant", "ConstantOfShape", "Add"]
    assert numpy_helper.to_array(big.graph.node[0].attribute[0].t).tolist() == shape


# ---- import and numerics ----------------------------------------------------------------------


def test_shuffle_unit_imports_with_static_shapes():
    # before the fold the halves were dynamic_strided_slice of shape R.Tensor(ndim=4)
    mod = load_onnx(shuffle_unit()).mod
    ops, shapes = set(), {}
    for binding in mod["main"].body.blocks[0].bindings:
        if isinstance(binding.value, relax.Call):
            ops.add(binding.value.op.name)
        if isinstance(binding.var.ty, relax.TensorType):
            shape = binding.var.ty.shape
            shapes[binding.var.name] = None if shape is None else [int(d) for d in shape.values]
    assert "relax.strided_slice" in ops and "relax.dynamic_strided_slice" not in ops
    assert None not in shapes.values(), shapes


def test_shuffle_unit_on_cpu_matches_onnxruntime():
    model, x = shuffle_unit(), _input()
    got = build(load_onnx(model).mod, "cpu", model="shuffle_unit")([x])[0]
    np.testing.assert_allclose(got, _onnxruntime(model, x), rtol=RTOL, atol=ATOL)


@pytest.mark.opencl
def test_shuffle_unit_coexecuted_matches_onnxruntime(opencl):
    model, x = shuffle_unit(), _input()
    mod = load_onnx(model).mod
    built = compile_coexec(mod, uniform_plan(mod, "OC", 0.5), model="shuffle_unit")
    assert built.kernel_splits  # the convs really were split between the processors
    np.testing.assert_allclose(built([x])[0], _onnxruntime(model, x), rtol=RTOL, atol=ATOL)
