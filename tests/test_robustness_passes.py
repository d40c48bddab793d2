"""Split passes and model import on models nobody tuned for: weights computed by the graph,
unusual input types, zero-sized and 0-d tensors, odd split geometry.

Numerics are checked against onnxruntime (ONNX models) or the unsplit build. Co-executed
builds here place both parts on the CPU (``coexec_pipeline(plan, cpu, cpu)`` run in a VM over
``[cpu, cpu]``): the pipeline, placement and synchronisation are the real ones, only the
kernels of the "GPU" side are compiled with LLVM, which keeps the tests fast and deviceless.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from codl_tvm.passes import PartitionOperators, collect_parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator
from tvm import relax

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.pipeline import coexec_pipeline
from codl_tvm.build.runner import build
from codl_tvm.cli import main
from codl_tvm.core.errors import CodlError, ModelError
from codl_tvm.core.plan import (
    OpPartition,
    PartitionDim,
    PartitionPlan,
    PlanError,
    partitionable_ops,
    uniform_plan,
)
from codl_tvm.cost_model.synthetic import synthetic_cost_model
from codl_tvm.frontend.importer import check_inputs, load_onnx
from codl_tvm.frontend.rewrites import rewrite_for_import
from codl_tvm.planner import plan_model

ort = pytest.importorskip("onnxruntime")

CPU = tvm.target.Target({"kind": "llvm"})
RTOL = ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def _runtime():
    # the co-execution builtins (codl.coexec.*) live in the runtime plugin
    from codl_tvm import runtime

    runtime.load()


def _model(nodes, inputs, output, initializers=(), opset=13) -> onnx.ModelProto:
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [oh.make_tensor_value_info(output[0], output[1], output[2])],
        initializer=list(initializers),
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(arr, name)


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _coexec_on_cpu(mod, plan: PartitionPlan, args: list[np.ndarray]) -> np.ndarray:
    ex = tvm.compile(mod, target=CPU, relax_pipeline=coexec_pipeline(plan, CPU, CPU))
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(0)])
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


def _check_split(model: onnx.ModelProto, feeds: dict, dim: str, ratio: float = 0.5) -> None:
    """Split every operator of ``model`` along ``dim``; equal to onnxruntime, two parts each."""
    loaded = load_onnx(model)
    plan = uniform_plan(loaded.mod, dim, ratio)
    assert plan.ops, "nothing to split: the test would prove nothing"
    records = collect_parts(PartitionOperators(plan)(loaded.mod))
    assert all(len(r.parts) == 2 for r in records)
    got = _coexec_on_cpu(loaded.mod, plan, [feeds[s.name] for s in loaded.inputs])
    np.testing.assert_allclose(got, _onnxruntime(model, feeds)[0], rtol=RTOL, atol=ATOL)


def _rand(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


# -- weights computed by the graph -----------------------------------------------------------

X = ("x", TensorProto.FLOAT, [1, 3, 8, 8])
Y = ("y", TensorProto.FLOAT, [1, 8, 8, 8])


def _constant_of_shape_conv() -> onnx.ModelProto:
    """ConstantOfShape -> Conv's weight input (as in onnx's light models)."""
    fill = oh.make_tensor("v", TensorProto.FLOAT, [1], [0.1])
    nodes = [
        oh.make_node("ConstantOfShape", ["shp"], ["w"], value=fill),
        oh.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    ]
    shp = _init("shp", np.array([8, 3, 3, 3], "int64"))
    return _model(nodes, [X], Y, [shp])


def _scaled_weight_conv(scale_is_input: bool) -> onnx.ModelProto:
    """Conv whose weight is an initializer times a scalar: a Constant node (folded at compile
    time) or a graph input (computed at run time)."""
    nodes = [oh.make_node("Mul", ["w0", "s"], ["w"]), oh.make_node("Conv", ["x", "w", "b"], ["y"])]
    inits = [_init("w0", _rand((8, 3, 3, 3), 1)), _init("b", _rand((8,), 2))]
    inputs = [X]
    if scale_is_input:
        inputs.append(("s", TensorProto.FLOAT, [1]))
    else:
        scale = oh.make_tensor("sv", TensorProto.FLOAT, [], [0.5])
        nodes.insert(0, oh.make_node("Constant", [], ["s"], value=scale))
    conv = nodes[-1]
    conv.attribute.extend([oh.make_attribute("pads", [1, 1, 1, 1])])
    return _model(nodes, inputs, Y, inits)


@pytest.mark.parametrize("dim", ["OC", "H"])
def test_conv_with_constant_of_shape_weight_splits(dim):
    _check_split(_constant_of_shape_conv(), {"x": _rand((1, 3, 8, 8))}, dim)


@pytest.mark.parametrize("dim", ["OC", "H"])
@pytest.mark.parametrize("scale_is_input", [False, True], ids=["constant", "graph-input"])
def test_conv_with_scaled_weight_splits(dim, scale_is_input):
    feeds = {"x": _rand((1, 3, 8, 8))}
    if scale_is_input:
        feeds["s"] = np.array([0.75], "float32")
    _check_split(_scaled_weight_conv(scale_is_input), feeds, dim)


def test_gemm_with_constant_of_shape_weight_splits_on_oc():
    fill = oh.make_tensor("v", TensorProto.FLOAT, [1], [0.25])
    nodes = [
        oh.make_node("ConstantOfShape", ["shp"], ["w"], value=fill),
        oh.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1),
    ]
    inits = [_init("shp", np.array([32, 16], "int64")), _init("b", _rand((32,), 3))]
    model = _model(
        nodes, [("x", TensorProto.FLOAT, [2, 16])], ("y", TensorProto.FLOAT, [2, 32]), inits
    )
    _check_split(model, {"x": _rand((2, 16))}, "OC")


@pytest.mark.parametrize("scale_is_input", [False, True], ids=["constant", "graph-input"])
def test_matmul_with_computed_weight_splits_on_oc(scale_is_input):
    nodes = [oh.make_node("Mul", ["w0", "s"], ["w"]), oh.make_node("MatMul", ["x", "w"], ["y"])]
    inputs = [("x", TensorProto.FLOAT, [2, 16])]
    feeds = {"x": _rand((2, 16))}
    if scale_is_input:
        inputs.append(("s", TensorProto.FLOAT, [1]))
        feeds["s"] = np.array([1.5], "float32")
    else:
        scale = oh.make_tensor("sv", TensorProto.FLOAT, [], [1.5])
        nodes.insert(0, oh.make_node("Constant", [], ["s"], value=scale))
    model = _model(nodes, inputs, ("y", TensorProto.FLOAT, [2, 32]), [_init("w0", _rand((16, 32)))])
    _check_split(model, feeds, "OC")


def test_folded_weight_slices_are_recorded_as_foldable():
    # The slices of a compile-time computable weight may disappear in FoldConstant; the record
    # says so, and the module after FoldConstant still resolves (the crash of PlaceParts).
    loaded = load_onnx(_constant_of_shape_conv())
    plan = uniform_plan(loaded.mod, "OC", 0.5)
    part = PartitionOperators(plan)(loaded.mod)
    with CPU:
        folded = tvm.transform.Sequential(
            [
                relax.transform.LegalizeOps(),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(),
            ]
        )(part)
    (rec,) = collect_parts(folded)
    names = [[v.name for v in p.bindings] for p in rec.parts]
    assert names == [["codl0_gpu_0_conv2d"], ["codl0_cpu_0_conv2d"]]


@pytest.mark.opencl
def test_cli_runs_oc_split_of_computed_weight(opencl, tmp_path, capsys):
    model = _constant_of_shape_conv()
    onnx.save(model, tmp_path / "m.onnx")
    x = _rand((1, 3, 8, 8), 4)
    np.savez(tmp_path / "in.npz", x=x)
    argv = ["run", str(tmp_path / "m.onnx"), "--device", "coexec", "--dim", "OC", "--ratio", "0.5"]
    argv += ["--inputs", str(tmp_path / "in.npz"), "--save-outputs", str(tmp_path / "out.npz")]
    argv += ["--repeat", "1", "--number", "1"]
    code = main(argv)
    _, err = capsys.readouterr()
    assert code == 0, err
    got = np.load(tmp_path / "out.npz")["y"]
    np.testing.assert_allclose(got, _onnxruntime(model, {"x": x})[0], rtol=RTOL, atol=ATOL)


# -- model import: input types, zero-sized and 0-d tensors -----------------------------------


def _cpu_build(loaded):
    return build(loaded.mod, "cpu", target=CPU)


@pytest.mark.parametrize("dtype", ["int16", "uint16", "uint32", "uint64"])
def test_integer_inputs_tvm_imports_are_accepted(dtype):
    elem = oh.np_dtype_to_tensor_dtype(np.dtype(dtype))
    c = np.arange(6, dtype=dtype).reshape(2, 3)
    model = _model(
        [oh.make_node("Add", ["x", "c"], ["y"])],
        [("x", elem, [2, 3])],
        ("y", elem, [2, 3]),
        [_init("c", c)],
    )
    loaded = load_onnx(model)
    assert loaded.inputs[0].dtype == dtype
    x = np.random.default_rng(0).integers(0, 100, (2, 3)).astype(dtype)
    (got,) = _cpu_build(loaded)([x])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, x + c)


def test_unsupported_input_type_names_it():
    model = _model(
        [oh.make_node("Identity", ["x"], ["y"])],
        [("x", TensorProto.BFLOAT16, [2])],
        ("y", TensorProto.BFLOAT16, [2]),
    )
    with pytest.raises(
        ModelError, match=r"input 'x' has unsupported ONNX element type 16 \(BFLOAT16\)"
    ):
        load_onnx(model)


def test_zero_sized_dimension_is_reported_as_such():
    model = _model(
        [oh.make_node("Identity", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 0, 3])],
        ("y", TensorProto.FLOAT, [2, 0, 3]),
    )
    with pytest.raises(
        ModelError, match=r"input 'x' has a zero-sized dimension \(shape \[2, 0, 3\]\)"
    ):
        load_onnx(model)


def _gemm_scalar_bias() -> onnx.ModelProto:
    """Gemm whose bias C is a 0-d graph input (as in ONNX's node tests)."""
    return _model(
        [oh.make_node("Gemm", ["x", "w", "c"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 16]), ("c", TensorProto.FLOAT, [])],
        ("y", TensorProto.FLOAT, [2, 32]),
        [_init("w", _rand((16, 32), 5))],
    )


def _scalar_feeds():
    return {"x": _rand((2, 16), 6), "c": np.array(0.5, "float32")}


def test_scalar_input_stays_0d_in_check_inputs_and_time_vm():
    model = _gemm_scalar_bias()
    loaded = load_onnx(model)
    feeds = _scalar_feeds()
    args = check_inputs(loaded, feeds, "feeds")
    assert args[1].shape == ()
    built = _cpu_build(loaded)
    np.testing.assert_allclose(built(args)[0], _onnxruntime(model, feeds)[0], rtol=RTOL, atol=ATOL)
    assert built.time(args, number=1, repeat=1).repeats == 1


@pytest.mark.opencl
def test_scalar_input_stays_0d_in_coexec_module(opencl):
    model = _gemm_scalar_bias()
    loaded = load_onnx(model)
    feeds = _scalar_feeds()
    built = compile_coexec(loaded.mod, uniform_plan(loaded.mod, "OC", 0.5))
    args = [feeds["x"], feeds["c"]]
    np.testing.assert_allclose(built(args)[0], _onnxruntime(model, feeds)[0], rtol=RTOL, atol=ATOL)
    assert built.time(args, number=1, repeat=1).repeats == 1


@pytest.mark.opencl
def test_scalar_input_through_a_compiled_artifact(opencl, tmp_path, capsys):
    model = _gemm_scalar_bias()
    onnx.save(model, tmp_path / "g.onnx")
    feeds = _scalar_feeds()
    np.savez(tmp_path / "in.npz", **feeds)
    art, out = str(tmp_path / "art"), str(tmp_path / "out.npz")
    assert main(["compile", str(tmp_path / "g.onnx"), "-o", art]) == 0, capsys.readouterr().err
    code = main(["run", art, "--inputs", str(tmp_path / "in.npz"), "--save-outputs", out])
    assert code == 0, capsys.readouterr().err
    expected = _onnxruntime(model, feeds)[0]
    np.testing.assert_allclose(np.load(out)["y"], expected, rtol=RTOL, atol=ATOL)


# -- matmul whose input has fewer axes than its output ---------------------------------------


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "y_shape"),
    [((4,), (2, 4, 8), (2, 8)), ((3, 4), (2, 4, 8), (2, 3, 8)), ((16,), (16, 32), (32,))],
)
def test_matmul_input_of_lower_rank_is_declined_with_a_reason(x_shape, w_shape, y_shape):

    model = _model(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, list(x_shape))],
        ("y", TensorProto.FLOAT, list(y_shape)),
        [_init("w", _rand(w_shape, 7))],
    )
    mod = load_onnx(model).mod
    (info,) = partitionable_ops(mod)
    assert info.dims == () and "same rank" in info.reason
    assert uniform_plan(mod, "OC", 0.5).ops == ()
    with pytest.raises(PlanError, match="cannot be split along OC: matmul with a"):
        PartitionPlan(ops=(OpPartition(info.name, PartitionDim.OC, 0.5),)).validate(mod)
    # the planner never proposes the split either, and says why
    plan, report = plan_model(mod, synthetic_cost_model(), mode="ulayer_like")
    assert all(e.ratio in (0.0, 1.0) for e in plan.entries())
    (decision,) = report.decisions
    assert "same rank" in decision.reason
    # the model still builds and runs whole
    x = _rand(x_shape, 8)
    got = _coexec_on_cpu(mod, uniform_plan(mod, "OC", 0.5), [x])
    np.testing.assert_allclose(got, _onnxruntime(model, {"x": x})[0], rtol=RTOL, atol=ATOL)


# -- SpaceToDepth / DepthToSpace modes -------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "mode", "blocksize", "shape"),
    [
        ("SpaceToDepth", None, 2, (2, 2, 6, 6)),
        ("SpaceToDepth", "DCR", 2, (1, 2, 4, 6)),
        ("SpaceToDepth", "CRD", 2, (1, 2, 4, 6)),
        ("SpaceToDepth", "CRD", 3, (1, 3, 6, 9)),
        ("DepthToSpace", None, 2, (1, 8, 2, 3)),
        ("DepthToSpace", "DCR", 2, (1, 8, 2, 3)),
        ("DepthToSpace", "CRD", 2, (1, 8, 2, 3)),
        ("DepthToSpace", "CRD", 3, (1, 18, 2, 2)),
    ],
)
def test_space_depth_modes_match_onnx_reference(op, mode, blocksize, shape):
    b, c, h, w = shape
    if op == "SpaceToDepth":
        out = [b, c * blocksize**2, h // blocksize, w // blocksize]
    else:
        out = [b, c // blocksize**2, h * blocksize, w * blocksize]
    attrs = {"blocksize": blocksize} | ({"mode": mode} if mode else {})
    model = _model(
        [oh.make_node(op, ["x"], ["mid"], **attrs), oh.make_node("Relu", ["mid"], ["y"])],
        [("x", TensorProto.FLOAT, list(shape))],
        ("y", TensorProto.FLOAT, out),
        opset=28,
    )
    x = _rand(shape, 9)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _cpu_build(load_onnx(model))([x])
    np.testing.assert_array_equal(got, expected)


def test_space_to_depth_crd_of_unknown_shape_is_refused():
    # an input of unknown rank: no static shape to write the CRD order out with
    node = oh.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, mode="CRD", name="s2d")
    graph = oh.make_graph(
        [oh.make_node("Identity", ["a"], ["x"]), node],
        "g",
        [oh.make_tensor_value_info("a", TensorProto.FLOAT, [1, 2, 4, 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 28)])

    shapeless = onnx.ModelProto()
    shapeless.CopyFrom(model)
    shapeless.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ModelError, match=r"node 's2d' \(SpaceToDepth, mode=CRD\): the shape"):
        rewrite_for_import(shapeless, "m.onnx")
    # the rewrite never changes the caller's model
    before = model.SerializeToString()
    rewrite_for_import(model, "m.onnx")
    assert model.SerializeToString() == before


# -- property: one conv split on H or OC through the whole co-execution pipeline -------------


@st.composite
def _conv_cases(draw):
    """A conv (with bias and relu) of odd geometry, a dimension and a GPU share."""
    k = draw(st.sampled_from([1, 2, 3, 5]))
    dil = draw(st.integers(1, 2))
    eff = dil * (k - 1) + 1
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, eff - 1)) for _ in range(4)]
    if draw(st.booleans()):
        ic = draw(st.integers(1, 6))
        groups, oc = ic, ic * draw(st.integers(1, 3))  # depthwise (with a multiplier)
    else:
        groups = draw(st.sampled_from([1, 2, 3]))
        ic = groups * draw(st.integers(1, 3))
        oc = groups * draw(st.integers(1, 7))  # odd counts, not multiples of a vector width
    # as few rows as give one output row: H is often smaller than the halo
    h_min = max(eff - pads[0] - pads[2], 1)
    w_min = max(eff - pads[1] - pads[3], 1)
    h = draw(st.integers(h_min, h_min + 12))
    w = draw(st.integers(w_min, w_min + 4))
    dim = draw(st.sampled_from(["H", "OC"]))
    ratio = draw(st.floats(0.2, 0.8))
    return ic, oc, k, stride, pads, dil, groups, h, w, dim, ratio


def _conv_module(ic, oc, k, stride, pads, dil, groups, h, w):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, ic, h, w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            weight = relax.const(_rand((oc, ic // groups, k, k), 1))
            bias = relax.const(_rand((1, oc, 1, 1), 2))
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, weight, strides=stride, padding=pads, dilation=dil, groups=groups
                )
            )
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, bias)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conv_cases())
def test_property_conv_split_equals_unsplit_build_or_is_declined(case):
    *geometry, dim, ratio = case
    mod = _conv_module(*geometry)
    x = _rand((1, geometry[0], geometry[7], geometry[8]), 3)
    reference = build(mod, "cpu", target=CPU)([x])[0]
    plan = uniform_plan(mod, dim, ratio)
    assert plan.ops, "a plain NCHW conv is splittable along H and OC"
    try:
        got = _coexec_on_cpu(mod, plan, [x])
    except CodlError as exc:  # declined: it must say why
        assert str(exc).strip()
        return
    np.testing.assert_allclose(got, reference, rtol=RTOL, atol=ATOL)
