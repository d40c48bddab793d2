"""OpenCL schedule rules: structure under ``with Target(...)``, compilation for every device
class, and numerics on the local OpenCL device (PoCL from pip) against numpy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
import tvm_ffi
from codl_tvm.schedules import (
    ADRENO,
    MALI,
    NVIDIA,
    OPENCL_GENERIC,
    POCL,
    OpenCLConv2D,
    OpenCLPool2D,
    apply_schedules,
    explain,
    opencl_config,
    schedule_rules,
)
from tvm import relax, tirx
from tvm.target import Target

from .test_schedules_cpu import (
    conv2d_ref,
    conv_module,
    conv_slice_module,
    loop_kinds,
    pool_ref,
    prim_funcs,
    writes_out_of_bounds,
)

HOST = {"kind": "llvm"}
OPENCL = Target({"kind": "opencl"}, host=HOST)
DEVICE_TARGETS = {
    "generic": OPENCL,
    "adreno": Target({"kind": "opencl", "device": "adreno"}, host=HOST),
    "mali": Target({"kind": "opencl", "device": "mali"}, host=HOST),
    "nvidia": Target({"kind": "opencl", "device": "nvidia", "max_num_threads": 1024}, host=HOST),
    "pocl": Target({"kind": "opencl", "device": "pocl"}, host=HOST),
}


def legalize(mod):
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def schedule(mod, target):
    mod = legalize(mod)
    with target:
        return apply_schedules(target)(mod)


def kernel_launches(func: tirx.PrimFunc) -> list[dict[str, int]]:
    """Thread extents of each kernel (each root-level loop nest) of a scheduled PrimFunc."""
    body = func.body.block.body
    nests = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    launches = []
    for nest in nests:
        extents: dict[str, int] = {}

        def visit(loop, extents=extents):
            if loop.kind == tirx.ForKind.THREAD_BINDING:
                tag = str(loop.thread_binding.thread_tag)
                extents[tag] = max(extents.get(tag, 1), int(loop.extent))

        tvm_ffi.structural_walk(nest, [(tirx.For, visit)])
        if extents:
            launches.append(extents)
    return launches


def opencl_source(ex) -> str:
    def find(mod):
        if mod.kind == "opencl":
            return mod.inspect_source()
        for sub in mod.imports:
            src = find(sub)
            if src:
                return src
        return ""

    return find(ex.mod)


def pool_module(shape, kind, window, stride, padding):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x, window, stride, padding)))
        bb.emit_func_output(out)
    return bb.get()


def dense_module(m, k, n):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((m, k), "float32"))
    b = relax.Var("b", relax.TensorType((k, n), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.matmul(a, b))))
        bb.emit_func_output(out)
    return bb.get()


# ---------------------------------------------------------------------------------------------
# structure and compilation (no device needed)


def test_opencl_configs_per_device_class():
    assert opencl_config(OPENCL) == OPENCL_GENERIC
    assert opencl_config(DEVICE_TARGETS["adreno"]) == ADRENO
    assert opencl_config(DEVICE_TARGETS["mali"]) == MALI
    assert opencl_config(DEVICE_TARGETS["nvidia"]) == NVIDIA
    assert opencl_config(DEVICE_TARGETS["pocl"]).name == POCL.name
    # the target's own work-group limit caps the preset
    assert opencl_config(Target({"kind": "opencl", "device": "nvidia"})).max_workgroup_size == 256
    with pytest.raises(ValueError, match="opencl target"):
        opencl_config(Target({"kind": "llvm"}))


@pytest.mark.parametrize("device", sorted(DEVICE_TARGETS))
@pytest.mark.parametrize(
    "shapes",
    [
        ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
        ((1, 256, 52, 52), (128, 256, 1, 1), 1, 0, 1),
        ((1, 32, 3, 30), (8, 32, 3, 3), 1, (0, 1, 0, 1), 1),
        ((1, 16, 14, 14), (16, 1, 3, 3), 2, 1, 16),
    ],
    ids=["56x56-3x3", "52x52-1x1", "one-row", "depthwise-s2"],
)
def test_conv_schedule_compiles_for_device_class(device, shapes):
    xshape, wshape, stride, pad, groups = shapes
    target = DEVICE_TARGETS[device]
    mod = schedule(conv_module(xshape, wshape, stride, pad, 1, groups, True), target)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "direct"
    assert func.attrs["codl.config"] == opencl_config(target).name
    launches = kernel_launches(func)
    conv_launch = next(k for k in launches if "blockIdx.z" in k)  # the padding kernel is 1-D
    assert {"blockIdx.x", "blockIdx.y", "threadIdx.x"} <= set(conv_launch)
    assert func.attrs["codl.workgroup_size"] == conv_launch["threadIdx.x"]
    assert 1 <= conv_launch["threadIdx.x"] <= opencl_config(target).max_workgroup_size
    assert func.attrs["codl.workgroup_count"] == (
        conv_launch["blockIdx.x"] * conv_launch["blockIdx.y"] * conv_launch["blockIdx.z"]
    )
    left, right = (pad, pad) if isinstance(pad, int) else (pad[1], pad[3])
    out_w = (xshape[3] + left + right - wshape[3]) // stride + 1
    # PoCL vectorises rows of even width, else output channels (when >= 4 lanes divide them)
    vectorized = opencl_config(target).conv_vector_lanes > 1 and (
        out_w % 2 == 0 or any(wshape[0] % v == 0 for v in (4, 8, 16))
    )
    assert (tirx.ForKind.VECTORIZED in loop_kinds(func)) == vectorized
    uses_local = opencl_config(target).conv_use_local_memory and groups == 1
    assert ('scope="shared"' in func.script()) == uses_local
    src = opencl_source(tvm.compile(mod, target=target))
    assert "__kernel void fused_conv2d_add_relu_kernel" in src


def test_pool_and_dense_get_recorded_schedules():
    mod = schedule(pool_module((1, 8, 20, 20), "max", (3, 3), (2, 2), (1, 1, 1, 1)), OPENCL)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "pool"
    assert func.attrs["codl.workgroup_size"] > 0
    mod = schedule(dense_module(1, 64, 100), OPENCL)
    funcs = prim_funcs(mod).values()
    assert all(f.attrs.get("tirx.is_scheduled") for f in funcs)
    assert all(f.attrs.get("codl.algorithm") for f in funcs)
    assert "__kernel" in opencl_source(tvm.compile(mod, target=OPENCL))


def centred_module(shape):
    """``x - mean(x)`` over each channel's map (InstanceNorm's first step, as imported): a mean
    FuseOps fuses with the broadcast subtract after it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            mean = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True))
            out = bb.emit_output(bb.emit(relax.op.subtract(x, mean)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_mean_over_a_large_map_is_a_cross_thread_reduction():
    """A 7x7 global pool stays one work-item's window; a mean over a 128x128 map is declined
    by the pool rule and becomes dlight's cross-thread reduction, one kernel with its
    subtract (the pool rule's serial sum was four kernels and 16384 float32 additions in a
    row per channel)."""
    small = legalize(centred_module((1, 4, 7, 7)))
    (func,) = prim_funcs(small).values()
    assert explain(func, OPENCL)["OpenCLPool2D"] is None
    large = legalize(centred_module((1, 4, 128, 128)))
    (func,) = prim_funcs(large).values()
    assert "128x128 window is more than 256 values" in explain(func, OPENCL)["OpenCLPool2D"]
    mod = schedule(centred_module((1, 4, 128, 128)), OPENCL)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "reduction"
    launches = kernel_launches(func)
    assert len(launches) == 1 and launches[0]["threadIdx.x"] > 1, launches


@pytest.mark.opencl
def test_a_large_mean_sums_as_accurately_as_a_pairwise_sum(opencl):
    """Positive values on a 256x256 map: the float32 mean within 1e-6 of the float64 one (here
    2e-8; one work-item adding the 65536 values in a row is off by 1.3e-6)."""
    x = np.random.default_rng(0).uniform(0.0, 1.0, (1, 2, 256, 256)).astype("float32")
    got = run_opencl(centred_module(x.shape), OPENCL, [x])
    mean = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(x - got, np.broadcast_to(mean, x.shape), rtol=0, atol=1e-6)


def test_opencl_rules_decline_with_reason():
    pool = legalize(pool_module((1, 4, 8, 8), "max", (2, 2), (2, 2), (0, 0, 0, 0)))
    (pool_func,) = prim_funcs(pool).values()
    reasons = explain(pool_func, OPENCL)
    assert reasons["OpenCLConv2D"].startswith("not a conv2d")
    assert reasons["OpenCLPool2D"] is None
    conv = legalize(conv_module((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, 1, 1, False))
    (conv_func,) = prim_funcs(conv).values()
    assert OpenCLConv2D().apply(conv_func, Target({"kind": "llvm"}), False) is None
    assert OpenCLPool2D().explain(conv_func, OPENCL).startswith("not a pool2d")


def test_cpu_functions_in_an_opencl_build_get_cpu_rules():
    """A PrimFunc whose own target is llvm (CPU part of a co-executed op) gets a CPU schedule."""
    conv = legalize(conv_module((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, 1, 1, False))
    gv = next(g for g, f in conv.functions_items() if isinstance(f, tirx.PrimFunc))
    conv[gv] = conv[gv].with_attr("target", Target({"kind": "llvm"}))
    with OPENCL:
        mod = apply_schedules(OPENCL)(conv)
    func = mod[gv]
    assert func.attrs["codl.algorithm"] == "direct"
    assert func.attrs["codl.config"] == "sse"
    assert func.attrs["codl.parallel_extent"] >= 0
    names = [type(r).__name__ for r in schedule_rules(OPENCL)]
    assert names.index("OpenCLConv2D") < names.index("CPUConv2D")


# ---------------------------------------------------------------------------------------------
# numerics on the local OpenCL device


def run_opencl(mod, target, inputs):
    from codl_tvm.build import runner

    built = runner.build(mod, "opencl", target=target)
    return built(inputs)[0]


RUN_CASES = [
    ((1, 8, 21, 19), (16, 8, 3, 3), 1, (1, 1, 1, 1), 1, 1),
    ((1, 16, 13, 13), (24, 16, 1, 1), 1, (0, 0, 0, 0), 1, 1),
    ((1, 8, 11, 9), (5, 8, 3, 3), 2, (1, 1, 1, 1), 1, 1),
    ((1, 8, 12, 14), (8, 1, 3, 3), 2, (1, 1, 1, 1), 1, 8),
    ((1, 8, 11, 9), (8, 2, 3, 3), 1, (2, 2, 2, 2), 2, 4),
    ((1, 3, 17, 17), (7, 3, 7, 7), 2, (3, 3, 3, 3), 1, 1),
    ((1, 16, 2, 20), (3, 16, 3, 3), 1, (1, 1, 0, 1), 1, 1),
    ((1, 8, 6, 32), (20, 8, 3, 3), 1, (1, 1, 1, 1), 1, 1),
    ((1, 8, 9, 32), (4, 8, 3, 3), 2, (1, 1, 1, 1), 1, 1),
    ((1, 8, 13, 13), (32, 8, 3, 3), 1, (1, 1, 1, 1), 1, 1),
    ((1, 8, 12, 12), (16, 1, 3, 3), 1, (1, 1, 1, 1), 1, 8),  # depthwise, multiplier 2
    ((1, 8, 9, 23), (12, 8, 3, 3), 2, (1, 1, 1, 1), 1, 1),
]


@pytest.mark.opencl
@pytest.mark.parametrize("device", ["generic", "pocl", "nvidia", "adreno"])
@pytest.mark.parametrize("case", RUN_CASES, ids=lambda c: f"{c[0]}-{c[1]}-s{c[2]}-g{c[5]}")
def test_conv_on_opencl_matches_numpy(opencl, case, device):
    xshape, wshape, stride, pad, dil, groups = case
    target = DEVICE_TARGETS[device]
    mod = schedule(conv_module(xshape, wshape, stride, pad, dil, groups, True), target)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "direct"
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xshape).astype("float32")
    w = rng.standard_normal(wshape).astype("float32")
    b = rng.standard_normal((1, wshape[0], 1, 1)).astype("float32")
    ref = np.maximum(conv2d_ref(x, w, (stride,) * 2, pad, (dil,) * 2, groups) + b, 0)
    out = run_opencl(mod, target, [x, w, b])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.opencl
@pytest.mark.parametrize(
    "case",
    [
        ("max", (1, 8, 21, 19), (3, 3), (2, 2), (1, 1, 1, 1)),
        ("avg", (1, 6, 12, 30), (2, 2), (2, 2), (0, 0, 0, 0)),
    ],
)
def test_pool_on_opencl_matches_numpy(opencl, case):
    kind, shape, window, stride, padding = case
    mod = schedule(pool_module(shape, kind, window, stride, padding), OPENCL)
    x = np.random.default_rng(8).standard_normal(shape).astype("float32")
    out = run_opencl(mod, OPENCL, [x])
    np.testing.assert_allclose(
        out, pool_ref(x, kind, window, stride, padding), rtol=1e-5, atol=1e-5
    )


@pytest.mark.opencl
def test_dense_on_opencl_matches_numpy(opencl):
    mod = schedule(dense_module(2, 96, 50), OPENCL)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2, 96)).astype("float32")
    b = rng.standard_normal((96, 50)).astype("float32")
    out = run_opencl(mod, OPENCL, [a, b])
    np.testing.assert_allclose(out, np.maximum(a.astype(np.float64) @ b, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["pocl", "nvidia", "adreno"])
def test_sliced_epilogue_stays_in_bounds(device):
    """The OpenCL conv rule keeps a slice epilogue out of the write-back too (see the CPU test:
    on a GPU part the out-of-bounds rows would land in shared virtual memory)."""
    target = DEVICE_TARGETS[device]
    mod = schedule(conv_slice_module(), target)
    (func,) = [f for name, f in prim_funcs(mod).items() if "conv2d" in name]
    assert func.attrs["codl.algorithm"] == "direct"
    assert writes_out_of_bounds(func) == []
    tvm.compile(mod, target=target)


# ---------------------------------------------------------------------------------------------
# split-K: small maps with many input channels on a big GPU


def _split_cfg(**kw):
    return dataclasses.replace(NVIDIA, **kw)


@pytest.mark.parametrize(
    ("xshape", "wshape", "cfg", "split"),
    [
        ((1, 256, 7, 7), (64, 256, 3, 3), NVIDIA, 2),  # a second slice would keep 576 MACs
        ((1, 64, 5, 5), (16, 64, 3, 3), _split_cfg(conv_split_k_min_reduction=64), 8),
        ((1, 64, 5, 5), (16, 64, 3, 3), _split_cfg(conv_split_k=1), 1),  # off
        ((1, 256, 224, 224), (64, 256, 3, 3), NVIDIA, 1),  # enough work-items already
        ((1, 256, 7, 7), (256, 1, 3, 3), NVIDIA, 1),  # depthwise
    ],
    ids=["7x7x256", "split8", "off", "large-map", "depthwise"],
)
def test_split_k_choice(xshape, wshape, cfg, split):
    groups = xshape[1] // wshape[1]
    mod = legalize(conv_module(xshape, wshape, 1, 1, 1, groups, True))
    with DEVICE_TARGETS["nvidia"]:
        mod = apply_schedules(DEVICE_TARGETS["nvidia"], opencl=cfg)(mod)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "direct"
    assert int(func.attrs.get("codl.split_k", 1)) == split
    launches = kernel_launches(func)
    if split > 1:
        # the slices' kernel (grid z = slices x channel blocks) and the sum with the epilogue
        assert len(launches) == 2
        assert func.attrs["codl.workgroup_count"] % split == 0
        assert "rf" in func.script()


def test_split_k_must_be_positive():
    with pytest.raises(ValueError, match="conv_split_k"):
        _split_cfg(conv_split_k=0)


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("xshape", "wshape", "pad", "stride", "cfg"),
    [
        ((1, 256, 7, 7), (64, 256, 3, 3), 1, 1, NVIDIA),
        ((1, 64, 5, 6), (20, 64, 3, 3), 1, 1, _split_cfg(conv_split_k_min_reduction=64)),
        ((1, 128, 4, 9), (24, 128, 1, 1), 0, 1, _split_cfg(conv_split_k_min_reduction=16)),
        ((1, 256, 9, 11), (32, 256, 3, 3), 1, 2, NVIDIA),  # strided: no local-memory stage
    ],
    ids=["7x7x256", "split8-odd-channels", "pointwise", "stride2"],
)
def test_split_k_conv_matches_numpy(opencl, xshape, wshape, pad, stride, cfg):
    from codl_tvm.build import runner
    from codl_tvm.build.pipeline import single_device_pipeline

    target = DEVICE_TARGETS["nvidia"]
    mod = conv_module(xshape, wshape, stride, pad, 1, 1, True)
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xshape).astype("float32")
    w = rng.standard_normal(wshape).astype("float32")
    b = rng.standard_normal((1, wshape[0], 1, 1)).astype("float32")
    ref = np.maximum(conv2d_ref(x, w, (stride, stride), (pad,) * 4, (1, 1), 1) + b, 0)
    built = runner.build(
        mod, "opencl", target=target, relax_pipeline=single_device_pipeline(target, opencl=cfg)
    )
    with target:
        (func,) = prim_funcs(apply_schedules(target, opencl=cfg)(legalize(mod))).values()
    assert int(func.attrs["codl.split_k"]) > 1
    out = built([x, w, b])[0]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.opencl
def test_split_k_workspace_is_pooled_across_calls(opencl):
    """The partial sums are a workspace TVM allocates and frees around every call: the
    runtime's pool serves every call after the first from the block the first one freed."""
    from codl_tvm import runtime
    from codl_tvm.build import runner

    target = DEVICE_TARGETS["nvidia"]
    xshape, wshape = (1, 256, 7, 7), (64, 256, 3, 3)
    built = runner.build(conv_module(xshape, wshape, 1, 1, 1, 1, True), "opencl", target=target)
    rng = np.random.default_rng(12)
    args = [rng.standard_normal(s).astype("float32") for s in (xshape, wshape, (1, 64, 1, 1))]
    first = built(args)[0]
    before = runtime.workspace_stats()
    for _ in range(3):
        np.testing.assert_array_equal(built(args)[0], first)
    after = runtime.workspace_stats()
    assert after["workspace_allocs"] == before["workspace_allocs"]
    assert after["workspace_reuses"] >= before["workspace_reuses"] + 3
    assert after["workspace_bytes"] >= 2 * 64 * 7 * 7 * 4  # two slices of partial sums


_POOL_SCRIPT = """
import json, sys
import numpy as np
from codl_tvm import runtime
from codl_tvm.build import runner
from tests.test_schedules_cpu import conv_module
from tests.test_schedules_opencl import DEVICE_TARGETS

target = DEVICE_TARGETS["nvidia"]
rng = np.random.default_rng(0)

def model(c, oc, hw):
    built = runner.build(conv_module((1, c, hw, hw), (oc, c, 3, 3), 1, 1, 1, 1, True), "opencl",
                         target=target)
    args = [rng.standard_normal(s).astype("float32")
            for s in ((1, c, hw, hw), (oc, c, 3, 3), (1, oc, 1, 1))]
    return lambda: built(args)

small, large = model(256, 32, 5), model(256, 64, 7)
stats = []
for run in (small, large, small, large):
    run()
    stats.append(runtime.workspace_stats())
print(json.dumps(stats))
"""


@pytest.mark.opencl
def test_workspace_pool_gives_back_blocks_too_small_to_reuse(opencl, tmp_path):
    """A larger workspace than any free block evicts the largest free one: the pool then holds
    the large block only, and the small model reuses it (a fresh process, so the pool is
    empty at the start)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", _POOL_SCRIPT], capture_output=True, text=True, env=env, cwd=root
    )
    assert out.returncode == 0, out.stderr[-2000:]
    small, large, small2, large2 = json.loads(out.stdout.strip().splitlines()[-1])
    assert small["workspace_allocs"] == 1
    assert large["workspace_allocs"] == 2  # the small block did not fit
    assert large["workspace_bytes"] >= 2 * 64 * 7 * 7 * 4 > small["workspace_bytes"]
    # the small block was given back: the pool holds the large one only (less than both blocks
    # together), and both models reuse it
    assert large["workspace_bytes"] < small["workspace_bytes"] + 2 * 64 * 7 * 7 * 4
    assert large2["workspace_bytes"] == small2["workspace_bytes"] == large["workspace_bytes"]
    assert large2["workspace_allocs"] == 2 and large2["workspace_reuses"] == 2


def _split_slice_module():
    """A split-K conv (256 channels on 6x6) whose relu is followed by the row slice a
    co-executed chain's next part reads (FuseOps fuses it after the conv)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 256, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((32, 256, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            y = bb.emit(relax.op.strided_slice(y, axes=[2], begin=[1], end=[5]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.opencl
def test_split_k_with_a_slice_epilogue_stays_in_bounds(opencl):
    """The slice epilogue stays out of the split-K sum's write-back (it reads 4 of the 6 rows)
    and the result is exact."""
    from codl_tvm.build import runner

    target = DEVICE_TARGETS["nvidia"]
    mod = schedule(_split_slice_module(), target)
    (func,) = [f for name, f in prim_funcs(mod).items() if "conv2d" in name]
    assert int(func.attrs["codl.split_k"]) > 1
    assert writes_out_of_bounds(func) == []
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 256, 6, 6)).astype("float32")
    w = (rng.standard_normal((32, 256, 3, 3)) * 0.05).astype("float32")
    want = np.maximum(conv2d_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1), 0)[:, :, 1:5]
    got = runner.build(_split_slice_module(), "opencl", target=target)([x, w])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
