"""The OpenCL dense rule (``OpenCLDense``): structure, numerics on the local OpenCL device
(PoCL from pip) against numpy, OC parts of a co-executed dense against the unpartitioned build,
and an ONNX model with Gemm layers against onnxruntime."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from codl_tvm.schedules import (
    NVIDIA,
    OPENCL_GENERIC,
    POCL,
    OpenCLDense,
    explain,
    opencl_config,
    schedule_rules,
)
from codl_tvm.schedules.opencl_dense import match_dense
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, s_tir
from tvm.s_tir.dlight.analysis import get_root_block

from codl_tvm.cost_model.features import IMPL_GROUPS, OpParams
from codl_tvm.planner.split.search import expected_impl

from .test_schedules_cpu import prim_funcs
from .test_schedules_opencl import (
    DEVICE_TARGETS,
    OPENCL,
    legalize,
    opencl_source,
    run_opencl,
    schedule,
)


@pytest.fixture(scope="module", autouse=True)
def _dense_on():
    """codl's OpenCL dense rule is opt-in (off in every preset); these tests switch it on."""
    from codl_tvm.schedules import dense_enabled

    with dense_enabled():
        yield


def test_dense_rule_is_off_by_default():
    """Presets keep dlight's dense rules until measured on the device machine; PoCL was, and
    takes codl's GEMM path for every batch (a 16-feature vector per work-item)."""
    from codl_tvm.schedules import dense_enabled, opencl_config

    for cfg in (OPENCL_GENERIC, NVIDIA):
        assert cfg.dense is False
    assert POCL.dense and POCL.dense_gemm_min_m == 1
    with dense_enabled(False):
        mod = schedule(dense_module(1, 96, 64), DEVICE_TARGETS["pocl"])
        algos = {f.attrs.get("codl.algorithm") for f in prim_funcs(mod).values()}
        assert "gemm" in algos
    with dense_enabled(False):
        target = DEVICE_TARGETS["generic"]
        assert not opencl_config(target).dense
        mod = schedule(dense_module(1, 96, 50), target)
        algos = {f.attrs.get("codl.algorithm") for f in prim_funcs(mod).values()}
        assert "gemv" not in algos and "gemm" not in algos
        one = OpParams(op="dense", h=3, w=1, ic=64, oc=32, kernel=1)
        assert expected_impl(one, "gpu", opencl_config(target)) == "matmul"  # dlight's Matmul
    assert opencl_config(DEVICE_TARGETS["pocl"]).dense  # the module's switch


def dense_module(m, k, n, transposed=True, bias=True, relu=True, batch=None):
    """``relu(a @ w.T + b)`` (``w`` [N, K]) or ``a @ w`` (``w`` [K, N]); ``batch`` prepends an
    axis to the input."""
    bb = relax.BlockBuilder()
    a_shape = (m, k) if batch is None else (batch, m, k)
    a = relax.Var("a", relax.TensorType(a_shape, "float32"))
    w = relax.Var("w", relax.TensorType((n, k) if transposed else (k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [a, w, b]):
        with bb.dataflow():
            y = relax.op.matmul(a, relax.op.permute_dims(w) if transposed else w)
            if bias:
                y = relax.op.add(y, b)
            if relu:
                y = relax.op.nn.relu(y)
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    return bb.get()


def dense_ref(a, w, b, transposed=True, bias=True, relu=True):
    y = a.astype(np.float64) @ (w.T if transposed else w)
    if bias:
        y = y + b
    return np.maximum(y, 0) if relu else y


def _dense_func(mod):
    (func,) = [f for name, f in prim_funcs(mod).items() if "matmul" in name]
    return func


# ---------------------------------------------------------------------------------------------
# structure (no device needed)


@pytest.mark.parametrize("device", sorted(DEVICE_TARGETS))
@pytest.mark.parametrize(("m", "algorithm"), [(1, "gemv"), (3, "gemv"), (16, "gemm"), (64, "gemm")])
def test_dense_rule_applies_and_records_its_algorithm(device, m, algorithm):
    target = DEVICE_TARGETS[device]
    cfg = opencl_config(target)
    if m >= cfg.dense_gemm_min_m:
        algorithm = "gemm"  # PoCL takes the GEMM path for every batch
    mod = schedule(dense_module(m, 100, 37), target)
    func = _dense_func(mod)
    assert func.attrs["codl.algorithm"] == algorithm
    assert func.attrs["codl.config"] == cfg.name
    size, count = int(func.attrs["codl.workgroup_size"]), int(func.attrs["codl.workgroup_count"])
    assert 1 <= size <= cfg.max_workgroup_size
    if algorithm == "gemv":
        t_k = min(cfg.dense_gemv_threads_k, 64)  # a power of two up to K = 100
        rows = max(1, min(cfg.dense_gemv_rows, 37, cfg.max_workgroup_size // t_k))
        assert (size, count) == (rows * t_k, m * -(-37 // rows))
    # the recorded launch is the one in the scheduled TIR (one kernel: the epilogue is fused)
    from codl_tvm.cost_model.dispatch import kernel_launches

    (launch,) = kernel_launches(func)
    assert (launch.wg_size, launch.wg_count) == (size, count)
    assert "__kernel" in opencl_source(tvm.compile(mod, target=target))


def test_dense_rule_comes_before_dlight_and_declines_other_ops():
    names = [type(r).__name__ for r in schedule_rules(OPENCL)]
    assert names.index("OpenCLDense") < names.index("RecordedRule")
    from .test_schedules_cpu import conv_module

    conv = legalize(conv_module((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, 1, 1, False))
    (conv_func,) = prim_funcs(conv).values()
    assert explain(conv_func, OPENCL)["OpenCLDense"].startswith("not a dense")
    assert explain(_dense_func(legalize(dense_module(2, 8, 8))), OPENCL)["OpenCLDense"] is None


def test_match_dense_reads_layout_and_batch():
    func = _dense_func(legalize(dense_module(5, 24, 10, transposed=False, batch=3)))
    sch = s_tir.Schedule(func)
    main = next(
        b
        for b in sch.get_child_blocks(get_root_block(sch))
        if any(iv.iter_type == 2 for iv in sch.get(b).iter_vars)
    )
    info = match_dense(sch, main)
    assert (info.rows, info.k, info.n, info.batch_axes) == (15, 24, 10, 1)
    assert not info.weight_transposed


def test_config_fields_per_preset():
    assert OPENCL_GENERIC.dense_gemm_min_m >= 2
    assert POCL.dense_vector_lanes > 1 and not POCL.dense_use_local_memory
    assert NVIDIA.dense_use_local_memory
    for cfg in (OPENCL_GENERIC, POCL, NVIDIA):
        assert cfg.dense_threads_m * cfg.dense_threads_n <= cfg.max_workgroup_size


def test_expected_impl_and_cost_model_groups():
    """The planner names GPU dense kernels by the cost-model groups the shipped models know."""
    one = OpParams(op="dense", h=1, w=1, ic=64, oc=32, kernel=1)
    many = OpParams(op="dense", h=OPENCL_GENERIC.dense_gemm_min_m, w=1, ic=64, oc=32, kernel=1)
    on = dataclasses.replace(OPENCL_GENERIC, dense=True)
    assert expected_impl(one, "gpu", on) == IMPL_GROUPS[("dense", "gpu", "gemv")] == "reduction"
    assert expected_impl(many, "gpu", on) == IMPL_GROUPS[("dense", "gpu", "gemm")] == "matmul"
    from codl_tvm.cost_model.features import op_features

    assert op_features(one, "gpu", "gemv").impl == "reduction"
    assert op_features(many, "gpu", "gemm").impl == "matmul"


# ---------------------------------------------------------------------------------------------
# numerics on the local OpenCL device

SHAPES = [
    (1, 96, 50, True),
    (1, 1000, 10, True),
    (3, 70, 33, False),
    (16, 64, 64, True),
    (16, 37, 19, False),
    (64, 67, 45, True),
    (64, 128, 100, False),
]


@pytest.mark.opencl
@pytest.mark.parametrize("device", ["pocl", "generic", "nvidia"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"m{s[0]}-k{s[1]}-n{s[2]}-t{int(s[3])}")
def test_dense_on_opencl_matches_numpy(opencl, device, shape):
    m, k, n, transposed = shape
    target = DEVICE_TARGETS[device]
    mod = schedule(dense_module(m, k, n, transposed), target)
    assert _dense_func(mod).attrs["codl.algorithm"] in ("gemm", "gemv")
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((m, k)).astype("float32")
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    out = run_opencl(mod, target, [a, w, b])
    ref = dense_ref(a, w, b, transposed)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.opencl
@pytest.mark.parametrize("epilogue", [(False, False), (True, False)], ids=["plain", "bias"])
def test_dense_epilogues_and_batch_axis(opencl, epilogue):
    bias, relu = epilogue
    target = DEVICE_TARGETS["pocl"]
    mod = schedule(dense_module(4, 40, 24, False, bias, relu, batch=3), target)
    assert _dense_func(mod).attrs["codl.algorithm"] == "gemm"  # 3 x 4 rows
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4, 40)).astype("float32")
    w = rng.standard_normal((40, 24)).astype("float32")
    b = rng.standard_normal(24).astype("float32")
    out = run_opencl(mod, target, [a, w, b])
    np.testing.assert_allclose(out, dense_ref(a, w, b, False, bias, relu), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# ONNX models: co-executed OC parts, and onnxruntime


def gemm_model(m, k, hidden, n, seed=0):
    """ONNX ``Gemm(transB=1) -> Relu -> Gemm(transB=1)`` with random weights."""
    from codl_tvm.frontend.importer import load_onnx

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((hidden, k)).astype("float32") * 0.1, "w1"),
        numpy_helper.from_array(rng.standard_normal(hidden).astype("float32"), "b1"),
        numpy_helper.from_array(rng.standard_normal((n, hidden)).astype("float32") * 0.1, "w2"),
        numpy_helper.from_array(rng.standard_normal(n).astype("float32"), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return proto, load_onnx(proto)


def _ort(proto, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.opencl
@pytest.mark.parametrize("m", [1, 16])
def test_gemm_model_on_opencl_matches_onnxruntime(opencl, m):
    from codl_tvm.build.runner import build
    from codl_tvm.frontend.importer import random_inputs

    proto, model = gemm_model(m, 80, 48, 10)
    feeds = random_inputs(model, seed=1)
    got = build(model.mod, "opencl", target=DEVICE_TARGETS["pocl"])([feeds["x"]])[0]
    ref = _ort(proto, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.opencl
@pytest.mark.parametrize(("m", "algorithm"), [(1, "gemv"), (16, "gemm")])
def test_coexec_oc_parts_get_the_rule_and_match_unpartitioned(
    opencl, tmp_path, monkeypatch, m, algorithm
):
    import codl_tvm
    from codl_tvm.build.runner import build
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import random_inputs

    _, model = gemm_model(m, 80, 48, 10, seed=2)
    feeds = random_inputs(model, seed=4)
    x = [feeds["x"]]
    ref = build(model.mod, "opencl")(x)[0]
    plan = uniform_plan(model.mod, "OC", 0.5)
    assert len(plan.ops) == 2  # both dense layers are split along output features
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "ir"))
    got = codl_tvm.compile(model.mod, plan, work_dir=tmp_path / "lib")(x)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))
    scheduled = next((tmp_path / "ir").glob("*-schedule.py")).read_text()
    # the GPU parts (one per dense layer) are scheduled by the OpenCL dense rule
    assert scheduled.count(f'"codl.algorithm": "{algorithm}"') >= 2


@pytest.mark.slow
@pytest.mark.opencl
def test_alexnet_builds_for_opencl_and_matches_onnxruntime(opencl):
    from codl_tvm.build.runner import build
    from codl_tvm.frontend.importer import load_onnx, random_inputs
    from codl_tvm.frontend.models import light_model

    proto = light_model("bvlc_alexnet")
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=2)
    got = build(model.mod, "opencl", target=DEVICE_TARGETS["pocl"])(
        [feeds[s.name] for s in model.inputs]
    )[0]
    ref = _ort(proto, feeds).reshape(got.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3 * max(1.0, np.abs(ref).max()))


def test_dense_rule_declines_with_reason_off_opencl():
    func = _dense_func(legalize(dense_module(2, 8, 8)))
    rule = OpenCLDense()
    assert rule.apply(func, tvm.target.Target({"kind": "llvm"}), False) is None
    assert "target kind" in rule.explain(func, tvm.target.Target({"kind": "llvm"}))


def test_dispatch_features_of_dense_are_the_recorded_launch():
    from codl_tvm.cost_model.dispatch import dispatch_features

    for m in (1, 16):
        func = _dense_func(schedule(dense_module(m, 100, 37), DEVICE_TARGETS["generic"]))
        d = dispatch_features([func])
        assert (d.wg_size, d.wg_count, d.num_kernels) == (
            int(func.attrs["codl.workgroup_size"]),
            int(func.attrs["codl.workgroup_count"]),
            1,
        )


def test_dispatch_features_prefer_the_launch_a_rule_recorded():
    """Of two reducing launches, the one the rule recorded is the operator's, even when the
    other launches more threads (e.g. a Winograd transform next to its GEMM)."""
    from tvm.script import tirx as T

    from codl_tvm.cost_model.dispatch import dispatch_features

    @T.prim_func(check_well_formed=False)
    def two(a: T.Buffer((64, 64), "float32"), b: T.Buffer((64,), "float32")):
        for bx in T.thread_binding(16, thread="blockIdx.x"):
            for tx in T.thread_binding(4, thread="threadIdx.x"):
                for k in range(64):
                    with T.sblock("big"):
                        i = T.axis.spatial(64, bx * 4 + tx)
                        r = T.axis.reduce(64, k)
                        with T.init():
                            b[i] = T.float32(0)
                        b[i] = b[i] + a[i, r]
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(8, thread="threadIdx.x"):
                for k in range(64):
                    with T.sblock("small"):
                        i = T.axis.spatial(16, bx * 8 + tx)
                        r = T.axis.reduce(64, k)
                        with T.init():
                            b[i] = T.float32(0)
                        b[i] = b[i] + a[r, i]

    d = dispatch_features([two])
    assert (d.wg_size, d.wg_count, d.num_kernels) == (4, 16, 2)
    rec = two.with_attrs({"codl.workgroup_size": 8, "codl.workgroup_count": 2})
    d = dispatch_features([rec])
    assert (d.wg_size, d.wg_count, d.num_kernels) == (8, 2, 2)
