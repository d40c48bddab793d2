"""PairwiseVariadic: the ONNX frontend's stack-and-reduce Sum/Max/Min become binary ops.

References: numpy on the ONNX semantics, TVM's own build of the unrewritten module (its default
pipeline keeps the stack and the reduction), and ONNX's stored test data of the Sum/Max/Min
operator tests.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest
import tvm
from codl_tvm.passes.variadic import PairwiseVariadic
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import codl_tvm
from codl_tvm.build.runner import build
from codl_tvm.core.plan import model_fingerprint, uniform_plan
from codl_tvm.frontend.importer import load_onnx

_NUMPY = {"Sum": np.add, "Max": np.maximum, "Min": np.minimum}


def _variadic(op: str, shapes: list[list[int]]):
    """x0..xn -> op -> Relu."""
    inputs = [
        helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)
    ]
    nodes = [
        helper.make_node(op, [f"x{i}" for i in range(len(shapes))], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    out = np.broadcast_shapes(*[tuple(s) for s in shapes])
    graph = helper.make_graph(
        nodes, "v", inputs, [helper.make_tensor_value_info("z", TensorProto.FLOAT, out)]
    )
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _residual(seed=0, sum_inputs=2):
    """ResNet's join: x -> Conv(1x1) -> Conv(3x3) -> Sum(conv, x[, x]) -> Relu -> Conv."""
    rng = np.random.default_rng(seed)
    c, hw = 8, 12
    inits = [
        numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype("f4") * 0.3, "W0"),
        numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype("f4") * 0.2, "W1"),
        numpy_helper.from_array(rng.standard_normal(c).astype("f4"), "B1"),
        numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype("f4") * 0.2, "W2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["a"]),
        helper.make_node("Conv", ["a", "W1", "B1"], ["b"], pads=[1] * 4),
        helper.make_node("Sum", ["b"] + ["x"] * (sum_inputs - 1), ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Conv", ["r", "W2"], ["y"], pads=[1] * 4),
    ]
    return _conv_net(nodes, inits, "residual", [1, c, hw, hw])


def _conv_net(nodes, inits, name: str, shape: list[int]):
    """x -> nodes -> y, both of ``shape``, as codl-tvm imports it."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _stacks(mod) -> int:
    return mod.script(show_meta=False).count("R.stack(")


def _tvm_reference(mod, inputs):
    """The unrewritten module through TVM's default pipeline (stack + reduction kept)."""
    ex = tvm.compile(mod, target="llvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy()


@pytest.mark.parametrize(
    ("op", "shapes"),
    [
        ("Sum", [[1, 4, 5, 6], [1, 4, 5, 6]]),
        ("Sum", [[1, 4, 5, 6], [1, 4, 1, 1], [1, 4, 5, 6]]),  # broadcast, three inputs
        ("Sum", [[4, 1, 6], [1, 5, 6]]),  # multidirectional: no input has the output shape
        ("Max", [[2, 3, 4], [2, 3, 4], [2, 1, 4], [2, 3, 1]]),
        ("Min", [[3, 7], [3, 7]]),
    ],
)
def test_rewritten_and_equal_to_numpy(op, shapes):
    model = _variadic(op, shapes)
    assert _stacks(model.mod) == 1
    mod = PairwiseVariadic()(model.mod)
    assert _stacks(model.mod) == 1, "the caller's module must not change"
    text = mod.script(show_meta=False)
    assert _stacks(mod) == 0 and "R.broadcast_to(" not in text
    binary = {"Sum": "R.add(", "Max": "R.maximum(", "Min": "R.minimum("}[op]
    assert text.count(binary) == len(shapes) - 1
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(s).astype("f4") for s in shapes]
    want = np.maximum(_fold(_NUMPY[op], inputs), 0)
    got = build(model.mod, "cpu")(inputs)[0]  # the build runs the pass
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, _tvm_reference(model.mod, inputs), rtol=1e-6, atol=1e-6)


def _fold(fn, xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc


def test_mean_and_shared_copies_are_left_alone():
    """Mean is not a binary fold (it divides); a stack whose copy has another user keeps it."""
    from tvm.script import relax as R

    model = _variadic("Mean", [[2, 3], [2, 3]])
    assert _stacks(PairwiseVariadic()(model.mod)) == 1

    @tvm.script.ir_module
    class Shared:
        @R.function
        def main(a: R.Tensor((2, 3), "float32"), b: R.Tensor((2, 3), "float32")):
            with R.dataflow():
                s = R.stack((a, b), axis=0)
                y = R.sum(s, axis=[0], keepdims=False)
                out = (y, s)
                R.output(out)
            return out

    assert _stacks(PairwiseVariadic()(Shared)) == 1


@functools.cache
def _onnx_cases():
    from onnx.backend.test.case import node

    with warnings.catch_warnings():  # other operators' cases warn while they are generated
        warnings.simplefilter("ignore")
        return node.collect_testcases(None)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_onnx_operator_test_cases(op):
    """ONNX's own Sum/Max/Min operator test cases (their inputs and expected outputs), float32."""
    checked = 0
    for case in _onnx_cases():
        name = case.name
        if not name.startswith(f"test_{op}_") or not name.endswith(
            ("_example", "_two_inputs", "_one_input", "_float32")
        ):
            continue
        graph = case.model.graph
        if any(i.type.tensor_type.elem_type != TensorProto.FLOAT for i in graph.input):
            continue
        inputs, outputs = case.data_sets[0]
        got = build(load_onnx(case.model).mod, "cpu")(list(inputs))[0]
        np.testing.assert_allclose(got, outputs[0], rtol=1e-6, atol=1e-6, err_msg=name)
        checked += 1
    assert checked >= 3, f"{op}: {checked} ONNX test cases checked"


@pytest.mark.parametrize("sum_inputs", [2, 3])
def test_residual_add_fuses_into_the_conv(sum_inputs, tmp_path, monkeypatch):
    """After the rewrite the join is an epilogue: the conv, its bias, the residual add(s) and the
    relu become one kernel, and the build equals TVM's build of the unrewritten module."""
    model = _residual(sum_inputs=sum_inputs)
    x = np.random.default_rng(3).standard_normal(model.inputs[0].shape).astype("f4")
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    got = build(model.mod, "cpu")([x])[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    np.testing.assert_allclose(got, _tvm_reference(model.mod, [x]), rtol=1e-5, atol=1e-5)
    legalized = next(tmp_path.glob("*-legalize.py")).read_text()
    assert "stack" not in legalized
    kernels = set(re.findall(r"^    def (\w+)\(", legalized, flags=re.M)) - {"main"}
    fused = [k for k in kernels if "conv2d" in k and "relu" in k and k.count("add") == sum_inputs]
    assert fused, sorted(kernels)


@pytest.mark.parametrize(("dim", "ratio"), [("H", 0.5), ("OC", 0.25)])
def test_plans_of_the_imported_model_apply(opencl, dim, ratio):
    """Plans name partitionable operators only: the fingerprint is unchanged, and a co-executed
    build (the residual add absorbed into the split conv) equals TVM's unrewritten build."""
    model = _residual(seed=5)
    assert model_fingerprint(PairwiseVariadic()(model.mod)) == model_fingerprint(model.mod)
    plan = uniform_plan(model.mod, dim, ratio)
    assert len(plan.ops) == 3
    x = np.random.default_rng(6).standard_normal(model.inputs[0].shape).astype("f4")
    got = codl_tvm.compile(model.mod, plan)([x])[0]
    np.testing.assert_allclose(got, _tvm_reference(model.mod, [x]), rtol=1e-5, atol=1e-5)


def _projection(seed=0, op="Sum"):
    """ResNet's projection block: the join adds two conv outputs, each used only there."""
    rng = np.random.default_rng(seed)
    c, hw = 8, 10

    def weight(name, oc, ic, k):
        return numpy_helper.from_array(
            (rng.standard_normal((oc, ic, k, k)) * 0.3).astype("f4"), name
        )

    inits = [weight("Ws", 16, c, 1), weight("Wa", c, c, 1), weight("Wb", 16, c, 3)]
    inits.append(weight("Wo", c, 16, 3))
    nodes = [
        helper.make_node("Conv", ["x", "Ws"], ["s"]),  # imported after the branch: conv2d_2
        helper.make_node("Conv", ["x", "Wa"], ["a"]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "Wb"], ["b"], pads=[1] * 4),
        helper.make_node(op, ["b", "s"], ["j"]),
        helper.make_node("Relu", ["j"], ["r"]),
        helper.make_node("Conv", ["r", "Wo"], ["y"], pads=[1] * 4),
    ]
    return _conv_net(nodes, inits, "projection", [1, c, hw, hw])


@pytest.mark.parametrize("op", ["Sum", "Add"])
@pytest.mark.parametrize(("dim", "ratio"), [("OC", 0.5), ("H", 0.4)])
def test_join_of_two_split_convs(opencl, op, dim, ratio):
    """Both operands of the residual add come from split convs that use them nowhere else: the
    add belongs to the later one (which reads the earlier one's merged output), and the
    co-executed build equals TVM's unrewritten build (it failed with both claiming the add)."""
    model = _projection(seed=2, op=op)
    plan = uniform_plan(model.mod, dim, ratio)
    assert len(plan.ops) == 4
    x = np.random.default_rng(8).standard_normal(model.inputs[0].shape).astype("f4")
    got = codl_tvm.compile(model.mod, plan)([x])[0]
    np.testing.assert_allclose(got, _tvm_reference(model.mod, [x]), rtol=1e-5, atol=1e-5)


def test_join_stays_with_the_chain_that_continues_past_it(opencl):
    """The branch's chain (conv2d_0, conv2d_1, on through the join into conv2d_3) keeps the add
    although the shortcut's split (conv2d_2) starts later: that one ends before the join and
    hands over its merged output."""
    from codl_tvm.passes import collect_parts
    from codl_tvm.passes.partition import PartitionOperators

    from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan

    model = _projection(seed=4)
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_2", "H", 0.5),),
        chains=(ChainPlan(("conv2d_0", "conv2d_1", "conv2d_3"), "H", 0.5),),
    )
    split = PartitionOperators(plan)(PairwiseVariadic()(model.mod))
    records = {r.ops: r for r in collect_parts(split)}
    branch = records[("conv2d_0", "conv2d_1", "conv2d_3")]
    assert any(v.name.endswith("add") for p in branch.parts for v in p.bindings)
    shortcut = records[("conv2d_2",)]
    assert not any(v.name.endswith("add") for p in shortcut.parts for v in p.bindings)
    x = np.random.default_rng(9).standard_normal(model.inputs[0].shape).astype("f4")
    got = codl_tvm.compile(model.mod, plan)([x])[0]
    np.testing.assert_allclose(got, _tvm_reference(model.mod, [x]), rtol=1e-5, atol=1e-5)
