"""Co-execution on the local OpenCL device + CPU, against the unpartitioned model.

Tolerance: fp32, |coexec - reference| <= 1e-4 * max(1, max|reference|) (different kernels and
summation orders on the two processors; a wrong row or channel is off by O(1)).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import codl_tvm
from codl_tvm.build.runner import build
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan, uniform_plan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.runtime import sync

pytestmark = pytest.mark.opencl


def _close(got, want):
    tol = 1e-4 * max(1.0, float(np.max(np.abs(want))))
    assert got.shape == want.shape
    err = float(np.max(np.abs(got - want)))
    assert err <= tol, f"max abs error {err} > {tol}"


def _conv_model(c_in, c_out, hw, k, stride=1, pad=None, dilation=1, group=1, pool=None, seed=0):
    rng = np.random.default_rng(seed)
    pad = (k // 2) * dilation if pad is None else pad
    w = rng.standard_normal((c_out, c_in // group, k, k)).astype("float32") * 0.3
    b = rng.standard_normal(c_out).astype("float32") * 0.1
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[dilation, dilation],
            group=group,
        ),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    out = "y"
    if pool == "max":
        nodes.append(
            helper.make_node(
                "MaxPool", ["y"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
            )
        )
        out = "p"
    elif pool == "avg":
        nodes.append(
            helper.make_node(
                "AveragePool",
                ["y"],
                ["p"],
                kernel_shape=[3, 3],
                strides=[1, 1],
                pads=[1, 1, 1, 1],
                count_include_pad=1,
            )
        )
        out = "p"
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    return load_onnx(model)


def _check_plan(model, plan):
    feeds = random_inputs(model, seed=3)
    inputs = [feeds[s.name] for s in model.inputs]
    ref = build(model.mod, "cpu")(inputs)
    got = codl_tvm.compile(model.mod, plan)(inputs)
    for g, r in zip(got, ref):
        _close(g, r)


@pytest.mark.parametrize(
    ("dim", "ratio", "conv"),
    [
        ("H", 0.5, dict(k=3)),
        ("H", 0.0, dict(k=3)),
        ("H", 1.0, dict(k=3)),
        ("H", 0.06, dict(k=5)),  # GPU gets a single output row
        ("H", 0.3, dict(k=7, stride=2)),
        ("H", 0.5, dict(k=3, dilation=2)),
        ("OC", 0.5, dict(k=1)),
        ("OC", 1 / 16, dict(k=3)),  # GPU gets a single output channel
        ("OC", 0.5, dict(k=3, group=4)),
        ("H", 0.4, dict(k=3, group=8)),  # depthwise
    ],
)
def test_single_conv(opencl, dim, ratio, conv):
    c_in = 8
    c_out = 16 if conv.get("group", 1) != 8 else 8  # depthwise: one output per input channel
    model = _conv_model(c_in, c_out, 16, **conv)
    _check_plan(model, uniform_plan(model.mod, dim, ratio))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_conv_pool_chain(opencl, pool):
    model = _conv_model(4, 8, 15, 3, stride=2, pool=pool)
    ops = [o.op for o in uniform_plan(model.mod, "H", 0.5).ops]
    plan = PartitionPlan(chains=(ChainPlan(tuple(ops), "H", 0.45),))
    _check_plan(model, plan)


def test_temporary_libraries_go_with_their_models(opencl, tmp_path):
    """Builds without a work_dir leave nothing in the temporary directory once dropped (every
    build is a ~100 KB-250 MB library; thousands of test and benchmark builds filled a disk);
    builds with one keep their files."""
    import gc

    model = _conv_model(4, 8, 12, 3)
    feeds = random_inputs(model, seed=1)
    inputs = [feeds[s.name] for s in model.inputs]
    plan = uniform_plan(model.mod, "H", 0.5)
    ref = build(model.mod, "cpu")
    got = codl_tvm.compile(model.mod, plan)
    dirs = [ref.library.parent, got.library.parent]
    assert all(d.is_dir() for d in dirs)
    _close(got(inputs)[0], ref(inputs)[0])  # the library is usable while its model is alive
    del ref, got
    gc.collect()
    assert not any(d.exists() for d in dirs)

    kept = codl_tvm.compile(model.mod, plan, work_dir=tmp_path / "keep").library
    kept_cpu = build(model.mod, "cpu", work_dir=tmp_path / "keep_cpu").library
    gc.collect()
    assert kept.is_file() and kept_cpu.is_file()
    assert (tmp_path / "keep" / "coexec.plan.json").is_file()


@pytest.mark.parametrize("ratios", [(0.0, 0.0, 1.0), (1.0, 1.0, 0.0), (0.0, 1.0, 0.0)])
def test_tuple_kernel_across_processors(opencl, ratios):
    """Conv -> average pool -> dropout -> conv (Inception v1's head), the dropout's kernel
    returning a tuple. It follows the pool's processor: on the CPU its outputs are shared buffers
    written in place and the GPU conv reads ``d[0]``; on the GPU the CPU conv waits for it through
    the projection. FuseOps must not fuse two processors' kernels (PlaceParts fences the edge)."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.3).astype("float32")
    w2 = (rng.standard_normal((5, 8, 1, 1)) * 0.3).astype("float32")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("AveragePool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Dropout", ["p"], ["d"]),
        helper.make_node("Conv", ["d", "w2"], ["y"], kernel_shape=[1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    model = load_onnx(onnx.shape_inference.infer_shapes(proto))
    ops = [o.op for o in uniform_plan(model.mod, "H", 0.5).ops]
    assert len(ops) == 3  # the convs and the pool; the dropout stays outside the plan
    plan = PartitionPlan(ops=tuple(OpPartition(op, "H", r) for op, r in zip(ops, ratios)))
    where = _placements(model, plan)
    dropout = [k for k in where if k.startswith("dropout")]
    assert [where[k] for k in dropout] == ["cpu" if ratios[1] == 0.0 else "gpu"], where
    _check_plan(model, plan)


def _conv_bn_softmax_model():
    """Conv -> BatchNormalization -> LeakyRelu -> Conv -> BatchNormalization -> Softmax, a
    RetinaFace head: TVM keeps each batch norm as a kernel with a tuple output (it travels with
    its conv's parts), and the softmax is outside every split."""
    rng = np.random.default_rng(7)
    inits = {
        "w0": rng.standard_normal((8, 4, 3, 3)) * 0.3,
        "w1": rng.standard_normal((6, 8, 3, 3)) * 0.3,
    }
    for i, c in ((0, 8), (1, 6)):
        inits[f"s{i}"] = rng.uniform(0.5, 1.5, c)
        inits[f"b{i}"] = rng.standard_normal(c) * 0.1
        inits[f"m{i}"] = rng.standard_normal(c) * 0.1
        inits[f"v{i}"] = rng.uniform(0.5, 1.5, c)
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("BatchNormalization", ["c0", "s0", "b0", "m0", "v0"], ["n0"]),
        helper.make_node("LeakyRelu", ["n0"], ["r0"], alpha=0.1),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("BatchNormalization", ["c1", "s1", "b1", "m1", "v1"], ["n1"]),
        helper.make_node("Softmax", ["n1"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "conv_bn_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype("float32"), k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    return load_onnx(onnx.shape_inference.infer_shapes(proto))


def _placements(model, plan) -> dict[str, str]:
    """Processor ("cpu"/"gpu") of every kernel after PlaceParts, by PrimFunc name."""
    import tvm
    from codl_tvm.passes import PartitionOperators
    from codl_tvm.passes.place import PlaceParts
    from tvm import relax

    gpu = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
    cpu = tvm.target.Target({"kind": "llvm"})
    seq = tvm.transform.Sequential(
        [
            PartitionOperators(plan),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            PlaceParts(gpu, cpu, plan.home),
        ]
    )
    with gpu:
        mod = seq(model.mod)
    return {
        gv.name_hint: "gpu" if func.attrs["target"].kind.name == "opencl" else "cpu"
        for gv, func in mod.functions.items()
        if isinstance(func, tvm.tirx.PrimFunc) and "target" in func.attrs
    }


@pytest.mark.parametrize(
    ("ratios", "home", "softmax_on"),
    [
        ((0.0, 1.0), "cpu", "gpu"),  # follows the GPU conv although home is the CPU
        ((1.0, 0.0), "gpu", "cpu"),  # follows the CPU conv although home is the GPU
        ((0.0, 0.5), "cpu", "cpu"),  # after a merged split: home
        ((1.0, 0.5), "gpu", "gpu"),
    ],
)
def test_unplanned_kernels_follow_their_inputs(opencl, ratios, home, softmax_on):
    """A kernel outside the plan (the softmax) runs where its inputs were computed, or on the
    plan's ``home`` after a merged split; numerics against the unpartitioned build."""
    model = _conv_bn_softmax_model()
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", "H", ratios[0]), OpPartition("conv2d_1", "H", ratios[1])),
        home=home,
    )
    where = _placements(model, plan)
    assert where["softmax"] == softmax_on, where
    _check_plan(model, plan)


@pytest.mark.parametrize("dim", ["H", "OC"])
def test_bundled_model_chains_and_ops(opencl, dim):
    model = load_onnx(bundled_model_path())
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_2", dim, 0.4),),
        chains=(
            ChainPlan(("conv2d_0", "conv2d_1"), dim, 0.5),
            ChainPlan(
                ("max_pool2d_3", "conv2d_4", "conv2d_5", "conv2d_6", "avg_pool2d_7"), dim, 0.37
            ),
        ),
    )
    _check_plan(model, plan)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dim=st.sampled_from(["H", "OC"]),
    ratio=st.floats(0.0, 1.0),
    k=st.sampled_from([1, 3, 5, 7]),
    stride=st.sampled_from([1, 2]),
    hw=st.integers(5, 20),
    c_out=st.integers(1, 12),
)
def test_single_conv_property(opencl, dim, ratio, k, stride, hw, c_out):
    model = _conv_model(3, c_out, hw, k, stride=stride)
    _check_plan(model, uniform_plan(model.mod, dim, ratio))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_model_coexec_against_onnxruntime(opencl, name):
    ort = pytest.importorskip("onnxruntime")
    from codl_tvm.frontend.models import light_model

    proto = light_model(name)
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=2)
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for dim in ("H", "OC"):
        got = codl_tvm.compile(model.mod, uniform_plan(model.mod, dim, 0.5))(
            [feeds[s.name] for s in model.inputs]
        )
        _close(got[0], ref[0].reshape(got[0].shape))


# -- synchronisation ---------------------------------------------------------------------------


@pytest.fixture
def restore_sync():
    yield
    sync.set_sync_mode("auto")
    sync.set_timeout_ms(10_000)


@pytest.mark.parametrize("mode", ["flag", "event", "finish"])
def test_every_sync_mechanism_gives_the_same_result(opencl, restore_sync, mode):
    if mode == "flag" and not sync.flag_supported():
        pytest.skip("no fine-grained SVM with atomics")
    model = load_onnx(bundled_model_path())
    built = codl_tvm.compile(model.mod, uniform_plan(model.mod, "H", 0.5))
    inputs = [random_inputs(model, seed=4)["input"]]
    ref = build(model.mod, "cpu")(inputs)[0]
    sync.set_sync_mode(mode)
    assert sync.sync_mode() == mode
    _close(built(inputs)[0], ref)


def test_auto_mode_is_measured_and_visible(opencl, restore_sync):
    sync.set_sync_mode("auto")
    chosen = sync.sync_mode()
    assert chosen in ("flag", "event")
    if sync.flag_supported():
        cal = sync.calibration()
        assert set(cal) == {"flag_us", "event_us"}
        assert chosen == ("flag" if cal["flag_us"] <= cal["event_us"] else "event")


@pytest.mark.parametrize("mode", ["flag", "event"])
def test_a_gpu_that_never_signals_raises(opencl, restore_sync, mode):
    if mode == "flag" and not sync.flag_supported():
        pytest.skip("no fine-grained SVM with atomics")
    sync.set_sync_mode(mode)
    sync.set_timeout_ms(150)
    blocker = sync._block_queue()
    try:
        mark = sync.gpu_mark()
        with pytest.raises(RuntimeError, match="co-execution sync timed out"):
            sync.cpu_wait(mark)
    finally:
        sync._unblock_queue(blocker)
    import tvm

    tvm.opencl(0).sync()  # the queue drains once released


def test_sync_cost_is_measurable(opencl):
    for mode in ("event", "finish"):
        assert sync.measure_sync_us(mode, repeat=20) > 0


# -- front ends --------------------------------------------------------------------------------


def test_trace_has_both_lanes(opencl, tmp_path):
    from codl_tvm.profiling.trace import trace_inference

    model = load_onnx(bundled_model_path())
    built = codl_tvm.compile(model.mod, uniform_plan(model.mod, "H", 0.5))
    trace = trace_inference(built, [random_inputs(model)["input"]])
    lanes = {e.lane for e in trace.events}
    assert {"GPU", "CPU"} <= lanes
    trace.save_chrome(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert any(e["ph"] == "X" for e in data["traceEvents"])
    trace.save_png(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    from codl_tvm.profiling.trace import Trace

    again = Trace.load_chrome(tmp_path / "t.json")
    assert [(e.lane, e.name) for e in again.events] == [(e.lane, e.name) for e in trace.events]
    for key, value in trace.summary().items():
        assert again.summary()[key] == pytest.approx(value, abs=0.01)
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"ph": "X"}]}')
    with pytest.raises(ValueError, match=r"bad\.json: not a codl-tvm Chrome trace"):
        Trace.load_chrome(tmp_path / "bad.json")


def test_cli_run_coexec(opencl, tmp_path):
    model = load_onnx(bundled_model_path())
    feeds = random_inputs(model, seed=9)
    np.savez(tmp_path / "in.npz", **feeds)
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "OC", 0.25),))
    plan.save(tmp_path / "plan.json")
    code = main(
        [
            "run",
            "--device",
            "coexec",
            "--plan",
            str(tmp_path / "plan.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--save-outputs",
            str(tmp_path / "out.npz"),
            "--repeat",
            "1",
            "--number",
            "1",
        ]
    )
    assert code == 0
    ref = build(model.mod, "cpu")([feeds["input"]])[0]
    _close(np.load(tmp_path / "out.npz")["logits"], ref)
    code = main(
        [
            "run",
            "--device",
            "coexec",
            "--dim",
            "H",
            "--ratio",
            "0.6",
            "--repeat",
            "1",
            "--number",
            "1",
        ]
    )
    assert code == 0  # `codl-tvm demo` has its own tests: tests/test_demo.py


def test_cli_rejects_bad_plans(opencl, tmp_path, capsys):
    bad = tmp_path / "plan.json"
    bad.write_text(
        json.dumps({"version": 1, "ops": [{"op": "conv2d_99", "dim": "H", "ratio": 0.5}]})
    )
    assert main(["run", "--device", "coexec", "--plan", str(bad)]) == 2
    assert "conv2d_99" in capsys.readouterr().err
    assert main(["run", "--device", "coexec", "--dim", "H", "--ratio", "1.5"]) == 2
    assert "1.5" in capsys.readouterr().err
