"""LRNWindowSum: LRN's channel-window average pool becomes shifted adds.

References: onnxruntime, numpy on the ONNX definition of LRN, and TVM's own build of the
unrewritten module (its default pipeline keeps the 3-D pool). ``onnx.reference``'s LRN is not
one: it loops over the batch axis where the definition loops over channels (onnx 1.x).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from codl_tvm.passes.lrn import LRNWindowSum
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import codl_tvm
from codl_tvm.build.runner import build
from codl_tvm.core.plan import model_fingerprint, uniform_plan
from codl_tvm.frontend.importer import load_onnx


def _lrn_net(size: int = 5, channels: int = 12, hw: int = 9, seed: int = 0, **attrs):
    """x -> Conv(3x3) -> Relu -> LRN -> Conv(1x1): the LRN between two partitionable convs,
    as in Inception v1 and AlexNet."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype("f4"), "W0"),
        numpy_helper.from_array(
            (rng.standard_normal((8, channels, 1, 1)) * 0.3).astype("f4"), "W1"
        ),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W0"], ["a"], pads=[1] * 4),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("LRN", ["r"], ["n"], size=size, **attrs),
        helper.make_node("Conv", ["n", "W1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "lrn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, hw, hw])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return proto, load_onnx(proto)


def _reference(proto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _lrn_numpy(x: np.ndarray, size: int, alpha=1e-4, beta=0.75, bias=1.0) -> np.ndarray:
    """ONNX's LRN: the sum of squares over channels c - (size-1)//2 .. c + ceil((size-1)/2)."""
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (lo, hi), (0, 0), (0, 0)))
    window = sum(sq[:, k : k + x.shape[1]] for k in range(size))
    return (x / (bias + alpha / size * window) ** beta).astype(x.dtype)


def _tvm_reference(mod, inputs):
    """TVM's default pipeline on the unrewritten module (the 3-D pool kept), on the host CPU."""
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _ops(mod) -> list[str]:
    return re.findall(r"R\.(nn\.\w+|\w+)\(", mod.script())


@pytest.mark.parametrize(
    ("size", "attrs"),
    [(5, {}), (3, {"alpha": 0.02, "beta": 0.5, "bias": 2.0}), (1, {"alpha": 0.5})],
)
def test_rewritten_and_equal_to_the_onnx_reference(size, attrs):
    proto, model = _lrn_net(size=size, **attrs)
    rewritten = LRNWindowSum()(model.mod)
    assert "nn.avg_pool3d" in _ops(model.mod) and "nn.avg_pool3d" not in _ops(rewritten)
    assert "expand_dims" not in _ops(rewritten)
    assert _ops(rewritten).count("strided_slice") == (size if size > 1 else 0)
    x = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype("f4")
    got = build(model.mod, "cpu")([x])[0]  # the build runs the pass
    np.testing.assert_allclose(got, _reference(proto, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _tvm_reference(model.mod, [x]), rtol=1e-5, atol=1e-6)
    # the LRN alone against numpy on the definition
    lrn_only = helper.make_graph(
        [helper.make_node("LRN", ["x"], ["y"], size=size, **attrs)],
        "lrn_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 5, 5])],
    )
    mod = load_onnx(helper.make_model(lrn_only, opset_imports=[helper.make_opsetid("", 13)])).mod
    v = np.random.default_rng(2).standard_normal((1, 7, 5, 5)).astype("f4") * 3
    got = build(mod, "cpu")([v])[0]
    np.testing.assert_allclose(got, _lrn_numpy(v, size, **attrs), rtol=1e-5, atol=1e-6)


@pytest.mark.opencl
def test_opencl_build_fuses_the_lrn_into_one_kernel(opencl, tmp_path, monkeypatch):
    """On the GPU the square, the window sum and the elementwise tail are one kernel (the 3-D
    pool ran serially on OpenCL), and the output equals the ONNX reference."""
    proto, model = _lrn_net(channels=16, hw=11, seed=2)
    x = np.random.default_rng(3).standard_normal((1, 3, 11, 11)).astype("f4")
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    got = build(model.mod, "opencl")([x])[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    np.testing.assert_allclose(got, _reference(proto, x), rtol=1e-5, atol=1e-5)
    legalized = next(tmp_path.glob("*-legalize.py")).read_text()
    kernels = set(re.findall(r"^    def (\w+)\(", legalized, flags=re.M)) - {"main"}
    assert not any("pool" in k for k in kernels), sorted(kernels)
    lrn = [k for k in kernels if "strided_slice" in k]
    assert len(lrn) == 1 and "power" in lrn[0] and "pad" in lrn[0], sorted(kernels)


def test_other_3d_pools_and_shared_pools_are_left_alone():
    """Only the frontend's LRN form is rewritten: a pool over more than the channel axis, or a
    pool whose output has another user, stays."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 6, 6], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.expand_dims(x, axis=[1]))
            p = bb.emit(
                relax.op.nn.avg_pool3d(
                    e, pool_size=[3, 3, 1], padding=[1, 1, 0, 1, 1, 0], count_include_pad=True
                )
            )
            q = bb.emit(relax.op.squeeze(p, axis=[1]))
            e2 = bb.emit(relax.op.expand_dims(x, axis=[1]))
            p2 = bb.emit(
                relax.op.nn.avg_pool3d(
                    e2, pool_size=[3, 1, 1], padding=[1, 0, 0, 1, 0, 0], count_include_pad=True
                )
            )
            q2 = bb.emit(relax.op.squeeze(p2, axis=[1]))
            out = bb.emit_output(relax.Tuple([q, q2, p2]))  # p2 used beside its squeeze
        bb.emit_func_output(out)
    mod = bb.get()
    assert LRNWindowSum()(mod).same_as(mod)  # rewrite_functions returns it unchanged


@pytest.mark.opencl
@pytest.mark.parametrize(("dim", "ratio"), [("H", 0.5), ("OC", 0.25)])
def test_plans_of_the_imported_model_apply(opencl, dim, ratio):
    """The LRN is no partitionable operator: the fingerprint is unchanged, and a co-executed
    build of the two split convs around it equals the ONNX reference."""
    proto, model = _lrn_net(seed=4)
    assert model_fingerprint(LRNWindowSum()(model.mod)) == model_fingerprint(model.mod)
    plan = uniform_plan(model.mod, dim, ratio)
    assert len(plan.ops) == 2
    x = np.random.default_rng(5).standard_normal((1, 3, 9, 9)).astype("f4")
    got = codl_tvm.compile(model.mod, plan)([x])[0]
    np.testing.assert_allclose(got, _reference(proto, x), rtol=1e-5, atol=1e-5)


def _split_names(mod, plan, **kw) -> list[str]:
    from codl_tvm.passes import PartitionOperators, collect_parts

    return [s.name for s in collect_parts(PartitionOperators(plan, **kw)(LRNWindowSum()(mod)))]


@pytest.mark.opencl
@pytest.mark.parametrize("ratio", [0.5, 0.3])
def test_lrn_after_an_h_split_is_split_by_rows(opencl, ratio):
    """The LRN reads the split conv's output twice (its square and the final division), so no
    follower takes it; ``row_blocks`` splits it by rows at the conv's ratio, and the
    co-executed build still equals onnxruntime's output."""
    from codl_tvm.passes import PartitionOperators, collect_parts

    from codl_tvm.core.plan import OpPartition, PartitionPlan

    proto, model = _lrn_net(seed=6)
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "H", ratio),))
    parts = collect_parts(PartitionOperators(plan, row_blocks=True)(LRNWindowSum()(model.mod)))
    block = next(s for s in parts if s.name == "conv2d_0+rows")
    conv = next(s for s in parts if s.name == "conv2d_0")
    assert block.dim == "H" and block.ratio == ratio
    # each processor computes the LRN on the rows its conv part produced
    assert [p.region for p in block.parts] == [p.region for p in conv.parts]
    assert sorted(p.processor for p in block.parts) == ["cpu", "gpu"]
    x = np.random.default_rng(7).standard_normal((1, 3, 9, 9)).astype("f4")
    built = codl_tvm.compile(model.mod, plan, row_blocks=True)
    assert {c[1] for c in built.kernel_splits["calls"]} >= {"conv2d_0", "conv2d_0+rows"}
    got = built([x])[0]
    np.testing.assert_allclose(got, _reference(proto, x), rtol=1e-5, atol=1e-5)


def test_row_blocks_only_follow_h_splits():
    from codl_tvm.core.plan import OpPartition, PartitionPlan

    _, model = _lrn_net(seed=6)
    h = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5),))
    rows = {"row_blocks": True}
    assert _split_names(model.mod, h, **rows) == ["conv2d_0", "conv2d_0+rows"]
    # off by default (AlexNet at k = 12 measured slower with it)
    assert _split_names(model.mod, h) == ["conv2d_0"]
    oc = PartitionPlan(ops=(OpPartition("conv2d_0", "OC", 0.5),))
    assert _split_names(model.mod, oc, **rows) == ["conv2d_0"]
    whole = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 1.0),))
    assert _split_names(model.mod, whole, **rows) == ["conv2d_0"]
    # the next conv split too: the block sits between two splits and reads only the first
    both = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5), OpPartition("conv2d_1", "H", 0.5)))
    assert _split_names(model.mod, both, **rows) == ["conv2d_0", "conv2d_0+rows", "conv2d_1"]


def test_a_plan_adopted_by_verify_reports_the_builds_row_blocks():
    """The placement a compile writes for a plan (also the one ``verify`` adopts) splits row
    blocks as the build does: the ``+rows`` split with ``split_row_blocks``, not otherwise;
    the adopted plan's record names the mode measured fastest."""
    from codl_tvm.build.coexec import placement_report
    from codl_tvm.core.plan import OpPartition, PartitionPlan
    from codl_tvm.objectives.latency import adopt_plan_record

    _, model = _lrn_net(seed=6)
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5),))
    for rows, want in ((True, [["conv2d_0"], ["conv2d_0+rows"]]), (False, [["conv2d_0"]])):
        placement = placement_report(model.mod, plan, True, rows)
        assert [p["ops"] for p in placement] == want
    record = {"mode": "codl"}
    adopt_plan_record(record, None, "h_only")
    assert record["mode"] == "h_only" and record["chosen_by_verify"]
