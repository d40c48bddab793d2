"""codl.CutStages: structure (Before/Expected), and numerics of the chained stages against
onnxruntime and the unpartitioned build on small ONNX models; the pipeline build of the stages
for processor groups of different instruction sets (and the OpenCL device), run one frame at a
time and as a stream."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from codl_tvm.passes.stages import CutStages, cut_stages, layer_starts, live_at
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from codl_tvm.build.pipeline import single_device_pipeline
from codl_tvm.build.targets import host_cpu_spec
from codl_tvm.core.errors import ArtifactError, ModelError, PlanError, PlannerError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.stage_build import build_pipeline
from codl_tvm.planner.stages.search import PipelinePlan, PipelineStage, ProcessorGroup
from codl_tvm.runtime.staged_artifact import load_pipeline

RTOL = ATOL = 1e-4


def verify(before: tvm.IRModule, cuts: list[int], expected: tvm.IRModule) -> None:
    after = CutStages(cuts)(before)
    relax.analysis.well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)


def test_cut_two_stages_passes_live_tensors():
    @I.ir_module
    class Before:
        @R.function
        def main(
            x: R.Tensor((1, 2, 6, 6), "float32"),
            w1: R.Tensor((4, 2, 3, 3), "float32"),
            w2: R.Tensor((4, 4, 1, 1), "float32"),
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                a = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                b = R.nn.relu(a)
                c = R.nn.conv2d(b, w2)
                d = R.add(c, b)
                R.output(d)
            return d

    @I.ir_module
    class Expected:
        @R.function
        def main(
            x: R.Tensor((1, 2, 6, 6), "float32"),
            w1: R.Tensor((4, 2, 3, 3), "float32"),
            w2: R.Tensor((4, 4, 1, 1), "float32"),
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                a = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                b = R.nn.relu(a)
                c = R.nn.conv2d(b, w2)
                d = R.add(c, b)
                R.output(d)
            return d

        @R.function
        def stage_0(
            x: R.Tensor((1, 2, 6, 6), "float32"),
            w1: R.Tensor((4, 2, 3, 3), "float32"),
            w2: R.Tensor((4, 4, 1, 1), "float32"),
        ) -> R.Tuple(R.Tensor((4, 4, 1, 1), "float32"), R.Tensor((1, 4, 6, 6), "float32")):
            with R.dataflow():
                a = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
                b = R.nn.relu(a)
                gv = (w2, b)
                R.output(gv)
            return gv

        @R.function
        def stage_1(
            w2: R.Tensor((4, 4, 1, 1), "float32"), b: R.Tensor((1, 4, 6, 6), "float32")
        ) -> R.Tensor((1, 4, 6, 6), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(b, w2)
                d = R.add(c, b)
                R.output(d)
            return d

    assert layer_starts(Before["main"]) == [0, 2]
    verify(Before, [2], Expected)


def test_bad_cuts_are_refused():
    mod = load_onnx(bundled_model_path()).mod
    n = len(mod["main"].body.blocks[0].bindings)
    for cuts in ([0], [n], [5, 5], [8, 4]):
        with pytest.raises(PlanError):
            cut_stages(mod, cuts)


# -- numerics ------------------------------------------------------------------------------


def _init(rng, name, shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype("float32"), name)


def _model(nodes, inits, x_shape, y_shape, name):
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _residual_cnn() -> onnx.ModelProto:
    """Two branches that cross every cut (a skip connection over two convs), a pool, a Gemm."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "r1"], ["s"]),
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    inits = [
        _init(rng, "w1", (8, 3, 3, 3)),
        _init(rng, "b1", (8,)),
        _init(rng, "w2", (8, 8, 3, 3)),
        _init(rng, "w3", (8, 8, 3, 3)),
        _init(rng, "wg", (5, 8 * 4 * 4)),
        _init(rng, "bg", (5,)),
    ]
    return _model(nodes, inits, (1, 3, 8, 8), (1, 5), "residual_cnn")


def _depthwise_cnn() -> onnx.ModelProto:
    """MobileNet-style: a stride-2 conv, a depthwise and a pointwise conv, global pooling."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd"], ["c2"], pads=[1, 1, 1, 1], group=6),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "wp", "bp"], ["c3"]),
        helper.make_node("GlobalAveragePool", ["c3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["y"]),
    ]
    inits = [
        _init(rng, "w1", (6, 3, 3, 3)),
        numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
        numpy_helper.from_array(np.array(6.0, "float32"), "hi"),
        _init(rng, "wd", (6, 1, 3, 3)),
        _init(rng, "wp", (10, 6, 1, 1)),
        _init(rng, "bp", (10,)),
    ]
    return _model(nodes, inits, (1, 3, 10, 10), (1, 10), "depthwise_cnn")


def _onnx_model(which: str):
    if which == "bundled":
        proto = onnx.load(str(bundled_model_path()))
        return proto, load_onnx(bundled_model_path())
    proto = {"residual": _residual_cnn, "depthwise": _depthwise_cnn}[which]()
    return proto, load_onnx(proto)


def _ort(proto: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


def _chain(vm, n_stages: int, x: np.ndarray) -> np.ndarray:
    args = [tvm.runtime.tensor(x)]
    for k in range(n_stages):
        out = vm[f"stage_{k}"](*args)
        args = list(out) if k < n_stages - 1 else [out]
    return args[0].numpy()


@pytest.mark.parametrize("which", ["residual", "depthwise", "bundled"])
def test_chained_stages_equal_onnxruntime_and_main(which):
    proto, model = _onnx_model(which)
    func = model.mod["main"]
    starts = layer_starts(func)
    assert len(starts) >= 3
    x = np.random.default_rng(0).standard_normal(model.inputs[0].shape).astype("float32")
    ref = _ort(proto, x)[0]
    # every layer its own stage, and two stages at the middle layer
    for cuts in (starts[1:], [starts[len(starts) // 2]]):
        staged = cut_stages(model.mod, cuts)
        relax.analysis.well_formed(staged)
        # a stage's outputs are the next stage's parameters, in order
        for k, c in enumerate(cuts):
            ret = staged[f"stage_{k}"].ret_ty
            params = staged[f"stage_{k + 1}"].params
            assert len(ret.fields) == len(params) == len(live_at(func, c))
        target = tvm.target.Target(host_cpu_spec())
        ex = tvm.compile(staged, target=target, relax_pipeline=single_device_pipeline(target))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        whole = vm["main"](tvm.runtime.tensor(x)).numpy()
        got = _chain(vm, len(cuts) + 1, x)
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)


# -- the pipeline build ---------------------------------------------------------------------


def _plan(model, groups, stages: int) -> PipelinePlan:
    """``stages`` stages of about equal layer counts, one per group in order."""
    n = len(layer_starts(model.mod["main"]))
    bounds = [round(i * n / stages) for i in range(stages + 1)]
    return PipelinePlan(
        tuple(
            PipelineStage(g.name, 1, g.cores, bounds[i], bounds[i + 1], 1.0)
            for i, g in enumerate(groups[:stages])
        ),
        "test",
    )


def test_pipeline_build_big_little_stream_and_single(tmp_path):
    proto, model = _onnx_model("residual")
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    plan = _plan(model, groups, 2)
    out = build_pipeline(model, plan, groups, tmp_path / "pipe", isa={"little": "x86-64-v2"})
    pipe = load_pipeline(out, available=[0, 1])
    assert [s["isa"] for s in pipe.manifest["stages"]] == [
        "host" if s.group == "big" else "x86-64-v2" for s in plan.stages
    ]
    frames = [
        np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype("float32") for i in range(6)
    ]
    with pipe.stream(frames, pin=False) as stream:
        outs = list(stream)
    assert stream.stats().frames == 6
    for f, o in zip(frames, outs, strict=True):
        np.testing.assert_allclose(o[0], _ort(proto, f)[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(pipe([frames[2]])[0], outs[2][0], rtol=1e-6, atol=1e-6)


def test_pipeline_refuses_bad_input_before_any_frame(tmp_path):
    _, model = _onnx_model("residual")
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    out = build_pipeline(model, _plan(model, groups, 2), groups, tmp_path / "pipe")
    pipe = load_pipeline(out, available=[0, 1])
    good = np.zeros((1, 3, 8, 8), "float32")
    with pytest.raises(ModelError, match="no frames"):
        pipe.stream([])
    with pytest.raises(ModelError, match=r"stream frame 1: input 'x' has shape \(1, 3, 9, 9\)"):
        pipe.stream([good, np.zeros((1, 3, 9, 9), "float32")])
    with pytest.raises(PlannerError, match="cores 1, which this machine does not have"):
        load_pipeline(out, available=[0])
    with pytest.raises(ArtifactError, match="exists"):
        build_pipeline(model, _plan(model, groups, 2), groups, out)
    keep = tmp_path / "user_dir"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="not a pipeline artifact"):
        build_pipeline(model, _plan(model, groups, 2), groups, keep, force=True)
    assert (keep / "notes.txt").read_text() == "mine"


@pytest.mark.opencl
def test_pipeline_with_gpu_stage_equals_onnxruntime(opencl, tmp_path):
    proto, model = _onnx_model("depthwise")
    groups = (
        ProcessorGroup("big", "cpu", (0,)),
        ProcessorGroup("gpu", "gpu", ()),
        ProcessorGroup("little", "cpu", (1,)),
    )
    plan = _plan(model, groups, 3)
    out = build_pipeline(model, plan, groups, tmp_path / "pipe")
    pipe = load_pipeline(out, available=[0, 1])
    frames = [
        np.random.default_rng(i).standard_normal((1, 3, 10, 10)).astype("float32") for i in range(4)
    ]
    with pipe.stream(frames, pin=False) as stream:
        outs = list(stream)
    for f, o in zip(frames, outs, strict=True):
        np.testing.assert_allclose(o[0], _ort(proto, f)[0], rtol=RTOL, atol=ATOL)
