"""Models unlike the benchmark set through ``compile --weights beside``
(constants shared between operators, used as indices, int64/bool/float16 constants, weights
computed by nodes, 0-d and large constants, NaN/inf in weights, converter-style input names),
the placement planner modes on odd graphs, and buffer mode on an odd shape. Every numeric check
is against onnxruntime. Nothing is timed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.runner import max_abs_difference
from codl_tvm.cli import main
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan, uniform_plan
from codl_tvm.cost_model import CostModel
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.planner.placement.graph import CoexecCosts
from codl_tvm.planner.placement.modes import PlacementConfig, make_plan
from codl_tvm.planner.policy import resolve_plan
from codl_tvm.runtime import weights
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.weights import WEIGHTS
from tests.test_buffer_mode import _run_in_buffer_mode

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _vi(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def shared_weight_model() -> onnx.ModelProto:
    """One conv weight used by two convs on two branches that merge through Add; the input is
    named as Caffe2 converters name it."""
    w = _f32(8, 8, 3, 3)  # 2304 bytes: streamed
    nodes = [
        helper.make_node("Conv", ["gpu_0/data_0", "gpu_0/conv_w"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "gpu_0/conv_w"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "b"], ["gpu_0/softmax_1"]),
    ]
    return _model(
        nodes,
        [_vi("gpu_0/data_0", [1, 8, 7, 9])],
        [_vi("gpu_0/softmax_1", [1, 8, 7, 9])],
        {"gpu_0/conv_w": w},
    )


def computed_weight_model() -> onnx.ModelProto:
    """The only large constant feeds a weight computed by nodes (Transpose, then Mul by a 0-d
    scale) before a Conv with asymmetric padding."""
    w = _f32(6, 10, 3, 3)  # transposed to OC=10, IC=6
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0, 2, 3]),
        helper.make_node("Mul", ["wt", "scale"], ["ws"]),
        helper.make_node("Conv", ["x", "ws"], ["y"], pads=[0, 1, 0, 1]),
    ]
    return _model(
        nodes,
        [_vi("x", [1, 6, 5, 5])],
        [_vi("y", [1, 10, 3, 5])],
        {"w": w, "scale": np.array(0.5, np.float32)},
    )


def typed_constants_model() -> onnx.ModelProto:
    """Large int64 indices (Gather), a large bool mask (Where), a large float16 constant, a
    shape constant (Reshape) and a 0-d constant, with NaN and inf inside a streamed weight."""
    idx = RNG.integers(0, 300, size=(200,)).astype(np.int64)  # 1600 bytes
    mask = RNG.random((1, 300)) > 0.5  # 300 bytes: stays; a bigger one below
    big_mask = RNG.random((4, 300)) > 0.5  # 1200 bytes: streamed
    half = _f32(4, 300).astype(np.float16)  # 2400 bytes
    special = _f32(4, 300)
    special[0, :3] = [np.nan, np.inf, -np.inf]
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),  # (4, 200)
        helper.make_node("Where", ["big_mask", "x", "special"], ["w1"]),
        helper.make_node("Where", ["mask", "w1", "x"], ["w2"]),
        helper.make_node("Cast", ["w2"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["h", "half"], ["h2"]),
        helper.make_node("Cast", ["h2"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "zero_d"], ["m"]),
        helper.make_node("Reshape", ["m", "shape"], ["y"]),
        helper.make_node("Relu", ["g"], ["z"]),
    ]
    return _model(
        nodes,
        [_vi("x", [4, 300])],
        [_vi("y", [2, 600]), _vi("z", [4, 200])],
        {
            "idx": idx,
            "mask": mask,
            "big_mask": big_mask,
            "half": half,
            "special": special,
            "zero_d": np.array(3.0, np.float32),
            "shape": np.array([2, 600], np.int64),
        },
    )


def large_constant_model() -> onnx.ModelProto:
    """A MatMul whose weight is 4 MB, and a second one that shares it through a Transpose."""
    w = _f32(1024, 1024) / 32
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["a", "wt"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [2, 1024])], [_vi("y", [2, 1024])], {"w": w})


def constant_output_model() -> onnx.ModelProto:
    """A large initializer that is also a graph output (through Identity), next to a tiny
    0-d-constant-only branch: the library returns the weight itself."""
    w = _f32(16, 64)
    nodes = [
        helper.make_node("Identity", ["w"], ["wout"]),
        helper.make_node("Add", ["x", "w"], ["y"]),
        helper.make_node("Mul", ["x", "s"], ["z"]),
    ]
    return _model(
        nodes,
        [_vi("x", [16, 64])],
        [_vi("wout", [16, 64]), _vi("y", [16, 64]), _vi("z", [16, 64])],
        {"w": w, "s": np.array(2.0, np.float32)},
    )


def initializers_as_inputs_model() -> onnx.ModelProto:
    """:func:`shared_weight_model` as old converters write it (IR version 3): the weight is
    listed among the graph's inputs too, so onnxruntime lets a caller override it."""
    model = shared_weight_model()
    model.graph.input.append(_vi("gpu_0/conv_w", [8, 8, 3, 3]))
    model.ir_version = 3
    model.opset_import[0].version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


MODELS = {
    "initializers_as_inputs": initializers_as_inputs_model,
    "constant_output": constant_output_model,
    "shared": shared_weight_model,
    "computed": computed_weight_model,
    "typed": typed_constants_model,
    "large": large_constant_model,
}


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:  # IR < 4 lists initializers among the inputs too
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = _f32(*shape)
    return feeds


def _onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check_beside(model: onnx.ModelProto, tmp: Path, device: str, **kwargs) -> dict:
    """Compile ``model`` with its weights beside the library and embedded: both give the same
    outputs, equal to onnxruntime's. Returns the beside build's weights record."""
    path = tmp / "model.onnx"
    onnx.save(model, path)
    feeds = _inputs(model)
    outs = {}
    for placement in ("beside", "embedded"):
        options = CompileOptions(device=device, weights=placement, reference=False, **kwargs)
        out = compile_artifact(path, tmp / placement, options)
        art = load_artifact(out)
        outs[placement] = art([feeds[s.name] for s in art.model.inputs])
        if placement == "beside":
            record = art.manifest["weights"]
            assert record["placement"] == "beside"
            assert (out / WEIGHTS).stat().st_size == record["bytes"]
    want = _onnxruntime(model, feeds)
    # onnxruntime computes float16 Add in float32 (it casts around it on the CPU)
    tol = 1e-2 if any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer) else 1e-4
    for got, same, ref in zip(outs["beside"], outs["embedded"], want, strict=True):
        np.testing.assert_array_equal(got, same)  # the same kernels on the same weights
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol, equal_nan=True)
    return record


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpu_weights_beside_odd_models_match_onnxruntime(name, tmp_path):
    record = _check_beside(MODELS[name](), tmp_path, "cpu")
    kinds = {(tuple(t["shape"]), t["dtype"]) for t in record["tensors"]}
    if name == "shared":  # one weight, fetched once for both convs
        assert kinds == {((8, 8, 3, 3), "float32")}
    if name == "typed":  # the 300-byte mask, 0-d scale and shape stay in the library
        assert {d for _, d in kinds} == {"bool", "float32", "float16", "int64"}
        assert len(kinds) == 4


@pytest.mark.opencl
@pytest.mark.parametrize("name", sorted(MODELS))
def test_opencl_weights_beside_odd_models_match_onnxruntime(name, tmp_path, opencl):
    _check_beside(MODELS[name](), tmp_path, "opencl")


@pytest.mark.opencl
@pytest.mark.parametrize(
    "name,dim", [("shared", "OC"), ("shared", "H"), ("computed", "OC"), ("large", "OC")]
)
def test_coexec_weights_beside_odd_models_match_onnxruntime(name, dim, tmp_path, opencl):
    model = MODELS[name]()
    plan = uniform_plan(load_onnx(model).mod, dim, 0.5)
    assert plan.ops
    _check_beside(model, tmp_path, "coexec", plan=plan)


def test_cli_beside_with_inf_outputs_and_a_missing_weights_file(tmp_path, capsys):
    """``run`` checks a beside artifact whose outputs hold inf against its reference (equal
    infinities are no difference), and refuses one whose weights file is gone in one line."""
    path = tmp_path / "typed.onnx"
    onnx.save(typed_constants_model(), path)
    out = tmp_path / "art"
    argv = ["compile", str(path), "--device", "cpu", "--weights", "beside", "-o", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["run", str(out)]) == 0
    assert "-> OK" in capsys.readouterr().out
    (out / WEIGHTS).unlink()
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"codl-tvm: error: {out}: {WEIGHTS} is missing"]


def test_weights_file_keeps_0d_bool_and_float16_shapes(tmp_path):
    """The weights file and its loader give back each array as it was written: a 0-d weight
    stays 0-d (it came back with shape (1,), which the kernel fetching it refused)."""
    arrays = [
        np.array(np.inf, np.float32),
        RNG.random((3, 5)) > 0.5,
        _f32(7).astype(np.float16),
        np.arange(3, dtype=np.int64),
    ]
    record = weights.write_weights(tmp_path / WEIGHTS, arrays, "k0d@cpu")
    assert [t["shape"] for t in record["tensors"]] == [[], [3, 5], [7], [3]]
    loader = weights.start(tmp_path, record, tvm.cpu(0))
    for i, want in enumerate(arrays):
        got = loader.get(i).numpy()
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


# -- placement modes on odd graphs ----------------------------------------------------------

PLACEMENT = ("hope", "hope_greedy", "codl_hope", "starpu", "mosaic")
# Splits pay a sharing cost that outweighs their gain: whole branches move instead.
COSTLY_SPLITS = SyntheticDevice(share_ms_per_mb=1.0, presync_ms=0.1)
# Without co-execution costs (the synthetic device records none), so placements use both.
PLAIN = PlacementConfig(costs=CoexecCosts())


def merging_branches(kind: str) -> onnx.ModelProto:
    """Two branches (conv + ReLU, conv + max pool) from a converter-named input, merged by
    ``kind`` (Add, Mul or Concat) into a last conv; odd H and W."""
    x, c = "gpu_0/data_0", 32
    nodes = [
        helper.make_node("Conv", [x, "gpu_0/w1"], ["gpu_0/a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", [x, "gpu_0/w2"], ["gpu_0/b"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["gpu_0/a"], ["gpu_0/ar"]),
        helper.make_node(
            "MaxPool", ["gpu_0/b"], ["gpu_0/bp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
    ]
    attrs = {"axis": 1} if kind == "Concat" else {}
    nodes.append(helper.make_node(kind, ["gpu_0/ar", "gpu_0/bp"], ["gpu_0/m"], **attrs))
    nodes.append(helper.make_node("Conv", ["gpu_0/m", "gpu_0/w3"], ["gpu_0/y"], pads=[1, 1, 1, 1]))
    merged = 2 * c if kind == "Concat" else c
    return _model(
        nodes,
        [_vi(x, [1, 16, 33, 31])],
        [_vi("gpu_0/y", [1, 8, 33, 31])],
        {
            "gpu_0/w1": _f32(c, 16, 3, 3) / 8,
            "gpu_0/w2": _f32(c, 16, 3, 3) / 8,
            "gpu_0/w3": _f32(8, merged, 3, 3) / 8,
        },
    )


def unknown_operator_model() -> onnx.ModelProto:
    """A DepthToSpace (no cost-model data) between two convs, beside an independent conv."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("DepthToSpace", ["a"], ["d"], blocksize=2),
        helper.make_node("Conv", ["d", "w2"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x2", "w3"], ["e"], pads=[1, 1, 1, 1]),
    ]
    return _model(
        nodes,
        [_vi("x", [1, 16, 16, 16]), _vi("x2", [1, 16, 32, 32])],
        [_vi("y", [1, 8, 32, 32]), _vi("e", [1, 8, 32, 32])],
        {"w1": _f32(32, 16, 3, 3), "w2": _f32(8, 8, 3, 3), "w3": _f32(8, 16, 3, 3)},
    )


def single_conv_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    return _model(
        nodes, [_vi("x", [1, 5, 7, 7])], [_vi("y", [1, 6, 7, 7])], {"w": _f32(6, 5, 3, 3)}
    )


def nothing_to_place_model() -> onnx.ModelProto:
    """Only operators no planner mode places (no conv, pool or matmul)."""
    nodes = [
        helper.make_node("Relu", ["gpu_0/data_0"], ["r"]),
        helper.make_node("Add", ["r", "gpu_0/data_0"], ["a"]),
        helper.make_node("Reshape", ["a", "shape"], ["gpu_0/y"]),
    ]
    return _model(
        nodes,
        [_vi("gpu_0/data_0", [1, 4, 6, 6])],
        [_vi("gpu_0/y", [1, 144])],
        {"shape": np.array([1, 144], np.int64)},
    )


@pytest.fixture(scope="module")
def costly_splits() -> CostModel:
    return synthetic_cost_model(COSTLY_SPLITS)


def _coexec_matches_onnxruntime(proto: onnx.ModelProto, plan) -> None:
    model = load_onnx(proto)
    built = compile_coexec(model.mod, plan)
    feeds = random_inputs(model, seed=3)
    got = built([feeds[s.name] for s in model.inputs])
    for g, w in zip(got, _onnxruntime(proto, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.opencl
# Mul merges as Add does (one more element-wise kernel): only with --runslow
@pytest.mark.parametrize("kind", ["Add", pytest.param("Mul", marks=pytest.mark.slow), "Concat"])
def test_placement_modes_on_merging_branches_match_onnxruntime(kind, costly_splits, opencl):
    proto = merging_branches(kind)
    mod = load_onnx(proto).mod
    built = set()
    for mode in PLACEMENT:
        plan, report = make_plan(mod, costly_splits, mode, placement=PLAIN)
        assert report.mode == mode and len(plan.ops) == 4
        ratios = tuple(e.ratio for e in plan.ops)
        # the merge and the pool's input come from different processors in most modes
        if mode != "mosaic" and ratios not in built:
            built.add(ratios)
            _coexec_matches_onnxruntime(proto, plan)
    assert any(0.0 in r and 1.0 in r for r in built)  # something ran on both processors


@pytest.mark.opencl
def test_operator_outside_the_cost_model_runs_with_its_producer(costly_splits, opencl):
    proto = unknown_operator_model()
    mod = load_onnx(proto).mod
    plan, report = make_plan(mod, costly_splits, "hope_greedy", placement=PLAIN)
    assert [e.op for e in plan.ops] == ["conv2d_0", "conv2d_1", "conv2d_2"]
    assert any(
        "outside the cost model" in n and "runs with its producer" in n for n in report.notes
    )
    _coexec_matches_onnxruntime(proto, plan)


def test_note_names_the_operator_outside_the_cost_model(costly_splits):
    """TVM imports DepthToSpace as reshape, permute_dims, reshape: the note names them."""
    mod = load_onnx(unknown_operator_model()).mod
    _, report = make_plan(mod, costly_splits, "hope_greedy", placement=PLAIN)
    assert any("(permute_dims x1, reshape x2)" in n for n in report.notes), report.notes


@pytest.mark.parametrize("mode", ["codl", *PLACEMENT])
def test_every_mode_builds_a_model_with_nothing_to_place_alone(mode):
    """No conv, pool or matmul: the plan is empty, built for its home processor alone (it was
    built co-executed, and the report's speedup divided by the 0 ms it predicted)."""
    choice = resolve_plan(load_onnx(nothing_to_place_model()).mod, mode=mode)
    assert not choice.plan.ops
    assert choice.device == "opencl" and "holds no operator" in choice.reason
    summary = choice.report.summary.to_dict()
    assert summary["speedup_vs_best_single"] == summary["efficiency"] == 1.0


@pytest.mark.parametrize("mode", PLACEMENT)
def test_every_mode_plans_a_single_conv(mode):
    choice = resolve_plan(load_onnx(single_conv_model()).mod, mode=mode)
    assert [e.op for e in choice.plan.ops] == ["conv2d_0"]
    # one operator has nothing beside it: it runs whole on one processor
    assert choice.plan.ops[0].ratio in (0.0, 1.0) and choice.device in ("cpu", "opencl")


@pytest.mark.opencl
@pytest.mark.parametrize("name", ["nothing_to_place", "merging_add_cpu", "merging_add_gpu"])
def test_compile_hope_greedy_matches_onnxruntime(name, tmp_path, capsys, opencl):
    """``compile --mode hope_greedy`` builds for the CPU (the shipped cost model keeps these
    small models there), for the GPU (a device whose GPU is 50x its CPU) and for the home
    processor (nothing to place); ``run`` checks the artifact against its reference."""
    proto = nothing_to_place_model() if name == "nothing_to_place" else merging_branches("Add")
    onnx.save(proto, tmp_path / "m.onnx")
    argv = ["compile", str(tmp_path / "m.onnx"), "--mode", "hope_greedy", "-o", str(tmp_path / "a")]
    argv.append("--no-measure")  # the placement's own choice of processor
    if name == "merging_add_gpu":
        synthetic_cost_model(SyntheticDevice(cpu_gflops=1.0, gpu_gflops=50.0)).save(
            tmp_path / "c.json"
        )
        argv += ["--cost-model", str(tmp_path / "c.json")]
    assert main(argv) == 0
    art = load_artifact(tmp_path / "a")
    want_device = {"merging_add_cpu": "cpu"}.get(name, "opencl")
    assert art.manifest["device"] == want_device, art.manifest["plan"].get("fallback")
    feeds = random_inputs(art.model, seed=4)
    got = art([feeds[s.name] for s in art.model.inputs])
    for g, w in zip(got, _onnxruntime(proto, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    capsys.readouterr()
    assert main(["run", str(tmp_path / "a")]) == 0
    assert "-> OK" in capsys.readouterr().out


# -- buffer mode (no SVM) on an odd model -----------------------------------------------------


def odd_rows_model() -> onnx.ModelProto:
    """7 rows and 5, 6, 7 and 3 channels (none a multiple of 4), converter-style names: an H
    split conv, an OC split conv, an H split max pool and an H split chain of two convs."""
    x = "gpu_0/data_0"
    nodes = [
        helper.make_node("Conv", [x, "gpu_0/w0", "gpu_0/b0"], ["gpu_0/c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["gpu_0/c0"], ["gpu_0/r0"]),
        helper.make_node("Conv", ["gpu_0/r0", "gpu_0/w1"], ["gpu_0/c1"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "MaxPool", ["gpu_0/c1"], ["gpu_0/p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Conv", ["gpu_0/p", "gpu_0/w2"], ["gpu_0/c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["gpu_0/c2", "gpu_0/w3"], ["gpu_0/softmax_1"], pads=[0, 1, 0, 1]),
    ]
    return _model(
        nodes,
        [_vi(x, [1, 5, 7, 9])],
        [_vi("gpu_0/softmax_1", [1, 3, 5, 9])],
        {
            "gpu_0/w0": _f32(6, 5, 3, 3) / 4,
            "gpu_0/b0": _f32(6),
            "gpu_0/w1": _f32(7, 6, 3, 3) / 4,
            "gpu_0/w2": _f32(3, 7, 3, 3) / 4,
            "gpu_0/w3": _f32(3, 3, 3, 3) / 4,
        },
    )


ODD_PLAN = PartitionPlan(
    ops=(
        OpPartition("conv2d_0", "H", 0.5),
        OpPartition("conv2d_1", "OC", 0.5),
        OpPartition("max_pool2d_2", "H", 0.5),
    ),
    chains=(ChainPlan(("conv2d_3", "conv2d_4"), "H", 0.5),),
)

BUFFER_MODE = """
import json
import numpy as np
import onnxruntime as ort
import codl_tvm
from codl_tvm import runtime
from codl_tvm.frontend.importer import load_onnx, random_inputs
from tests.test_unusual_models import ODD_PLAN, odd_rows_model

proto = odd_rows_model()
model = load_onnx(proto)
feeds = random_inputs(model, seed=3)
want = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
got = codl_tvm.compile(model.mod, ODD_PLAN)([feeds[s.name] for s in model.inputs])
# the same plan with its weights beside the library: the loader uploads into buffers
import os, onnx
from pathlib import Path
tmp = Path(os.environ["CODL_TVM_CACHE_DIR"])  # the test's tmp_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import load_artifact
onnx.save(proto, tmp / "odd.onnx")
options = CompileOptions(device="coexec", plan=ODD_PLAN, weights="beside", reference=False)
art = load_artifact(compile_artifact(tmp / "odd.onnx", tmp / "art", options))
got += art([feeds[s.name] for s in art.model.inputs])
errs = [float(np.max(np.abs(g - w))) for g, w in zip(got, want + want)]
print(json.dumps({"svm": runtime.svm_mode(), "stats": runtime.buffer_stats(), "errs": errs,
                  "shapes": [list(g.shape) for g in got],
                  "beside": len(art.manifest["weights"]["tensors"])}))
"""


@pytest.mark.opencl
def test_odd_rows_and_channels_co_execute_in_buffer_mode(opencl, tmp_path):
    """7 rows split 0.5 (a 3/4 split whose views start at unaligned byte offsets) and channel
    counts that are no multiple of 4, in buffer mode, against onnxruntime: built in the process
    and as an artifact with its weights beside the library."""
    pytest.importorskip("onnxruntime")
    ODD_PLAN.validate(load_onnx(odd_rows_model()).mod)
    out = _run_in_buffer_mode(BUFFER_MODE, tmp_path)
    assert out["svm"] == "buffer" and out["stats"]["host_maps"] > 0
    assert out["shapes"] == [[1, 3, 5, 9]] * 2 and out["beside"] >= 1
    assert max(out["errs"]) <= 1e-4, out["errs"]


def test_max_abs_difference_counts_equal_infinities_and_nans_as_equal():
    inf, nan = np.inf, np.nan
    a = np.array([1.0, inf, -inf, nan], np.float32)
    assert max_abs_difference([a], [a.copy()]) == 0.0
    assert max_abs_difference([a], [np.array([1.5, inf, -inf, nan])]) == 0.5
    assert max_abs_difference([a], [np.array([1.0, -inf, -inf, nan])]) == inf
    assert max_abs_difference([a], [np.array([1.0, inf, -inf, 0.0])]) == inf


@pytest.mark.opencl
@pytest.mark.parametrize("mode", ["hope", "codl_hope"])
def test_coexec_weights_beside_with_a_placement_plan(mode, costly_splits, tmp_path, opencl):
    """A placement plan (branches on different processors, issued in the schedule's order;
    codl_hope also splits a pool) with its weights beside the library."""
    proto = merging_branches("Concat")
    plan, _ = make_plan(load_onnx(proto).mod, costly_splits, mode, placement=PLAIN)
    assert {0.0, 1.0} <= {e.ratio for e in plan.ops}
    record = _check_beside(proto, tmp_path, "coexec", plan=plan)
    assert len(record["tensors"]) == 3
