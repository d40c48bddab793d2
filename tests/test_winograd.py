"""Winograd conv2d: selection, the Relax rewrite, CPU and OpenCL schedules, co-executed parts.

Numerics compare against a float64 numpy conv (``conv2d_ref``) or against the unpartitioned
direct build; tolerance ``1e-4 * max(1, max|ref|)`` (F(4x4, 3x3) rounds more than the direct conv,
about 1e-6 relative here).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tvm
from codl_tvm.passes import PartitionOperators
from codl_tvm.passes.winograd import Conv2DWinograd
from codl_tvm.schedules import (
    AVX2,
    AVX512,
    NVIDIA,
    OPENCL_GENERIC,
    POCL,
    SSE,
    CPUConfig,
    apply_schedules,
    conv2d_shape_info,
    cpu_config,
    explain,
    opencl_config,
    select_conv2d_algorithm,
    transform_weight,
    winograd_enabled,
    winograd_reason,
)
from codl_tvm.schedules.presets import AVX512 as AVX512_PRESET
from codl_tvm.schedules.presets import NVIDIA as NVIDIA_PRESET
from codl_tvm.schedules.winograd import winograd_matrices
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax, tirx
from tvm.target import Target

import codl_tvm
from codl_tvm.build import runner
from codl_tvm.build.pipeline import legalize_passes, single_device_pipeline
from codl_tvm.core.plan import ChainPlan, PartitionPlan, uniform_plan
from codl_tvm.cost_model.features import OpParams
from codl_tvm.planner.split.search import expected_impl

from .test_schedules_cpu import conv2d_ref, loop_kinds, prim_funcs
from .test_schedules_opencl import DEVICE_TARGETS, kernel_launches, opencl_source

LLVM = Target({"kind": "llvm"})
POCL_TARGET = DEVICE_TARGETS["pocl"]


@pytest.fixture(scope="module", autouse=True)
def _winograd_on():
    """Winograd is opt-in (off in every preset); these tests build with it switched on."""
    with winograd_enabled():
        yield


def cpu_cfg(tile: int, **kw) -> CPUConfig:
    """The preset of the plain llvm target (SSE) with Winograd switched on."""
    return dataclasses.replace(SSE, winograd=True, winograd_tile=tile, **kw)


def conv_module(xshape, oc, padding, epilogue=True, seed=0, ksize=3, stride=1, groups=1):
    """A conv (+ bias + relu) with constant weights, as the ONNX frontend imports it."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((oc, xshape[1] // groups, ksize, ksize)) * 0.3).astype("float32")
    b = (rng.standard_normal((1, oc, 1, 1)) * 0.1).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(xshape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, relax.const(w), strides=stride, padding=padding, groups=groups
                ),
                name_hint="conv",
            )
            if epilogue:
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(b))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), w, b


def reference(x, w, b, padding, epilogue=True):
    out = conv2d_ref(x, w, (1, 1), padding, (1, 1), 1)
    return np.maximum(out + b, 0) if epilogue else out


def assert_close(got, want):
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    assert got.shape == want.shape
    err = float(np.abs(got - want).max())
    assert err <= tol, f"max abs error {err} > {tol}"


def scheduled(mod, target, cpu=None, opencl=None):
    """The algorithm, legalize and schedule phases of the single-device pipeline."""
    with target:
        mod = Conv2DWinograd(target, cpu=cpu, opencl=opencl)(mod)
        mod = tvm.transform.Sequential(legalize_passes(target))(mod)
        return apply_schedules(target, cpu, opencl)(mod)


def winograd_func(mod) -> tirx.PrimFunc:
    funcs = [f for f in prim_funcs(mod).values() if f.attrs.get("codl.algorithm") == "winograd"]
    assert len(funcs) == 1, {n: f.attrs.get("codl.algorithm") for n, f in prim_funcs(mod).items()}
    return funcs[0]


# ---------------------------------------------------------------------------------------------
# the algorithm itself (numpy) and selection


@pytest.mark.parametrize("tile", [2, 4])
def test_transform_matrices_compute_a_3x3_conv(tile):
    """Y = A^T [(G g G^T) * (B^T d B)] A equals the 3x3 correlation of one tile."""
    a, b, g = winograd_matrices(tile)
    rng = np.random.default_rng(tile)
    d = rng.standard_normal((tile + 2, tile + 2))
    w = rng.standard_normal((3, 3))
    y = a.T @ ((g @ w @ g.T) * (b.T @ d @ b)) @ a
    want = np.array(
        [[np.sum(d[i : i + 3, j : j + 3] * w) for j in range(tile)] for i in range(tile)]
    )
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    u = transform_weight(w[None, None].astype("float32"), tile)
    assert u.shape == (tile + 2, tile + 2, 1, 1) and u.dtype == np.float32


def test_selection_reasons():
    cfg = cpu_cfg(2)

    def reason(data, weight, stride=1, dilation=1, groups=1, pad=1, config=cfg):
        info = conv2d_shape_info(
            data, weight, (stride, stride), (pad,) * 4, (dilation, dilation), groups
        )
        return winograd_reason(info, config)

    assert reason((1, 64, 28, 28), (64, 64, 3, 3)) is None
    assert "3x3" in reason((1, 64, 28, 28), (64, 64, 5, 5), pad=2)
    assert "stride 2x2" in reason((1, 64, 28, 28), (64, 64, 3, 3), stride=2)
    assert "dilation 2x2" in reason((1, 64, 28, 28), (64, 64, 3, 3), dilation=2, pad=2)
    assert "groups=4" in reason((1, 64, 28, 28), (64, 16, 3, 3), groups=4)
    assert "winograd_min_channels=32" in reason((1, 16, 28, 28), (64, 16, 3, 3))
    assert "winograd_min_channels=32" in reason((1, 64, 28, 28), (8, 64, 3, 3))
    assert "smaller than one 4x4 tile" in reason(
        (1, 64, 3, 28), (64, 64, 3, 3), pad=0, config=cpu_cfg(4)
    )
    assert "disabled" in reason((1, 64, 28, 28), (64, 64, 3, 3), config=SSE)
    # small maps: the transformed weight would stream from memory; AVX-512 keeps Winograd on
    # 28x28 outputs (49 4x4 tiles), not on 14x14 (16)
    avx512 = dataclasses.replace(AVX512, winograd=True)
    assert reason((1, 256, 28, 28), (256, 256, 3, 3), config=avx512) is None
    small = reason((1, 256, 14, 14), (256, 256, 3, 3), config=avx512)
    assert "16 4x4 tiles" in small and "winograd_min_tiles=32" in small
    assert reason((1, 256, 14, 14), (256, 256, 3, 3), config=cpu_cfg(4)) is None  # no limit
    with pytest.raises(ValueError, match="winograd_min_tiles must be >= 0"):
        dataclasses.replace(SSE, winograd_min_tiles=-1)
    # 128 channels on most maps, 32 on maps of at least 400 4x4 tiles (80x80 and larger)
    wide = dataclasses.replace(avx512, winograd_min_channels=128, winograd_wide_tiles=400)
    assert "winograd_min_channels=128" in reason((1, 64, 56, 56), (64, 64, 3, 3), config=wide)
    assert reason((1, 64, 104, 104), (64, 64, 3, 3), config=wide) is None
    assert "winograd_wide_min_channels=32" in reason((1, 16, 104, 104), (64, 16, 3, 3), config=wide)
    assert reason((1, 128, 14, 14), (128, 128, 3, 3), config=wide) is not None  # min tiles
    for field, bad in (("winograd_wide_tiles", -1), ("winograd_wide_min_channels", 0)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(AVX512, **{field: bad})
    info = conv2d_shape_info((1, 64, 28, 28), (64, 64, 3, 3), (1, 1), (1,) * 4, (1, 1), 1)
    assert select_conv2d_algorithm(info, cfg) == "winograd"
    assert select_conv2d_algorithm(info, SSE) == "direct"
    assert select_conv2d_algorithm(info, OPENCL_GENERIC) == "direct"
    assert select_conv2d_algorithm(info, NVIDIA) == "direct"  # opt-in (see below)
    assert select_conv2d_algorithm(info, dataclasses.replace(NVIDIA, winograd=True)) == "winograd"
    pointwise = conv2d_shape_info((1, 64, 28, 28), (64, 64, 1, 1), (1, 1), (0,) * 4, (1, 1), 1)
    assert select_conv2d_algorithm(pointwise, cfg) == "gemm"
    # presets: off until measured on the device machine; tiles chosen per vector width
    assert not any(c.winograd for c in (AVX512, AVX2, NVIDIA, POCL, SSE, OPENCL_GENERIC))
    assert AVX512.winograd_tile == 4 and POCL.winograd_tile == 2
    with pytest.raises(ValueError, match="winograd_tile must be 2 or 4"):
        dataclasses.replace(SSE, winograd_tile=3)
    with pytest.raises(ValueError, match="do not match groups"):
        conv2d_shape_info((1, 6, 8, 8), (4, 4, 3, 3), (1, 1), (1,) * 4, (1, 1), 1)


def test_expected_impl_follows_the_selection():
    AVX512 = dataclasses.replace(AVX512_PRESET, winograd=True)
    NVIDIA = dataclasses.replace(NVIDIA_PRESET, winograd=True)
    conv = OpParams("conv2d", 28, 28, 64, 64, kernel=3, stride=1, padding=(1, 1, 1, 1))
    assert expected_impl(conv, "cpu", AVX512) == "winograd"
    assert expected_impl(conv, "gpu", NVIDIA) == "winograd"
    assert expected_impl(conv, "cpu") == "direct"  # no config: no Winograd
    assert expected_impl(conv, "gpu", OPENCL_GENERIC) == "direct"
    assert expected_impl(conv, "cpu", AVX512_PRESET) == "direct"  # the preset leaves it off
    strided = dataclasses.replace(conv, stride=2)
    assert expected_impl(strided, "cpu", AVX512) == "direct"
    pointwise = OpParams("conv2d", 28, 28, 64, 64, kernel=1)
    assert expected_impl(pointwise, "cpu", AVX512) == "gemm"
    narrow = OpParams("conv2d", 28, 28, 8, 64, kernel=3, padding=(1, 1, 1, 1))
    assert expected_impl(narrow, "cpu", AVX512) == "direct"


# ---------------------------------------------------------------------------------------------
# the Relax rewrite and the rules (structure, no device)


def test_pass_rewrites_qualifying_convs_only():
    mod, _, _ = conv_module((1, 32, 10, 10), 32, 1)
    p = Conv2DWinograd(LLVM, cpu=cpu_cfg(2))
    out = p(mod)
    assert p.decisions == {"conv": "winograd"}
    ops = {str(c.op.name) for c in relax_calls(out["main"]) if isinstance(c.op, tvm.ir.Op)}
    assert "relax.nn.conv2d" not in ops and "relax.call_tir" in ops
    for kwargs, why in [
        (dict(ksize=5), "5x5"),
        (dict(stride=2), "stride 2x2"),
        (dict(groups=4), "groups=4"),
    ]:
        mod, _, _ = conv_module((1, 32, 10, 10), 32, 1, **kwargs)
        p = Conv2DWinograd(LLVM, cpu=cpu_cfg(2))
        out = p(mod)
        assert why in p.decisions["conv"]
        assert "relax.nn.conv2d" in {str(c.op.name) for c in relax_calls(out["main"])}
    # a weight that is not a constant is left alone (no compile-time transform possible)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((32, 32, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, w, padding=1), name_hint="conv"))
        bb.emit_func_output(y)
    p = Conv2DWinograd(LLVM, cpu=cpu_cfg(2))
    p(bb.get())
    assert p.decisions == {"conv": "weight is not a constant"}
    with pytest.raises(ValueError, match="llvm and opencl targets, not 'c'"):
        Conv2DWinograd(Target({"kind": "c"}), LLVM)
    with pytest.raises(ValueError, match="cpu_target must be an llvm target"):
        Conv2DWinograd(POCL_TARGET, POCL_TARGET)


def relax_calls(func):
    """Every Relax call in ``func``, in post order."""
    found = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if isinstance(e, relax.Call) else None
    )
    return found


@pytest.mark.parametrize("tile", [2, 4])
def test_cpu_rule_applies_and_records(tile):
    mod, _, _ = conv_module((1, 32, 14, 14), 64, 1)
    with LLVM:
        legal = Conv2DWinograd(LLVM, cpu=cpu_cfg(tile))(mod)
        legal = tvm.transform.Sequential(legalize_passes(LLVM))(legal)
    (unscheduled,) = prim_funcs(legal).values()
    reasons = explain(unscheduled, LLVM)
    assert reasons["CPUWinograd"] is None
    assert "reduction blocks" in reasons["CPUConv2D"]
    mod = scheduled(mod, LLVM, cpu=cpu_cfg(tile))
    func = winograd_func(mod)
    assert func.attrs["codl.config"] == "sse"
    assert func.attrs["codl.parallel_extent"] > 1
    assert func.attrs["codl.vector_width"] > 1
    kinds = loop_kinds(func)
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED} <= kinds
    # the bias add and relu were fused after the conv and inlined into its write-back
    assert len(prim_funcs(mod)) == 1


def test_rules_decline_other_convs_with_reason():
    for kwargs in (dict(ksize=5), dict(stride=2), dict(groups=4)):
        mod, _, _ = conv_module((1, 32, 10, 10), 32, 1, **kwargs)
        with LLVM:
            mod = Conv2DWinograd(LLVM, cpu=cpu_cfg(2))(mod)
            mod = tvm.transform.Sequential(legalize_passes(LLVM))(mod)
        (func,) = prim_funcs(mod).values()
        cpu = explain(func, LLVM)
        assert "not a Winograd conv" in cpu["CPUWinograd"]
        assert cpu["CPUConv2D"] is None
        gpu = explain(func, POCL_TARGET)
        assert "not a Winograd conv" in gpu["OpenCLWinograd"]


@pytest.mark.parametrize("device", ["pocl", "nvidia"])
def test_opencl_rule_applies_and_compiles(device):
    target = DEVICE_TARGETS[device]
    cfg = opencl_config(target)  # both presets enable Winograd
    mod, _, _ = conv_module((1, 32, 9, 13), 48, 1)
    mod = scheduled(mod, target)
    func = winograd_func(mod)
    assert func.attrs["codl.config"] == cfg.name
    launches = kernel_launches(func)
    assert len(launches) == 3  # input transform, batched GEMM, inverse transform
    gemm = next(k for k in launches if "blockIdx.z" in k)
    assert gemm["blockIdx.z"] == (cfg.winograd_tile + 2) ** 2
    assert func.attrs["codl.workgroup_size"] == gemm["threadIdx.x"]
    assert 1 <= gemm["threadIdx.x"] <= cfg.max_workgroup_size
    src = opencl_source(tvm.compile(mod, target=target))
    assert src.count("__kernel void") >= 3


def test_presets_default_to_direct_until_measured():
    """Winograd is opt-in: no preset enables it before it was measured
    faster (the shipped cost models were trained on direct kernels)."""
    from codl_tvm.schedules import presets as c

    for cfg in (c.SSE, c.AVX2, c.AVX512, c.NEON, c.POCL, c.NVIDIA, c.ADRENO, c.MALI):
        assert cfg.winograd is False, cfg.name
    from .test_schedules_cpu import AVX512_TARGET

    with winograd_enabled(()):  # the module's fixture switched it on: off again here
        assert not cpu_config(AVX512_TARGET).winograd
        mod, _, _ = conv_module((1, 32, 10, 12), 32, 1)
        funcs = prim_funcs(scheduled(mod, AVX512_TARGET)).values()
        algos = {f.attrs.get("codl.algorithm") for f in funcs}
    assert "winograd" not in algos and "direct" in algos
    assert cpu_config(AVX512_TARGET).winograd  # inside the module's switch
    assert not opencl_config(DEVICE_TARGETS["generic"]).winograd  # not a candidate
    with pytest.raises(ValueError, match="unknown presets"):
        with winograd_enabled(["avx1024"]):
            pass


def test_presets_build_winograd_when_enabled():
    """AVX-512 and NEON presets with ``winograd=True`` select Winograd for a qualifying conv
    with their own tile; both compile (NEON is cross-compiled for aarch64, nothing runs)."""
    from codl_tvm.schedules import presets as c

    from .test_schedules_cpu import AVX512_TARGET, NEON_TARGET

    for target, preset in ((AVX512_TARGET, c.AVX512), (NEON_TARGET, c.NEON)):
        mod, _, _ = conv_module((1, 32, 24, 24), 32, 1)  # 36 4x4 tiles: above AVX-512's 32
        mod = scheduled(mod, target, cpu=dataclasses.replace(preset, winograd=True))
        func = winograd_func(mod)
        assert func.attrs["codl.config"] == preset.name
        tvm.compile(mod, target=target)


# ---------------------------------------------------------------------------------------------
# numerics on the CPU


CPU_CASES = [
    # (input shape, output channels, padding (t, l, b, r), tile, epilogue)
    ((1, 32, 12, 12), 32, (1, 1, 1, 1), 2, True),
    ((1, 32, 9, 11), 40, (1, 1, 1, 1), 4, True),  # odd H/W: partial tiles
    ((1, 33, 7, 6), 35, (0, 1, 2, 1), 2, False),  # asymmetric padding, odd channels
    ((2, 32, 5, 7), 32, (0, 0, 0, 0), 4, True),  # batch 2, no padding
    ((1, 64, 17, 3), 64, (2, 1, 0, 1), 2, True),
    ((1, 32, 6, 30), 16 * 3, (1, 1, 1, 1), 4, False),
    ((1, 128, 14, 14), 128, (1, 1, 1, 1), 4, True),  # deeper reduction: F(4x4) rounding
]
FAST_CPU = {0, 1}


def _run_cpu(xshape, oc, padding, tile, epilogue, seed=0):
    mod, w, b = conv_module(xshape, oc, padding, epilogue, seed=seed)
    cfg = cpu_cfg(tile)
    built = runner.build(mod, "cpu", target=LLVM, relax_pipeline=single_device_pipeline(LLVM, cfg))
    x = np.random.default_rng(seed + 1).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, padding, epilogue))


@pytest.mark.parametrize(
    "case",
    [
        c if i in FAST_CPU else pytest.param(c, marks=pytest.mark.slow)
        for i, c in enumerate(CPU_CASES)
    ],
    ids=lambda c: f"{c[0]}-oc{c[1]}-p{c[2]}-m{c[3]}",
)
def test_cpu_winograd_matches_numpy(case):
    _run_cpu(*case)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(32, 40),
    k=st.integers(32, 40),
    h=st.integers(4, 13),
    w=st.integers(4, 13),
    pad=st.tuples(*[st.integers(0, 2)] * 4),
    tile=st.sampled_from([2, 4]),
    epilogue=st.booleans(),
)
def test_cpu_winograd_property(c, k, h, w, pad, tile, epilogue):
    if h + pad[0] + pad[2] - 2 < tile or w + pad[1] + pad[3] - 2 < tile:
        return  # too small for one tile: not selected (covered by test_selection_reasons)
    _run_cpu((1, c, h, w), k, pad, tile, epilogue)


# ---------------------------------------------------------------------------------------------
# numerics on the local OpenCL device


OPENCL_CASES = [
    ("pocl", (1, 32, 9, 11), 40, (1, 1, 1, 1), True),
    ("pocl", (1, 33, 6, 5), 32, (0, 1, 2, 1), False),
    ("nvidia", (1, 32, 9, 11), 40, (1, 1, 1, 1), True),
    ("adreno", (1, 32, 13, 7), 36, (1, 1, 1, 1), True),
    ("mali", (2, 32, 8, 8), 32, (1, 1, 1, 1), True),
]


@pytest.mark.opencl
@pytest.mark.parametrize(
    "case",
    [c if i == 0 else pytest.param(c, marks=pytest.mark.slow) for i, c in enumerate(OPENCL_CASES)],
    ids=lambda c: f"{c[0]}-{c[1]}-oc{c[2]}",
)
def test_opencl_winograd_matches_numpy(opencl, case):
    device, xshape, oc, padding, epilogue = case
    target = DEVICE_TARGETS[device]
    mod, w, b = conv_module(xshape, oc, padding, epilogue)
    assert "winograd" in {
        f.attrs.get("codl.algorithm") for f in prim_funcs(scheduled(mod, target)).values()
    }
    built = runner.build(mod, "opencl", target=target)
    x = np.random.default_rng(3).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, padding, epilogue))


# ---------------------------------------------------------------------------------------------
# co-executed parts: H parts with halo rows, OC parts with sliced weights


AVX2_TARGET = Target({"kind": "llvm", "mcpu": "haswell"})  # AVX2 preset: Winograd F(4x4)


def _host_has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


needs_avx2 = pytest.mark.skipif(not _host_has_avx2(), reason="the CPU parts are built for AVX2")


def _coexec_decisions(mod, plan, gpu, cpu):
    """Which parts the co-execution pipeline's algorithm phase turns into Winograd convs."""
    p = Conv2DWinograd(gpu, cpu)
    with gpu:
        p(PartitionOperators(plan)(mod))
    return p.decisions


def built_algorithms(dump_dir) -> list[tuple[str, str]]:
    """(algorithm, config) of every scheduled kernel, from the pipeline's IR dump."""
    import re

    (schedule,) = [p for p in dump_dir.iterdir() if p.name.endswith("-schedule.py")]
    text = schedule.read_text()
    return re.findall(r'"codl.algorithm": "(\w+)", "codl.config": "([\w-]+)"', text)


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("dim", "ratio"),
    [
        ("H", 0.5),
        pytest.param("OC", 0.5, marks=pytest.mark.slow),
        pytest.param("H", 0.3, marks=pytest.mark.slow),
    ],
)
@needs_avx2
def test_coexec_parts_use_winograd(opencl, dim, ratio, tmp_path, monkeypatch):
    mod, w, b = conv_module((1, 32, 12, 11), 64, (1, 1, 1, 1))
    plan = uniform_plan(mod, dim, ratio)
    decisions = _coexec_decisions(mod, plan, POCL_TARGET, AVX2_TARGET)
    assert sorted(decisions.values()) == ["winograd", "winograd"], decisions
    assert any("_gpu_" in n for n in decisions) and any("_cpu_" in n for n in decisions)
    x = np.random.default_rng(5).standard_normal((1, 32, 12, 11)).astype("float32")
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    got = codl_tvm.compile(mod, plan, gpu=POCL_TARGET, cpu=AVX2_TARGET)([x])[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    # the build's kernels: one Winograd conv per processor, each with its processor's preset
    built = built_algorithms(tmp_path)
    assert ("winograd", "pocl") in built and ("winograd", "avx2") in built, built
    # against the unpartitioned direct conv and against numpy
    direct = runner.build(mod, "cpu")([x])[0]
    assert_close(got, direct)
    assert_close(got, reference(x, w, b, (1, 1, 1, 1)))


@pytest.mark.opencl
@pytest.mark.slow
@needs_avx2
def test_coexec_chain_with_halo_rows_uses_winograd(opencl):
    """Two chained 3x3 convs split along H: each part recomputes halo rows of the first conv."""
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((40, 32, 3, 3)) * 0.2).astype("float32")
    w2 = (rng.standard_normal((36, 40, 3, 3)) * 0.2).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 32, 14, 9), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w1), padding=1)))
            y = bb.emit_output(bb.emit(relax.op.nn.conv2d(y, relax.const(w2), padding=(0, 1))))
        bb.emit_func_output(y)
    mod = bb.get()
    ops = [o.op for o in uniform_plan(mod, "H", 0.5).ops]
    plan = PartitionPlan(chains=(ChainPlan(tuple(ops), "H", 0.45),))
    decisions = _coexec_decisions(mod, plan, POCL_TARGET, AVX2_TARGET)
    assert list(decisions.values()) == ["winograd"] * 4, decisions
    xv = rng.standard_normal((1, 32, 14, 9)).astype("float32")
    got = codl_tvm.compile(mod, plan, gpu=POCL_TARGET, cpu=AVX2_TARGET)([xv])[0]
    mid = np.maximum(conv2d_ref(xv, w1, (1, 1), (1, 1, 1, 1), (1, 1), 1), 0)
    assert_close(got, conv2d_ref(mid.astype("float32"), w2, (1, 1), (0, 1, 0, 1), (1, 1), 1))


@pytest.mark.opencl
@pytest.mark.slow
@needs_avx2
def test_coexec_mixes_winograd_and_direct_parts(opencl):
    """A one-row GPU part is too small for a tile (direct); the CPU part is Winograd."""
    mod, w, b = conv_module((1, 32, 16, 10), 40, (1, 1, 1, 1))
    plan = uniform_plan(mod, "H", 1 / 16)
    decisions = _coexec_decisions(mod, plan, POCL_TARGET, AVX2_TARGET)
    gpu = [v for n, v in decisions.items() if "_gpu_" in n]
    cpu = [v for n, v in decisions.items() if "_cpu_" in n]
    assert cpu == ["winograd"] and "smaller than one 2x2 tile" in gpu[0], decisions
    x = np.random.default_rng(9).standard_normal((1, 32, 16, 10)).astype("float32")
    got = codl_tvm.compile(mod, plan, gpu=POCL_TARGET, cpu=AVX2_TARGET)([x])[0]
    assert_close(got, reference(x, w, b, (1, 1, 1, 1)))


@pytest.mark.opencl
@pytest.mark.slow
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    c=st.integers(32, 36),
    k=st.integers(32, 36),
    h=st.integers(4, 11),
    w=st.integers(4, 11),
    pad=st.tuples(*[st.integers(0, 2)] * 4),
    device=st.sampled_from(["pocl", "nvidia"]),
)
def test_opencl_winograd_property(opencl, c, k, h, w, pad, device):
    target = DEVICE_TARGETS[device]
    tile = opencl_config(target).winograd_tile
    if h + pad[0] + pad[2] - 2 < tile or w + pad[1] + pad[3] - 2 < tile:
        return  # too small for one tile: not selected
    mod, wt, b = conv_module((1, c, h, w), k, pad, seed=c + k)
    x = np.random.default_rng(h * w).standard_normal((1, c, h, w)).astype("float32")
    got = runner.build(mod, "opencl", target=target)([x])[0]
    assert_close(got, reference(x, wt, b, pad))


def test_coexec_part_config_is_per_processor():
    """A CPU part follows the CPU's config, a GPU part the GPU's: Winograd only where enabled."""
    mod, _, _ = conv_module((1, 32, 12, 11), 64, (1, 1, 1, 1))
    plan = uniform_plan(mod, "H", 0.5)
    generic_gpu = DEVICE_TARGETS["generic"]  # OPENCL_GENERIC: Winograd off
    decisions = _coexec_decisions(mod, plan, generic_gpu, AVX2_TARGET)
    gpu = [v for n, v in decisions.items() if "_gpu_" in n]
    cpu = [v for n, v in decisions.items() if "_cpu_" in n]
    assert cpu == ["winograd"] and len(gpu) == 1 and "disabled" in gpu[0]
