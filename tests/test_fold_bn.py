"""FoldBatchNorm: batch norms after convs with constant weights fold into them.

References are TVM's own builds of the unfolded module (``tvm.compile`` with TVM's default
pipeline, which keeps the batch norm) and onnxruntime where it is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes.fold_bn import FoldBatchNorm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import codl_tvm
from codl_tvm.build.runner import build
from codl_tvm.core.plan import uniform_plan
from codl_tvm.frontend.importer import load_onnx


def _model(bias=True, users="bn", bn_input="conv", weight_input=False, mean_used=False, seed=0):
    """x -> Conv [bias] -> BatchNormalization -> Relu, with variants that must not fold."""
    rng = np.random.default_rng(seed)
    c_in, c_out = 4, 8
    inits = [numpy_helper.from_array(rng.standard_normal((c_out, c_in, 3, 3)).astype("f4"), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(c_out).astype("f4"), "B"))
    params = {
        "g": rng.uniform(0.5, 1.5, c_out),
        "b": rng.standard_normal(c_out) * 0.3,
        "m": rng.standard_normal(c_out) * 0.3,
        "v": rng.uniform(0.5, 1.5, c_out),
    }
    inits += [numpy_helper.from_array(v.astype("f4"), k) for k, v in params.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 10, 9])]
    if weight_input:  # the weight is a graph input: not a constant, nothing to fold into
        inits = inits[1:]
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [c_out, c_in, 3, 3]))
    nodes = [helper.make_node("Conv", ["x", "W", "B"] if bias else ["x", "W"], ["c"], pads=[1] * 4)]
    src = "c"
    if bn_input == "relu":  # a batch norm that does not follow a conv
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        src = "r"
    outputs = ["z"]
    nodes.append(helper.make_node("BatchNormalization", [src, "g", "b", "m", "v"], ["y"]))
    nodes.append(helper.make_node("Relu", ["y"], ["z"]))
    if users == "two":  # the conv output is also a graph output
        outputs.append(src)
    graph = helper.make_graph(
        nodes,
        "bn",
        inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, c_out, 10, 9]) for o in outputs],
        inits,
    )
    return load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def _has_batch_norm(mod) -> bool:
    return "R.nn.batch_norm" in mod.script(show_meta=False)


def _tvm_reference(mod, inputs):
    """The unfolded module through TVM's own default pipeline (batch_norm legalized as is)."""
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [o.numpy() for o in out] if isinstance(out, tvm.ir.Array) else [out.numpy()]


def _inputs(model, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in model.inputs]


@pytest.mark.parametrize("bias", [True, False])
def test_conv_batch_norm_folds_and_matches(bias):
    model = _model(bias=bias)
    folded = FoldBatchNorm()(model.mod)
    assert _has_batch_norm(model.mod), "the caller's module must not change"
    assert not _has_batch_norm(folded)
    # one conv and one add are left; the conv keeps its variable (plans name operators by it)
    text = folded.script(show_meta=False)
    assert text.count("R.nn.conv2d(") == 1 and text.count("R.add(") == 1
    inputs = _inputs(model)
    want = _tvm_reference(model.mod, inputs)[0]
    got = build(folded, "cpu")(inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.abs(want).max() > 1  # a real signal, not zeros


@pytest.mark.parametrize(
    "variant",
    [dict(users="two"), dict(bn_input="relu"), dict(weight_input=True)],
    ids=["conv-output-used-twice", "after-relu", "weight-not-constant"],
)
def test_batch_norms_that_must_stay(variant):
    """Not foldable: left as it is, and the build (which runs the pass) is still right."""
    model = _model(**variant)
    folded = FoldBatchNorm()(model.mod)
    assert _has_batch_norm(folded)
    inputs = _inputs(model)
    for got, want in zip(build(model.mod, "cpu")(inputs), _tvm_reference(model.mod, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_used_mean_output_keeps_batch_norm():
    """A batch norm whose mean output is used is not an affine map of the conv alone."""
    from tvm.script import relax as R

    w = np.random.default_rng(0).standard_normal((4, 2, 1, 1)).astype("f4")
    p = np.ones(4, "f4")

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((1, 2, 4, 4), "float32")):
            with R.dataflow():
                c = R.nn.conv2d(x, R.const(w))
                t = R.nn.batch_norm(c, R.const(p), R.const(p), R.const(p), R.const(p), axis=1)
                y = t[0]
                m = t[1]
                out = (y, m)
                R.output(out)
            return out

    assert _has_batch_norm(FoldBatchNorm()(Mod))


@pytest.mark.parametrize(("dim", "ratio"), [("H", 0.4), ("OC", 0.5)])
def test_plans_of_the_unfolded_model_apply_after_folding(opencl, dim, ratio, tmp_path, monkeypatch):
    """The plan is made on the imported module; the build folds first, then partitions: no
    batch norm kernel is left and the co-executed model matches TVM's unfolded build."""
    model = _model(bias=True, seed=3)
    plan = uniform_plan(model.mod, dim, ratio)
    assert plan.ops
    inputs = _inputs(model, seed=4)
    want = _tvm_reference(model.mod, inputs)[0]
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    got = codl_tvm.compile(model.mod, plan)(inputs)[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    scheduled = next(tmp_path.glob("*-schedule.py")).read_text()
    assert "conv2d" in scheduled and "batch_norm" not in scheduled


@pytest.mark.parametrize(
    ("name", "hw"),
    # YOLOv2 (30 s on 2 cores) with --runslow; RetinaFace keeps the CI check
    [pytest.param("yolov2", (32, 64), marks=pytest.mark.slow), ("retinaface", (32, 64))],
)
def test_paper_model_batch_norms_fold(name, hw):
    """Every batch norm of the zoo's YOLOv2 and RetinaFace follows a conv: none is left, the
    operators' fingerprint (what plans are checked against) is unchanged, and the CPU build
    matches TVM's unfolded build."""
    from codl_tvm.core.plan import model_fingerprint
    from codl_tvm.frontend.importer import random_inputs
    from codl_tvm.frontend.zoo import build_model

    model = load_onnx(build_model(name, input_hw=hw))
    assert _has_batch_norm(model.mod)
    folded = FoldBatchNorm()(model.mod)
    assert not _has_batch_norm(folded)
    assert model_fingerprint(folded) == model_fingerprint(model.mod)
    feeds = random_inputs(model, seed=2)
    inputs = [feeds[s.name] for s in model.inputs]
    for got, want in zip(build(model.mod, "cpu")(inputs), _tvm_reference(model.mod, inputs)):
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
