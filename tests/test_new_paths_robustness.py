"""The session's new paths on models outside the benchmark set: ``compile --weights beside``
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

from codl_tvm.artifact import compile_artifact, load_artifact, weights
from codl_tvm.artifact.weights import WEIGHTS
from codl_tvm.cli import main
from codl_tvm.frontend import load_onnx
from codl_tvm.plan import uniform_plan

QUIET = {"log": lambda s: None}
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


MODELS = {
    "constant_output": constant_output_model,
    "shared": shared_weight_model,
    "computed": computed_weight_model,
    "typed": typed_constants_model,
    "large": large_constant_model,
}


def _inputs(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    for vi in model.graph.input:
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
        out = compile_artifact(
            path,
            tmp / placement,
            device=device,
            weights=placement,
            reference=False,
            **kwargs,
            **QUIET,
        )
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
