"""IssueGpuAhead end to end on the local OpenCL device: a HOPE-like placement of an Inception
module (a split stem, branches placed whole on the CPU and on the GPU) built in host order, with
the GPU issued ahead without gates and with gates, against onnxruntime and each other."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from codl_tvm.artifact import compile_artifact, load_artifact
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.cli import bundled_model_path
from codl_tvm.core.plan import (
    OpPartition,
    PartitionPlan,
    model_fingerprint,
    partitionable_ops,
    uniform_plan,
)
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.options import CompileOptions
from codl_tvm.runtime import sync

from .test_hope import inception_like
from .test_hope_compile import assert_close, onnxruntime_outputs

pytestmark = pytest.mark.opencl

# the stem split in half, the 1x1 branch and the pool branch on the CPU, the 1x1 -> 3x3 branch
# on the GPU: in host order the GPU branch's second conv waits for the CPU's pool branch
RATIOS = {
    "conv2d_0": 0.5,
    "conv2d_1": 0.0,
    "conv2d_2": 1.0,
    "conv2d_3": 1.0,
    "max_pool2d_4": 0.0,
    "conv2d_5": 0.0,
}
BUILDS = {"host order": {"issue_ahead": False}, "ahead": {"gates": False}, "gated": {"gates": True}}


def _placement(model) -> PartitionPlan:
    """RATIOS as a plan of ``model`` (the inception-like module), the GPU its home."""
    infos = partitionable_ops(model.mod)
    ops = tuple(OpPartition(i.name, "H", RATIOS[i.name]) for i in infos)
    return PartitionPlan(ops, (), model_fingerprint(model.mod, infos), home="gpu")


@pytest.fixture(scope="module")
def branches():
    proto = inception_like(c=16, hw=32)
    model = load_onnx(proto)
    plan = _placement(model)
    feeds = random_inputs(model, seed=3)
    (want,) = onnxruntime_outputs(proto, feeds)
    x = feeds[model.inputs[0].name]
    return {name: compile_coexec(model.mod, plan, **kw) for name, kw in BUILDS.items()}, x, want


def _cpu_calls_before_gpu_calls(built) -> int:
    """Summed over the GPU kernel calls: how many CPU kernel calls the host makes before it."""
    seen = total = 0
    for call in built.kernel_splits["calls"]:
        if call[2] == "cpu":
            seen += 1
        else:
            total += seen
    return total


def test_gates_are_available_here(opencl):
    # both CPU OpenCL platforms of CI have fine-grained SVM and user events: the gated build
    # below really gates
    assert sync.gates_supported(), sync.gates_unsupported_reason()


@pytest.mark.parametrize("name", list(BUILDS))
def test_every_issue_order_equals_onnxruntime(opencl, branches, name):
    builds, x, want = branches
    for _ in range(3):  # later runs reuse the site buffers and the gates' queue
        assert_close(builds[name]([x])[0], want)


def test_issue_orders_agree_exactly(opencl, branches):
    builds, x, _ = branches
    ref = builds["host order"]([x])[0]
    for name in ("ahead", "gated"):
        np.testing.assert_array_equal(builds[name]([x])[0], ref)


def test_gpu_kernels_are_issued_earlier(opencl, branches):
    builds, _, _ = branches
    host, ahead, gated = (_cpu_calls_before_gpu_calls(builds[n]) for n in BUILDS)
    assert host > ahead > gated == 0, (host, ahead, gated)


@pytest.mark.slow
@pytest.mark.parametrize("dim", ["H", "OC"])
def test_split_chain_with_gates_equals_host_order(opencl, dim):
    """Every GPU part gated ahead of the CPU part before it (CoDL's split chain)."""
    model = load_onnx(bundled_model_path())
    plan = uniform_plan(model.mod, dim, 0.5)
    x = random_inputs(model, seed=5)["input"]
    host = compile_coexec(model.mod, plan, issue_ahead=False)([x])[0]
    gated = compile_coexec(model.mod, plan, gates=True)
    for _ in range(2):
        np.testing.assert_array_equal(gated([x])[0], host)


def test_timeline_carries_enqueue_and_ready_times(opencl, branches):
    """The trace marks when each GPU kernel was enqueued and when its CPU inputs were ready, so
    ``gap_breakdown`` can tell host-caused GPU idle (no timing asserted: 2 shared vCPUs)."""
    from codl_tvm.profiling.bound import gap_breakdown
    from codl_tvm.profiling.trace import trace_inference

    builds, x, _ = branches
    for name in BUILDS:
        trace = trace_inference(builds[name], [x])
        gpu = [e for e in trace.events if e.lane == "GPU"]
        assert gpu and all(e.queued_us is not None and e.queued_us <= e.start_us for e in gpu)
        # the GPU branch's first conv reads the split stem, which the CPU part completes
        assert any(e.ready_us is not None for e in gpu), name
        b = gap_breakdown(trace, bound_ms=0.5 * trace.span_us() / 1e3)
        assert b.terms["host_issue"] >= 0.0
        assert sum(v for v in b.terms.values() if v is not None) == pytest.approx(b.gap_ms)


def test_the_compile_option_sets_the_issue_order(opencl, tmp_path):
    """``CompileOptions.issue_ahead`` (``compile --no-issue-ahead``) reaches the build: the
    host order keeps more CPU calls ahead of the GPU's, and both equal onnxruntime."""
    proto = inception_like(c=16, hw=32)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    model = load_onnx(path)
    plan = _placement(model)
    feeds = random_inputs(model, seed=3)
    (want,) = onnxruntime_outputs(proto, feeds)
    before = {}
    for ahead in (True, False):
        out = tmp_path / f"art_{ahead}"
        compile_artifact(path, out, CompileOptions(plan=plan, issue_ahead=ahead))
        art = load_artifact(out)
        assert_close(art([feeds[model.inputs[0].name]])[0], want)
        splits = SimpleNamespace(kernel_splits=art.manifest["kernel_splits"])
        before[ahead] = _cpu_calls_before_gpu_calls(splits)
    assert before[False] > before[True], before


def test_gates_hold_gpu_parts_on_images_too(opencl, branches):
    """The same placement with the GPU's operators on images: gated, the GPU work (image
    kernels and conversions) is issued before every CPU call and held on the device; the
    numbers equal the ungated image build exactly and onnxruntime."""
    _, x, want = branches
    model = load_onnx(inception_like(c=16, hw=32))
    plan = _placement(model)
    ahead, gated = (
        compile_coexec(model.mod, plan, gates=gates, gpu_data_type="image")
        for gates in (False, True)
    )
    # the GPU's parts really compute on images
    assert any(r["data_type"] == "image" for r in gated.kernel_splits["gpu_parts"])
    assert _cpu_calls_before_gpu_calls(ahead) > _cpu_calls_before_gpu_calls(gated) == 0
    ref = ahead([x])[0]
    assert_close(ref, want)
    for _ in range(3):  # later runs pass the gates of the queue the earlier ones left
        np.testing.assert_array_equal(gated([x])[0], ref)
