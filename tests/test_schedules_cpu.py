"""CPU schedule rules: numerics against numpy and structure of the scheduled TIR.

Numerics run the scheduled kernels on this machine's CPU (``llvm``, and ``skylake-avx512`` where
the host has AVX-512); structural tests only schedule, under ``with Target(...)``, so they also
cover ARM NEON without an ARM device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from codl_tvm.schedules import (
    AVX2,
    AVX512,
    NEON,
    SSE,
    CPUConv2D,
    CPUInjective,
    CPUReduction,
    apply_schedules,
    choose_row_width,
    cpu_config,
    cpu_overrides,
    explain,
    schedule_rules,
)
from codl_tvm.schedules.common import padded_row_width
from codl_tvm.schedules.config import CPUConfig
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax, s_tir, tirx
from tvm.target import Target

LLVM = Target({"kind": "llvm"})
AVX512_TARGET = Target({"kind": "llvm", "mcpu": "skylake-avx512"})
NEON_TARGET = Target({"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]})


def host_has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512bw" in flags


RUN_TARGETS = [LLVM, *([AVX512_TARGET] if host_has_avx512() else [])]


# ---------------------------------------------------------------------------------------------
# references and builders


def conv2d_ref(x, w, stride, padding, dilation, groups):
    """NCHW/OIHW conv2d in float64; padding is (top, left, bottom, right)."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, _, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    pt, pl, pb, pr = padding
    sh, sw = stride
    dh, dw = dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow))
    og = oc // groups
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[
                    :,
                    :,
                    ky * dh : ky * dh + sh * (oh - 1) + 1 : sh,
                    kx * dw : kx * dw + sw * (ow - 1) + 1 : sw,
                ]
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og : (g + 1) * og, :, ky, kx]
                )
    return out


def pool_ref(x, kind, window, stride, padding):
    kh, kw = window
    sh, sw = stride
    pt, pl, pb, pr = padding
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    wins = np.stack(
        [
            xp[:, :, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw]
            for i in range(kh)
            for j in range(kw)
        ]
    )
    return wins.max(0) if kind == "max" else wins.mean(0)


def _legalize(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def conv_module(xshape, wshape, stride, padding, dilation, groups, epilogue):
    """conv2d (+ bias add + relu when ``epilogue``) as Relax, like the ONNX frontend emits it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(xshape, "float32"))
    w = relax.Var("w", relax.TensorType(wshape, "float32"))
    b = relax.Var("b", relax.TensorType((1, wshape[0], 1, 1), "float32"))
    params = [x, w, b] if epilogue else [x, w]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x, w, strides=stride, padding=padding, dilation=dilation, groups=groups
                )
            )
            if epilogue:
                y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def schedule(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    mod = _legalize(mod)
    with target:
        return apply_schedules(target)(mod)


def prim_funcs(mod: tvm.IRModule) -> dict[str, tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def run(mod: tvm.IRModule, target: Target, inputs: list[np.ndarray]) -> np.ndarray:
    ex = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def loop_kinds(func: tirx.PrimFunc) -> set:
    kinds = set()
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda loop: kinds.add(loop.kind))])
    return kinds


def check_conv(xshape, wshape, stride, padding, dilation, groups, epilogue, target, seed=0):
    rng = np.random.default_rng(seed)
    mod = schedule(conv_module(xshape, wshape, stride, padding, dilation, groups, epilogue), target)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["tirx.is_scheduled"]
    x = rng.standard_normal(xshape).astype("float32")
    w = rng.standard_normal(wshape).astype("float32")
    b = rng.standard_normal((1, wshape[0], 1, 1)).astype("float32")
    ref = conv2d_ref(x, w, stride, padding, dilation, groups)
    inputs = [x, w]
    if epilogue:
        ref = np.maximum(ref + b, 0.0)
        inputs.append(b)
    out = run(mod, target, inputs)
    assert out.shape == ref.shape
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * scale)
    return func


# ---------------------------------------------------------------------------------------------
# conv2d numerics


CONV_CASES = [
    # (x shape, w shape, stride, padding, dilation, groups, expected algorithm)
    ((1, 8, 10, 10), (16, 8, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "direct"),
    ((1, 16, 13, 13), (24, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
    ((1, 8, 11, 9), (5, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, "direct"),
    ((1, 8, 11, 9), (8, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8, "depthwise"),
    ((1, 8, 12, 14), (8, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 8, "depthwise"),
    ((1, 8, 11, 9), (8, 2, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 4, "direct"),
    ((1, 8, 12, 12), (16, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8, "depthwise"),
    ((1, 4, 9, 23), (6, 4, 5, 5), (1, 2), (2, 1, 2, 3), (1, 1), 1, "direct"),
    ((1, 3, 17, 17), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, "direct"),
    ((2, 3, 1, 17), (7, 3, 1, 5), (1, 1), (0, 2, 0, 2), (1, 1), 1, "direct"),
    # parts of co-executed convs: one output row (H split), one or three channels (OC split)
    ((1, 16, 3, 20), (8, 16, 3, 3), (1, 1), (0, 1, 0, 1), (1, 1), 1, "direct"),
    ((1, 16, 2, 20), (8, 16, 3, 3), (1, 1), (1, 1, 0, 1), (1, 1), 1, "direct"),
    ((1, 16, 12, 12), (1, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, "direct"),
    ((1, 16, 5, 7), (3, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
    ((1, 16, 1, 1), (10, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
    ((1, 8, 6, 6), (4, 8, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, "direct"),
    # 1x1 GEMMs whose pixel count has no whole-register divisor: padded pixel axis
    ((1, 32, 17, 17), (40, 32, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
    ((2, 8, 5, 11), (12, 8, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
    ((1, 16, 7, 7), (33, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, "gemm"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{c[1]}-s{c[2][0]}-g{c[5]}")
@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
def test_conv2d_matches_numpy(case, target):
    xshape, wshape, stride, padding, dilation, groups, algorithm = case
    func = check_conv(xshape, wshape, stride, padding, dilation, groups, True, target)
    assert func.attrs["codl.algorithm"] == algorithm


@st.composite
def conv_params(draw):
    k = draw(st.sampled_from([1, 3, 5, 7]))
    stride = draw(st.sampled_from([1, 2]))
    dilation = draw(st.sampled_from([1, 1, 2]))
    kind = draw(st.sampled_from(["dense", "dense", "depthwise", "grouped"]))
    if kind == "depthwise":
        c = draw(st.integers(1, 8))
        oc, groups = c, c
    elif kind == "grouped":
        groups = 2
        c = 2 * draw(st.integers(1, 4))
        oc = 2 * draw(st.integers(1, 5))
    else:
        groups = 1
        c = draw(st.integers(1, 9))
        oc = draw(st.integers(1, 13))
    pads = tuple(draw(st.integers(0, min(3, k))) for _ in range(4))
    span = dilation * (k - 1) + 1
    h = draw(st.integers(max(1, span - pads[0] - pads[2]), 20))
    w = draw(st.integers(max(1, span - pads[1] - pads[3]), 24))
    epilogue = draw(st.booleans())
    wshape = (oc, c // groups, k, k)
    return (1, c, h, w), wshape, (stride, stride), pads, (dilation,) * 2, groups, epilogue


@settings(max_examples=12, deadline=None)
@given(params=conv_params())
def test_conv2d_hypothesis(params):
    xshape, wshape, stride, padding, dilation, groups, epilogue = params
    func = check_conv(xshape, wshape, stride, padding, dilation, groups, epilogue, LLVM)
    assert func.attrs["codl.algorithm"] in ("direct", "gemm", "depthwise")


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(params=conv_params())
def test_conv2d_hypothesis_avx512(params):
    if not host_has_avx512():
        pytest.skip("host has no AVX-512")
    check_conv(*params, AVX512_TARGET)


# ---------------------------------------------------------------------------------------------
# other operators


def _single_op_module(shape, fn):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(fn(x)))
        bb.emit_func_output(out)
    return bb.get()


POOL_CASES = [
    ("max", (1, 8, 21, 19), (3, 3), (2, 2), (1, 1, 1, 1)),
    ("max", (1, 5, 8, 8), (2, 2), (2, 2), (0, 0, 0, 0)),
    ("avg", (1, 6, 13, 13), (3, 3), (1, 1), (0, 0, 0, 0)),
    ("avg", (1, 6, 12, 30), (2, 2), (2, 2), (0, 0, 0, 0)),
]


@pytest.mark.parametrize("case", POOL_CASES)
def test_pool2d_matches_numpy(case):
    kind, shape, window, stride, padding = case
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    mod = schedule(_single_op_module(shape, lambda x: op(x, window, stride, padding)), LLVM)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "pool"
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(
        run(mod, LLVM, [x]), pool_ref(x, kind, window, stride, padding), rtol=1e-5, atol=1e-5
    )


def test_global_average_pool_matches_numpy():
    shape = (1, 32, 7, 9)
    mod = schedule(_single_op_module(shape, lambda x: relax.op.mean(x, axis=[2, 3])), LLVM)
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "reduction"
    x = np.random.default_rng(2).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(run(mod, LLVM, [x]), x.mean((2, 3)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n", [(1, 256, 100), (1, 64, 1000), (5, 33, 17), (3, 8, 1)])
def test_dense_matches_numpy(m, k, n):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((m, k), "float32"))
    b = relax.Var("b", relax.TensorType((k, n), "float32"))
    c = relax.Var("c", relax.TensorType((n,), "float32"))
    with bb.function("main", [a, b, c]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.matmul(a, b), c)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    target = RUN_TARGETS[-1]
    mod = schedule(bb.get(), target)
    algos = {f.attrs["codl.algorithm"] for f in prim_funcs(mod).values()}
    assert "matmul" in algos
    rng = np.random.default_rng(3)
    av, bv, cv = (rng.standard_normal(s).astype("float32") for s in [(m, k), (k, n), (n,)])
    ref = np.maximum(av.astype(np.float64) @ bv + cv, 0)
    np.testing.assert_allclose(run(mod, target, [av, bv, cv]), ref, rtol=1e-4, atol=1e-4)


def test_injective_chain_matches_numpy():
    shape = (1, 16, 30, 30)
    mod = schedule(
        _single_op_module(
            shape, lambda x: relax.op.nn.relu(relax.op.multiply(relax.op.add(x, x), x))
        ),
        LLVM,
    )
    (func,) = prim_funcs(mod).values()
    assert func.attrs["codl.algorithm"] == "injective"
    assert tirx.ForKind.PARALLEL in loop_kinds(func)
    x = np.random.default_rng(4).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(run(mod, LLVM, [x]), np.maximum(2 * x * x, 0), rtol=1e-6)


def test_small_cnn_matches_numpy():
    """conv-relu-maxpool-conv(1x1)-global pool-dense, scheduled end to end."""
    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 24, 24), "float32"))
    w1 = relax.Var("w1", relax.TensorType((8, 3, 3, 3), "float32"))
    w2 = relax.Var("w2", relax.TensorType((16, 8, 1, 1), "float32"))
    fc = relax.Var("fc", relax.TensorType((16, 10), "float32"))
    with bb.function("main", [x, w1, w2, fc]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w1, padding=1)))
            y = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, w2)))
            y = bb.emit(relax.op.mean(y, axis=[2, 3]))
            out = bb.emit_output(bb.emit(relax.op.matmul(y, fc)))
        bb.emit_func_output(out)
    mod = schedule(bb.get(), LLVM)
    assert all(f.attrs.get("tirx.is_scheduled") for f in prim_funcs(mod).values())
    vals = [
        rng.standard_normal(s).astype("float32")
        for s in [(1, 3, 24, 24), (8, 3, 3, 3), (16, 8, 1, 1), (16, 10)]
    ]
    y = np.maximum(conv2d_ref(vals[0], vals[1], (1, 1), (1,) * 4, (1, 1), 1), 0)
    y = pool_ref(y, "max", (2, 2), (2, 2), (0,) * 4)
    y = np.maximum(conv2d_ref(y, vals[2], (1, 1), (0,) * 4, (1, 1), 1), 0)
    ref = y.mean((2, 3)) @ vals[3]
    np.testing.assert_allclose(run(mod, LLVM, vals), ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# structure: rules apply or decline, loops are parallel and vectorised, configs per target


CODL_SHAPES = [
    # CoDL's conv shapes: (C, H, W) -> OC, kernel
    ((1, 64, 104, 104), (128, 64, 3, 3)),
    ((1, 1024, 13, 13), (1024, 1024, 3, 3)),
    ((1, 32, 112, 112), (64, 32, 3, 3)),
    ((1, 256, 52, 52), (128, 256, 1, 1)),
    ((1, 64, 56, 56), (64, 64, 3, 3)),
]


@pytest.mark.parametrize(
    "target", [LLVM, AVX512_TARGET, NEON_TARGET], ids=["generic", "avx512", "neon"]
)
@pytest.mark.parametrize("shapes", CODL_SHAPES, ids=lambda s: f"{s[0][1]}x{s[0][2]}-{s[1][0]}")
def test_codl_convs_parallel_and_vectorized(shapes, target):
    xshape, wshape = shapes
    pad = wshape[2] // 2
    with target:
        mod = schedule(conv_module(xshape, wshape, 1, pad, 1, 1, True), target)
    (func,) = prim_funcs(mod).values()
    kinds = loop_kinds(func)
    assert tirx.ForKind.PARALLEL in kinds and tirx.ForKind.VECTORIZED in kinds
    cfg = cpu_config(target)
    assert func.attrs["codl.config"] == cfg.name
    assert func.attrs["codl.parallel_extent"] >= 16
    row = xshape[2] * xshape[3] if wshape[2] == 1 else xshape[3]
    assert func.attrs["codl.vector_width"] == choose_row_width(
        row, cfg.lanes(32), cfg.max_row_vectors
    )
    assert func.attrs["codl.vector_width"] >= min(cfg.lanes(32) // 2, row)
    assert func.attrs["codl.algorithm"] == ("gemm" if wshape[2] == 1 else "direct")


def test_neon_conv_compiles_for_aarch64():
    mod = schedule(conv_module((1, 8, 14, 14), (16, 8, 3, 3), 1, 1, 1, 1, True), NEON_TARGET)
    ex = tvm.compile(mod, target=NEON_TARGET)
    assert "fused_conv2d_add_relu" in ex.mod.imports[0].inspect_source("ll")


def test_conv_rule_declines_with_reason():
    mod = _legalize(_single_op_module((1, 4, 8, 8), lambda x: relax.op.nn.max_pool2d(x, 2, 2)))
    (func,) = prim_funcs(mod).values()
    reasons = explain(func, LLVM)
    assert reasons["CPUConv2D"].startswith("not a conv2d")
    assert reasons["CPUReduction"] is None
    assert "has a reduction block" in reasons["CPUInjective"]
    conv = _legalize(conv_module((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, 1, 1, False))
    (conv_func,) = prim_funcs(conv).values()
    opencl = Target({"kind": "opencl"}, host={"kind": "llvm"})
    assert CPUConv2D().apply(conv_func, opencl, False) is None
    assert "target kind 'opencl'" in CPUConv2D().explain(conv_func, opencl)
    assert CPUInjective().apply(conv_func, LLVM, False) is None


def test_conv_rule_declines_dynamic_shapes():
    bb = relax.BlockBuilder()
    h = tirx.Var("h", "int64")
    x = relax.Var("x", relax.TensorType((1, 4, h, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, w, padding=1)))
        bb.emit_func_output(out)
    (func,) = prim_funcs(_legalize(bb.get())).values()
    reason = CPUConv2D().explain(func, LLVM)
    assert reason is not None and "dynamic" in reason


def test_configs_per_target():
    assert cpu_config(LLVM) is SSE
    assert cpu_config(AVX512_TARGET) is AVX512
    assert cpu_config(Target({"kind": "llvm", "mcpu": "haswell"})) is AVX2
    assert cpu_config(Target({"kind": "llvm", "mattr": ["+avx2"]})) is AVX2
    assert cpu_config(NEON_TARGET) is NEON
    assert AVX512.lanes(32) == 16 and NEON.lanes(32) == 4 and AVX2.lanes(16) == 16
    assert cpu_config(LLVM, conv_oc_tile=2).conv_oc_tile == 2
    with pytest.raises(ValueError, match="llvm target"):
        cpu_config(Target({"kind": "opencl"}))
    with pytest.raises(AttributeError):
        SSE.vector_bits = 256  # frozen


def test_cpu_overrides():
    with cpu_overrides(conv1x1_pad_pixels=False, conv_oc_tile=2):
        cfg = cpu_config(AVX512_TARGET)
        assert (cfg.name, cfg.conv1x1_pad_pixels, cfg.conv_oc_tile) == ("avx512", False, 2)
        assert not cpu_config(NEON_TARGET).conv1x1_pad_pixels
    assert cpu_config(AVX512_TARGET) is AVX512
    with pytest.raises(ValueError, match=r"\['bogus'\] not CPUConfig fields"):
        with cpu_overrides(bogus=1):
            pass


def test_schedule_settings_travel_as_one_object():
    """Rules get the build's settings when they are made, not from the context of ``apply``."""
    from codl_tvm.schedules import (
        ScheduleSettings,
        current_settings,
        packed_enabled,
        schedule_rules,
    )

    packed = ScheduleSettings(packed=frozenset({"avx512"}), cpu_overrides=(("conv_oc_tile", 8),))
    assert cpu_config(AVX512_TARGET, packed).conv_packed
    assert cpu_config(AVX512_TARGET, packed).conv_oc_tile == 8
    assert not cpu_config(NEON_TARGET, packed).conv_packed
    assert not cpu_config(AVX512_TARGET).conv_packed  # the default settings
    rules = schedule_rules(AVX512_TARGET, settings=packed)
    assert all(rule.settings is packed for rule in rules)
    plain = CPUConv2D()
    with packed_enabled("all") as inside:
        assert current_settings() is inside
        assert inside.packed == {"sse", "avx2", "avx512", "neon"}
        assert not plain.default_config(AVX512_TARGET).conv_packed  # made outside the block
        assert CPUConv2D().default_config(AVX512_TARGET).conv_packed
    assert current_settings() == ScheduleSettings()
    with pytest.raises(ValueError, match="unknown presets"):
        ScheduleSettings(packed=frozenset({"avx1024"}))
    with pytest.raises(ValueError, match="not CPUConfig fields"):
        ScheduleSettings(cpu_overrides=(("bogus", 1),))


def test_config_changes_schedule():
    custom = CPUConfig(name="custom", vector_bits=256, conv_oc_tile=2, conv_oh_tile=1)
    mod = _legalize(conv_module((1, 8, 16, 16), (8, 8, 3, 3), 1, 1, 1, 1, False))
    (func,) = prim_funcs(mod).values()
    sch = CPUConv2D(custom).apply(func, LLVM, False)
    scheduled = sch.mod["main"]
    assert scheduled.attrs["codl.config"] == "custom"
    # 8 oc / 2 per tile * 16 rows * 1 row tile * (16 / 16 wide) tiles
    assert scheduled.attrs["codl.parallel_extent"] == 4 * 16
    assert scheduled.attrs["codl.vector_width"] == 16


@given(
    extent=st.integers(1, 600),
    lanes=st.sampled_from([4, 8, 16]),
    vectors=st.integers(1, 3),
    partial=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_choose_row_width(extent, lanes, vectors, partial):
    width = choose_row_width(extent, lanes, vectors, partial)
    assert 1 <= width <= max(extent, lanes)
    if extent <= lanes:
        assert width == extent
    elif width > lanes and width % lanes:
        # an odd multi-register vector only for a short row with no usable divisor
        assert width == extent <= lanes * vectors
    else:
        assert extent % width == 0 or (
            width == lanes and not any(extent % w == 0 for w in range(2, lanes + 1))
        )
    if not partial and width < lanes and extent > lanes * vectors:
        # a power-of-two fraction of a register when one (>= 4 lanes) divides the row
        pow2 = [1 << k for k in range(2, lanes.bit_length()) if extent % (1 << k) == 0]
        assert width in pow2 or not pow2


@pytest.mark.parametrize(
    "extent, lanes, vectors, expected",
    [
        (289, 16, 2, (16, 304)),  # 17x17: no divisor up to 16, a tail that runs scalar
        (289, 4, 4, (4, 292)),  # the same on NEON
        (49, 4, 4, (4, 52)),  # 7x7 on NEON: no divisor in 2..4
        (19, 16, 2, (32, 32)),  # one odd 19-lane vector across two registers
        (4225, 4, 4, (4, 4228)),  # 65x65 on NEON: a tail
        (169, 16, 2, None),  # 13x13: 13 of 16 lanes, no tail (padding measured slower)
        (49, 16, 2, None),  # 7x7: 7 of 16 lanes
        (3136, 16, 2, None),  # 56x56: whole registers divide it
        (9, 16, 2, None),  # one partial register
    ],
)
def test_padded_row_width(extent, lanes, vectors, expected):
    assert padded_row_width(extent, lanes, vectors) == expected


@given(extent=st.integers(1, 5000), lanes=st.sampled_from([4, 8, 16]), vectors=st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_padded_row_width_is_whole_registers(extent, lanes, vectors):
    result = padded_row_width(extent, lanes, vectors)
    if result is not None:
        width, padded = result
        assert width % lanes == 0 and width <= lanes * vectors
        assert padded % width == 0 and extent < padded < extent + width


def _predicated_blocks(func: tirx.PrimFunc) -> dict[str, bool]:
    """Block name -> whether its realize carries a predicate other than True."""
    found = {}

    def visit(node):
        found[node.block.name_hint] = not (
            isinstance(node.predicate, tirx.IntImm) and node.predicate.value == 1
        )

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlockRealize, visit)])
    return found


@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
def test_gemm_pads_pixels_to_whole_registers(pad):
    """A 17x17 1x1 conv on AVX-512: padded, the reduction has no bound check (so TVM keeps it
    vectorised); without padding it keeps the predicated tail that TVM runs scalar."""
    mod = _legalize(conv_module((1, 64, 17, 17), (32, 64, 1, 1), 1, 0, 1, 1, True))
    (func,) = prim_funcs(mod).values()
    with cpu_overrides(conv1x1_pad_pixels=pad):
        scheduled = CPUConv2D().apply(func, AVX512_TARGET, False).mod["main"]
    assert scheduled.attrs["codl.algorithm"] == "gemm"
    assert scheduled.attrs["codl.vector_width"] == 16
    predicated = _predicated_blocks(scheduled)
    update = [name for name in predicated if name.endswith("_update")]
    assert len(update) == 1
    assert predicated[update[0]] is (not pad)
    shapes = [tuple(int(d) for d in b.shape) for b in scheduled.body.block.alloc_buffers]
    assert ((1, 64, 304) in shapes) is pad and ((1, 32, 304) in shapes) is pad


def test_choose_row_width_rejects_bad_input():
    with pytest.raises(ValueError, match="extent=0"):
        choose_row_width(0, 16, 2)


def test_other_rules_decline_conv():
    conv = _legalize(conv_module((1, 4, 8, 8), (4, 4, 3, 3), 1, 1, 1, 1, False))
    (conv_func,) = prim_funcs(conv).values()
    # The generic reduction rule could schedule a conv, but CPUConv2D comes first in the list.
    rules = [type(r).__name__ for r in schedule_rules(LLVM)]
    assert rules[0] == "CPUConv2D"
    assert CPUReduction().apply(conv_func, LLVM, False) is not None


@pytest.mark.parametrize("dim", ["H", "OC"])
@pytest.mark.parametrize("ratio", [0.4, 0.93])
def test_partitioned_parts_get_conv_schedules(dim, ratio):
    """The parts made by the co-execution pass are ordinary convs and keep fast schedules."""
    from codl_tvm.passes import PartitionOperators

    from codl_tvm.core.plan import uniform_plan

    xshape, wshape = (1, 8, 15, 13), (12, 8, 3, 3)
    mod = conv_module(xshape, wshape, (2, 2), (1, 1, 1, 1), (1, 1), 1, True)
    split = PartitionOperators(uniform_plan(mod, dim, ratio))(mod)
    scheduled = schedule(split, LLVM)
    convs = [
        f
        for f in prim_funcs(scheduled).values()
        if f.attrs.get("codl.algorithm") in ("direct", "gemm", "depthwise")
    ]
    assert len(convs) == 2
    for func in convs:
        kinds = loop_kinds(func)
        assert tirx.ForKind.VECTORIZED in kinds
    rng = np.random.default_rng(6)
    x = rng.standard_normal(xshape).astype("float32")
    w = rng.standard_normal(wshape).astype("float32")
    b = rng.standard_normal((1, 12, 1, 1)).astype("float32")
    ref = np.maximum(conv2d_ref(x, w, (2, 2), (1,) * 4, (1, 1), 1) + b, 0)
    np.testing.assert_allclose(run(scheduled, LLVM, [x, w, b]), ref, rtol=1e-4, atol=1e-4)


def writes_out_of_bounds(func: tirx.PrimFunc) -> list[str]:
    """Blocks whose write region, over their iteration domain, leaves the written buffer."""
    from tvm import s_tir, sym

    bad = []

    def visit(block):
        ana = sym.Analyzer()
        for iv in block.iter_vars:
            ana.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
        for region in block.writes:
            for dim, (rng, size) in enumerate(zip(region.region, region.source.shape)):
                hi = ana.const_int_bound(rng.min + rng.extent - 1).max_value
                if hi >= int(size):
                    bad.append(
                        f"{block.name_hint} writes {region.source.name}[dim {dim}] up to {hi}"
                    )

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)])
    return bad


def conv_slice_module():
    """conv 7x7/2 + relu + the row slice the next operator's part reads (Inception v1's stem
    before a co-executed max pool): FuseOps fuses the slice after the conv."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 32, 32), "float32"))
    w = relax.Var("w", relax.TensorType((8, 3, 7, 7), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, strides=2, padding=3)))
            y = bb.emit(relax.op.strided_slice(y, axes=[2], begin=[0], end=[15]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def test_sliced_epilogue_stays_in_bounds():
    """A slice epilogue reads 15 of the conv's 16 rows: inlined into the write-back it made TVM
    write all 16 rows into the 15-row output (a heap corruption found on Inception v1)."""
    mod = schedule(conv_slice_module(), LLVM)
    (func,) = [f for name, f in prim_funcs(mod).items() if "conv2d" in name]
    assert func.attrs["codl.algorithm"] == "direct"
    assert writes_out_of_bounds(func) == []
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 32, 32)).astype("float32")
    w = (rng.standard_normal((8, 3, 7, 7)) * 0.1).astype("float32")
    want = np.maximum(conv2d_ref(x, w, (2, 2), (3, 3, 3, 3), (1, 1), 1), 0)[:, :, :15]
    np.testing.assert_allclose(run(mod, LLVM, [x, w]), want, rtol=1e-4, atol=1e-4)
