"""Partitioning an ONNX model imported with TVM's frontend; fp32, rtol=atol=1e-5 (TVM vs TVM).

The unpartitioned build is itself checked against onnxruntime (rtol=atol=1e-4).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from codl_tvm.passes import PartitionOperators, collect_parts
from onnx import TensorProto, helper, numpy_helper
from tvm.relax.frontend.onnx import from_onnx

from codl_tvm.core.plan import ChainPlan, PartitionPlan, partitionable_ops, uniform_plan
from tests.test_passes_split import check, check_records, run


def _small_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node(
            "Conv",
            ["p1", "w2", "b2"],
            ["c2"],
            pads=[1, 1, 1, 1],
            kernel_shape=[3, 3],
            strides=[2, 2],
        ),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    inits = [
        init("w1", (6, 3, 3, 3)),
        init("b1", (6,)),
        init("g", (6,)),
        init("beta", (6,)),
        init("mean", (6,)),
        numpy_helper.from_array(np.abs(rng.standard_normal(6)).astype("float32") + 0.5, "var"),
        init("w2", (8, 6, 3, 3)),
        init("b2", (8,)),
        init("wg", (10, 8 * 3 * 3)),
        init("bg", (10,)),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def imported():
    model = _small_cnn()
    mod = from_onnx(model)
    x = np.random.default_rng(3).standard_normal((1, 3, 12, 12)).astype("float32")
    ref = run(mod, x)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ref, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    return mod, x, ref


def test_onnx_operator_names(imported):
    mod, _, _ = imported
    assert [i.name for i in partitionable_ops(mod)] == [
        "conv2d_0",
        "max_pool2d_1",
        "conv2d_2",
        "matmul_3",
    ]


@pytest.mark.parametrize("dim", ["H", "OC"])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 1.0])
def test_onnx_uniform_plans(imported, dim, ratio):
    mod, x, ref = imported
    plan = uniform_plan(mod, dim, ratio)
    part = check(mod, plan, x, reference=ref)
    records = check_records(part, None)
    assert len(records) == (3 if dim == "H" else 4)


def test_onnx_chain_plan(imported):
    mod, x, ref = imported
    plan = PartitionPlan(chains=(ChainPlan(("conv2d_0", "max_pool2d_1", "conv2d_2"), "H", 0.5),))
    part = check(mod, plan, x, reference=ref)
    (rec,) = collect_parts(part)
    assert len(rec.parts) == 2
    # the bias add, batch_norm and relu after each conv live in the parts
    kinds = [v.name.split("_", 3)[-1] for v in rec.parts[0].bindings]
    assert kinds == [
        "in",
        "conv2d",
        "add",
        "batch_norm",
        "getitem",
        "relu",
        "max_pool2d",
        "conv2d",
        "add",
        "relu",
    ]


def test_onnx_plan_file_round_trip(imported, tmp_path):
    mod, x, ref = imported
    path = tmp_path / "plan.json"
    uniform_plan(mod, "OC", 0.5).save(path)
    part = PartitionOperators(PartitionPlan.load(path))(mod)
    np.testing.assert_allclose(run(part, x), ref, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def squeezenet():
    from tests.onnx_data import light_model

    mod = from_onnx(light_model("squeezenet"))
    shape = tuple(int(v) for v in mod["main"].params[0].ty.shape.values)
    x = np.random.default_rng(0).random(shape).astype("float32")
    return mod, x, run(mod, x)


@pytest.mark.slow
@pytest.mark.parametrize("dim,ratio", [("H", 0.3), ("OC", 0.5)])
def test_light_squeezenet_uniform_plans(squeezenet, dim, ratio):
    """A real model (Fire modules: concat of split convs); ~20 s here, hence slow."""
    mod, x, ref = squeezenet
    part = check(mod, uniform_plan(mod, dim, ratio), x, reference=ref)
    assert len(collect_parts(part)) == len(
        [i for i in partitionable_ops(mod) if dim in [d.value for d in i.dims]]
    )
