"""Channel-packed CPU conv: weight packing, selection, tiles, rule, numerics, defaults.

Numerics compare against a float64 numpy conv (``conv2d_ref``) with the bias and relu the ONNX
frontend fuses after it; tolerance ``1e-4 * max(1, max|ref|)``.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from codl_tvm.passes.winograd import Conv2DWinograd
from codl_tvm.schedules import (
    AVX512,
    NEON,
    SSE,
    conv2d_shape_info,
    cpu_config,
    explain,
    pack_weight,
    packed_enabled,
    packed_reason,
)
from codl_tvm.schedules.packed import packed_blocks, packed_tile, pointwise_chunk
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax, tirx

import codl_tvm
from codl_tvm.build import runner
from codl_tvm.build.pipeline import legalize_passes, single_device_pipeline
from codl_tvm.core.plan import uniform_plan
from codl_tvm.cost_model.features import OpParams
from codl_tvm.planner.split.search import expected_impl

from .test_schedules_cpu import (
    AVX512_TARGET,
    LLVM,
    NEON_TARGET,
    RUN_TARGETS,
    conv2d_ref,
    host_has_avx512,
    loop_kinds,
    prim_funcs,
)
from .test_winograd import (
    AVX2_TARGET,
    POCL_TARGET,
    assert_close,
    built_algorithms,
    needs_avx2,
    relax_calls,
    scheduled,
)


def packed_cfg(base=SSE, **kw):
    """``base`` with packed convs on; the channel thresholds off unless given (small shapes)."""
    kw = {"packed_min_in_channels": 1, "packed_min_gemm_channels": 1, **kw}
    return dataclasses.replace(base, conv_packed=True, **kw)


def conv_module(xshape, oc, *, ksize=3, stride=1, padding=1, dilation=1, groups=1, residual=False):
    """conv + bias + relu (+ a residual input added before the relu), constant weights."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((oc, xshape[1] // groups, ksize, ksize)) * 0.3).astype("float32")
    b = (rng.standard_normal((1, oc, 1, 1)) * 0.1).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(xshape, "float32"))
    params = [x]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(
                    x,
                    relax.const(w),
                    strides=stride,
                    padding=padding,
                    dilation=dilation,
                    groups=groups,
                ),
                name_hint="conv",
            )
            y = bb.emit(relax.op.add(y, relax.const(b)))
            if residual:
                y = bb.emit(relax.op.add(y, y))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get(), w, b


def _pads(padding) -> tuple[int, int, int, int]:
    return tuple(padding) if isinstance(padding, tuple) else (padding,) * 4


def reference(x, w, b, stride, padding, dilation, residual=False):
    y = conv2d_ref(x, w, (stride, stride), _pads(padding), (dilation, dilation), 1) + b
    return np.maximum(2 * y if residual else y, 0)


def algorithms(mod) -> list[str]:
    return sorted(str(f.attrs.get("codl.algorithm")) for f in prim_funcs(mod).values())


# ---------------------------------------------------------------------------------------------
# packing, selection, tiles


def test_pack_weight_layout():
    w = np.arange(32 * 3 * 2 * 2, dtype="float32").reshape(32, 3, 2, 2)
    p = pack_weight(w, 16)
    assert p.shape == (2, 3, 2, 2, 16) and p.flags.c_contiguous
    for k in (0, 5, 16, 31):
        np.testing.assert_array_equal(p[k // 16, :, :, :, k % 16], w[k])
    p = pack_weight(w[:30], 16)  # the last block is zero padding
    assert p.shape == (2, 3, 2, 2, 16)
    np.testing.assert_array_equal(p[1, :, :, :, 13], w[29])
    assert not p[1, :, :, :, 14:].any()


def test_selection_reasons():
    cfg = dataclasses.replace(AVX512, conv_packed=True)  # the preset's thresholds

    def reason(data, weight, stride=1, pad=1, groups=1, config=cfg):
        info = conv2d_shape_info(data, weight, (stride, stride), (pad,) * 4, (1, 1), groups)
        return packed_reason(info, config)

    assert reason((1, 512, 7, 7), (512, 512, 3, 3)) is None
    assert reason((1, 1024, 14, 14), (256, 1024, 1, 1), pad=0) is None  # small 1x1
    assert reason((1, 1024, 14, 14), (2048, 1024, 1, 1), stride=2, pad=0) is None  # strided 1x1
    assert "gemm schedule" in reason((1, 64, 56, 56), (256, 64, 1, 1), pad=0)
    assert reason((1, 512, 13, 13), (1000, 512, 1, 1), pad=0) is None  # padded to 63 blocks
    assert "fewer than one 16-lane vector" in reason((1, 64, 13, 13), (8, 64, 3, 3))
    assert "groups=4" in reason((1, 64, 14, 14), (64, 16, 3, 3), groups=4)
    assert "packed_min_in_channels=48" in reason((1, 3, 224, 224), (64, 3, 7, 7), stride=2)
    assert "packed_min_in_channels=48" in reason((1, 32, 27, 27), (128, 32, 3, 3))
    assert "packed_min_gemm_channels=256" in reason((1, 64, 13, 13), (256, 64, 1, 1), pad=0)
    assert "disabled" in reason((1, 512, 7, 7), (512, 512, 3, 3), config=AVX512)
    # NEON has 4 lanes: 12 channels qualify there, not on AVX-512
    assert reason((1, 64, 7, 7), (12, 64, 3, 3), config=packed_cfg(NEON)) is None
    assert "fewer than one 16-lane vector" in reason((1, 64, 7, 7), (12, 64, 3, 3))
    # off in every preset: the CPU-alone default switches it on (below)
    assert not any(c.conv_packed for c in (SSE, AVX512, NEON))
    with pytest.raises(ValueError, match="packed_oc_vectors must be >= 1"):
        packed_cfg(packed_oc_vectors=0)
    # by reduction length, strided convs with any channels (off in the presets)
    red = dataclasses.replace(cfg, packed_min_reduction=400, packed_strided=True)
    assert reason((1, 3, 224, 224), (64, 3, 7, 7), stride=2, config=red) is None  # a stem
    assert "packed_min_reduction=400" in reason(
        (1, 3, 224, 224), (64, 3, 7, 7), config=dataclasses.replace(red, packed_strided=False)
    )
    assert reason((1, 16, 27, 27), (32, 16, 5, 5), pad=2, config=red) is None  # 400
    assert "= 144 multiply-adds" in reason((1, 16, 55, 55), (64, 16, 3, 3), config=red)
    assert reason((1, 48, 13, 13), (192, 48, 3, 3), config=red) is None  # 432, as before
    # 1x1 stride-1 convs keep the channel and GEMM rules
    assert "packed_min_in_channels=48" in reason((1, 32, 7, 7), (64, 32, 1, 1), pad=0, config=red)
    assert "gemm schedule" in reason((1, 64, 56, 56), (256, 64, 1, 1), pad=0, config=red)


def test_expected_impl_follows_the_selection():
    conv = OpParams("conv2d", 7, 7, 512, 512, kernel=3, stride=1, padding=(1, 1, 1, 1))
    assert expected_impl(conv, "cpu", packed_cfg(AVX512)) == "packed"
    assert expected_impl(conv, "cpu", AVX512) == "direct"
    assert expected_impl(conv, "gpu", packed_cfg(AVX512)) == "direct"
    big = OpParams("conv2d", 56, 56, 64, 256, kernel=1)
    assert expected_impl(big, "cpu", packed_cfg(AVX512)) == "gemm"


@pytest.mark.parametrize(
    "shape, lanes, tile",
    [
        ((512, 7, 7), 16, (2, 1, 7)),  # 14 accumulators
        ((256, 14, 14), 16, (2, 1, 7)),  # a tie with 1 x 14 goes to more channel vectors
        ((64, 56, 56), 16, (2, 1, 8)),
        ((16, 13, 13), 16, (1, 1, 13)),  # one channel block, prime width
        ((32, 13, 13), 16, (1, 1, 13)),  # 2 x 13 would not fit; 2 x 1 x 6 wastes more
        ((512, 17, 17), 16, (2, 2, 4)),  # prime width: tiles with a tail, not 1 column
        ((1024, 1, 289), 16, (2, 1, 8)),  # a pointwise conv's flattened 17x17 image
    ],
)
def test_tile_choice(shape, lanes, tile):
    assert packed_tile(*shape, lanes, AVX512) == tile


EXACT = dataclasses.replace(AVX512, packed_exact_tiles=True)


@pytest.mark.parametrize(
    "shape, cfg, tile, without",
    [
        # 196 pixels: 2 x 8 leaves a 4-pixel tail, 2 x 7 divides them
        ((1024, 1, 196), EXACT, (2, 1, 7), (2, 1, 8)),
        ((1024, 1, 196), dataclasses.replace(EXACT, packed_oc_vectors=4), (4, 1, 4), (4, 1, 4)),
        ((1024, 1, 196), dataclasses.replace(EXACT, max_tile_bytes=2048), (2, 1, 14), (2, 1, 14)),
        ((256, 1, 169), EXACT, (1, 1, 13), (2, 1, 8)),  # 13 x 13: 13 of 16 accumulators
        ((64, 1, 3136), EXACT, (2, 1, 8), (2, 1, 8)),  # the best tile has no tail anyway
        ((128, 27, 27), EXACT, (1, 1, 9), (2, 2, 4)),
        # 113 (prime): the best exact tile (1 column) has 2 of 16 accumulators: keep the tail
        ((32, 1, 113), EXACT, (2, 1, 8), (2, 1, 8)),
    ],
)
def test_exact_tile_choice(shape, cfg, tile, without):
    assert packed_tile(*shape, 16, cfg) == tile
    assert packed_tile(*shape, 16, dataclasses.replace(cfg, packed_exact_tiles=False)) == without


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(1, 64),
    oh=st.integers(1, 60),
    ow=st.integers(1, 300),
    cfg=st.sampled_from([AVX512, SSE, NEON, EXACT]),
)
def test_tile_fits_registers(blocks, oh, ow, cfg):
    lanes = cfg.lanes(32)
    ot, rows, cols = packed_tile(blocks * lanes, oh, ow, lanes, cfg)
    budget = min(cfg.max_accumulators, cfg.max_tile_bytes // (4 * lanes))
    assert 1 <= ot * rows * cols <= max(1, budget)
    assert ot * lanes * rows * cols * 4 <= cfg.max_tile_bytes
    assert blocks % ot == 0 and ot <= cfg.packed_oc_vectors
    assert rows <= oh and cols <= ow
    # tails never waste more than half of a tile's iterations
    assert oh / (-(-oh // rows) * rows) >= 0.5 and ow / (-(-ow // cols) * cols) >= 0.5


# ---------------------------------------------------------------------------------------------
# the Relax rewrite and the rule (structure)


def test_pass_rewrites_and_records_decisions():
    mod, _, _ = conv_module((1, 32, 7, 7), 32)
    p = Conv2DWinograd(LLVM, cpu=packed_cfg())
    out = p(mod)
    assert p.decisions == {"conv": "packed"}
    ops = {str(c.op.name) for c in relax_calls(out["main"]) if isinstance(c.op, tvm.ir.Op)}
    assert "relax.nn.conv2d" not in ops
    # a constant of the packed layout replaced the OIHW weight
    consts = []
    relax.analysis.post_order_visit(
        out["main"].body,
        lambda e: (
            consts.append(e.value.shape)
            if isinstance(e, tvm.ir.Constant) and hasattr(e.value, "shape")
            else None
        ),
    )
    consts = [tuple(int(v) for v in shape) for shape in consts]
    assert (8, 32, 3, 3, 4) in consts  # SSE: 4 lanes
    # declined convs keep conv2d and say why (Winograd's reason, then the packed one)
    mod, _, _ = conv_module((1, 32, 7, 7), 32, groups=4)
    p = Conv2DWinograd(LLVM, cpu=packed_cfg())
    p(mod)
    assert "not packed: groups=4" in p.decisions["conv"]
    p = Conv2DWinograd(LLVM, cpu=SSE)  # packed off: the pass leaves the module alone
    mod, _, _ = conv_module((1, 32, 7, 7), 32)
    assert p(mod).same_as(mod) and "disabled" in p.decisions["conv"]


def test_rule_applies_and_records():
    mod, _, _ = conv_module((1, 64, 7, 7), 64, residual=True)
    cfg = packed_cfg(AVX512)
    with AVX512_TARGET:
        legal = Conv2DWinograd(AVX512_TARGET, cpu=cfg)(mod)
        legal = tvm.transform.Sequential(legalize_passes(AVX512_TARGET))(legal)
    (func,) = prim_funcs(legal).values()  # bias, residual add and relu fused after the conv
    reasons = explain(func, AVX512_TARGET)
    assert reasons["CPUPackedConv2D"] is None
    plain = tvm.transform.Sequential(legalize_passes(AVX512_TARGET))(_plain())
    (direct,) = prim_funcs(plain).values()
    assert "not a packed conv" in explain(direct, AVX512_TARGET)["CPUPackedConv2D"]
    out = scheduled(mod, AVX512_TARGET, cpu=cfg)
    (func,) = prim_funcs(out).values()
    assert func.attrs["codl.algorithm"] == "packed" and func.attrs["codl.config"] == "avx512"
    assert func.attrs["codl.vector_width"] == 16
    # 64 channels = 4 blocks of 16, 2 per tile; 7 rows; one 7-column tile per row
    assert func.attrs["codl.parallel_extent"] == 2 * 7
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED} <= loop_kinds(
        func
    )
    tvm.compile(out, target=AVX512_TARGET)


def _plain():
    mod, _, _ = conv_module((1, 32, 7, 7), 32)
    return mod


def test_neon_packed_conv_compiles_for_aarch64():
    mod, _, _ = conv_module((1, 32, 14, 14), 64, stride=2)
    out = scheduled(mod, NEON_TARGET, cpu=packed_cfg(NEON))
    assert algorithms(out) == ["packed"]
    assert prim_funcs(out).popitem()[1].attrs["codl.vector_width"] == 4
    tvm.compile(out, target=NEON_TARGET)


# ---------------------------------------------------------------------------------------------
# numerics


CASES = [
    # (x shape, oc, kernel, stride, padding, dilation, residual)
    ((1, 32, 7, 7), 64, 3, 1, 1, 1, False),
    ((2, 32, 9, 11), 32, 3, 2, (0, 1, 2, 1), 1, True),  # batch 2, stride 2, asymmetric pad
    ((1, 64, 14, 14), 32, 1, 1, 0, 1, False),  # small 1x1 (GEMM size)
    ((1, 48, 13, 10), 16, 1, 2, 0, 1, True),  # strided 1x1
    ((1, 16, 10, 10), 16, 3, 1, 2, 2, False),  # dilation 2
    ((1, 24, 5, 23), 48, 5, 1, (2, 1, 2, 3), 1, False),  # 5x5, uneven width
    ((1, 32, 9, 9), 45, 3, 1, 1, 1, True),  # channels padded to whole vectors (an OC part)
    ((1, 64, 6, 7), 37, 1, 1, 0, 1, False),  # ... on a pointwise conv
    ((1, 3, 23, 21), 32, 3, 2, 1, 1, False),  # a 3-channel stride-2 stem
]


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-oc{c[1]}-k{c[2]}-s{c[3]}")
def test_packed_conv_matches_numpy(case, target):
    xshape, oc, k, stride, padding, dilation, residual = case
    mod, w, b = conv_module(
        xshape, oc, ksize=k, stride=stride, padding=padding, dilation=dilation, residual=residual
    )
    cfg = packed_cfg(cpu_config(target))
    out = scheduled(mod, target, cpu=cfg)
    assert algorithms(out) == ["packed"]  # epilogues (and a channel slice) in one kernel
    (func,) = prim_funcs(out).values()
    assert {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED} <= loop_kinds(func)
    built = runner.build(
        mod, "cpu", target=target, relax_pipeline=single_device_pipeline(target, cfg)
    )
    x = np.random.default_rng(3).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, stride, padding, dilation, residual))


def test_packed_blocks_round_to_whole_tiles_only_where_cheap():
    on = dataclasses.replace(AVX512, packed_round_blocks=True)
    assert packed_blocks(1000, 16, AVX512) == 63  # off in the preset
    assert packed_blocks(1000, 16, on) == 64  # 1000 classes: one zero block, 2-vector tiles
    assert packed_blocks(48, 16, on) == 3  # a fourth block would add a third: kept
    assert packed_blocks(64, 16, on) == 4
    assert packed_blocks(17 * 16, 16, dataclasses.replace(on, packed_oc_vectors=1)) == 17
    p = pack_weight(np.ones((1000, 2, 1, 1), "float32"), 16, 64)
    assert p.shape == (64, 2, 1, 1, 16) and not p[62, :, :, :, 8:].any() and not p[63].any()
    with pytest.raises(ValueError, match="fewer than 1000 channels"):
        pack_weight(np.ones((1000, 2, 1, 1), "float32"), 16, 62)


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
@pytest.mark.parametrize("ksize", [1, 3])
def test_rounded_blocks_conv_matches_numpy(target, ksize):
    """17 blocks less 3 channels: computed as 18 blocks in 2-vector tiles, sliced back."""
    lanes = cpu_config(target).lanes(32)
    oc = 17 * lanes - 3
    xshape = (1, 8, 5, 6)
    mod, w, b = conv_module(xshape, oc, ksize=ksize, padding=ksize // 2)
    cfg = packed_cfg(cpu_config(target), packed_round_blocks=True)
    out = scheduled(mod, target, cpu=cfg)
    assert algorithms(out) == ["packed"]
    (func,) = prim_funcs(out).values()
    assert "T.Buffer((T.int64(18), T.int64(8)" in func.script()  # the packed weight
    built = runner.build(
        mod, "cpu", target=target, relax_pipeline=single_device_pipeline(target, cfg)
    )
    x = np.random.default_rng(4).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, 1, ksize // 2, 1))


def test_pointwise_chunk():
    # 4225 pixels in tiles of 13 = 325 tiles; 128 channels x 4 B = 512 B a pixel; 256 KiB
    # hold 39 tiles, but 16 chunks need chunks of at most 20: 13 divides 325
    assert pointwise_chunk(4225, 13, 512, 256 * 1024) == 13
    assert pointwise_chunk(4225, 13, 512, 0) == 0  # off
    assert pointwise_chunk(196, 14, 4096, 1 << 30) == 0  # the whole image fits: no chunks
    assert pointwise_chunk(196, 14, 4096, 1) == 1  # at least one tile
    assert pointwise_chunk(200, 14, 4, 14 * 4 * 3) == 1  # 15 tiles: 15 chunks of one
    assert pointwise_chunk(784, 14, 2048, 256 * 1024) == 2  # 512->128, 28x28: 28 chunks
    assert pointwise_chunk(3136, 14, 1024, 256 * 1024) == 14  # 256->64, 56x56: 16 chunks
    assert pointwise_chunk(576, 8, 512, 256 * 1024) == 4  # 18 chunks, not 2


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
@pytest.mark.parametrize(
    ("xshape", "oc", "residual"),
    [((1, 32, 15, 15), 48, True), ((2, 16, 9, 13), 37, False)],
    ids=["residual", "batch2-padded-channels"],
)
def test_chunked_pointwise_packed_conv(xshape, oc, residual, target):
    """Pixel chunks outside the channel blocks: recorded on the kernel, still exact."""
    mod, w, b = conv_module(xshape, oc, ksize=1, padding=0, residual=residual)
    lanes = cpu_config(target).lanes(32)
    cfg = packed_cfg(cpu_config(target), packed_chunk_bytes=3 * lanes * xshape[1] * 4)
    out = scheduled(mod, target, cpu=cfg)
    assert algorithms(out) == ["packed"]
    (func,) = prim_funcs(out).values()
    assert int(func.attrs["codl.packed_chunk_tiles"]) >= 1
    assert (
        "codl.packed_chunk_tiles"
        not in prim_funcs(scheduled(mod, target, cpu=packed_cfg(cpu_config(target))))
        .popitem()[1]
        .attrs
    )
    built = runner.build(
        mod, "cpu", target=target, relax_pipeline=single_device_pipeline(target, cfg)
    )
    x = np.random.default_rng(5).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, 1, 0, 1, residual))


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
@pytest.mark.parametrize(
    ("xshape", "ksize", "tile_bytes"),
    [((1, 32, 14, 14), 1, 0), ((1, 32, 14, 14), 1, 2048), ((1, 16, 13, 13), 3, 0)],
    ids=["pointwise-196", "pointwise-196-28acc", "3x3-13x13"],
)
def test_exact_tile_packed_conv(xshape, ksize, tile_bytes, target):
    """Tail-free tiles (a 28-accumulator one beyond the stack limit too) stay exact."""
    mod, w, b = conv_module(xshape, 64, ksize=ksize, padding=ksize // 2, residual=True)
    base = cpu_config(target)
    cfg = packed_cfg(base, packed_exact_tiles=True, packed_tile_bytes=tile_bytes)
    (func,) = prim_funcs(scheduled(mod, target, cpu=cfg)).values()
    _, rows, cols = (int(v) for v in str(func.attrs["codl.packed_tile"]).split("x"))
    height, width = (1, 196) if ksize == 1 else (13, 13)
    if ksize == 1 or base.lanes(32) == 16:  # SSE's 12 accumulators fit no 13-column tile
        assert height % rows == 0 and width % cols == 0
    built = runner.build(
        mod, "cpu", target=target, relax_pipeline=single_device_pipeline(target, cfg)
    )
    x = np.random.default_rng(5).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, 1, ksize // 2, 1, True))


@pytest.mark.parametrize(
    ("oc", "heavy", "chunked"),
    [(64, False, True), (64, True, True), (128, False, False), (128, True, True)],
)
def test_weight_heavy_pointwise_convs_may_skip_chunks(oc, heavy, chunked):
    """More output channels than pixels (10x10 = 100): chunked only with
    packed_chunk_weight_heavy."""
    mod, _, _ = conv_module((1, 64, 10, 10), oc, ksize=1, padding=0)
    cfg = packed_cfg(SSE, packed_chunk_bytes=64 * 4 * 8, packed_chunk_weight_heavy=heavy)
    (func,) = prim_funcs(scheduled(mod, LLVM, cpu=cfg)).values()
    assert func.attrs["codl.algorithm"] == "packed"
    assert ("codl.packed_chunk_tiles" in func.attrs) == chunked


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
def test_strided_packed_convs_may_take_a_larger_tile(target):
    """``packed_strided_tile_bytes`` widens the register tile of strided packed convs only;
    the conv stays exact."""
    vector_bytes = cpu_config(target).lanes(32) * 4
    base = packed_cfg(cpu_config(target), max_tile_bytes=4 * vector_bytes)  # 4 accumulators
    wide = dataclasses.replace(base, packed_strided_tile_bytes=12 * vector_bytes)

    def extent(mod, cfg):
        (func,) = prim_funcs(scheduled(mod, target, cpu=cfg)).values()
        assert func.attrs["codl.algorithm"] == "packed"
        return int(func.attrs["codl.parallel_extent"])

    strided, w, b = conv_module((1, 32, 30, 58), 32, stride=2)
    plain, _, _ = conv_module((1, 32, 15, 29), 32)
    assert extent(strided, wide) < extent(strided, base)  # fewer, larger tiles
    assert extent(plain, wide) == extent(plain, base)
    built = runner.build(
        strided, "cpu", target=target, relax_pipeline=single_device_pipeline(target, wide)
    )
    x = np.random.default_rng(6).standard_normal((1, 32, 30, 58)).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, 2, 1, 1))


def test_nhwc_input_selection():
    """``packed_nhwc_input``: 1 takes strided packed convs, 2 every packed conv but 1x1
    stride-1 ones (they tile the flattened image); the kernel records it."""
    from codl_tvm.schedules.packed import packed_nhwc

    def info(data, weight, stride=1, pad=1):
        return conv2d_shape_info(data, weight, (stride, stride), (pad,) * 4, (1, 1), 1)

    strided = info((1, 64, 112, 112), (64, 64, 3, 3), stride=2)
    plain = info((1, 64, 56, 56), (64, 64, 3, 3))
    pointwise = info((1, 256, 14, 14), (64, 256, 1, 1), pad=0)
    strided_1x1 = info((1, 256, 14, 14), (512, 256, 1, 1), stride=2, pad=0)
    for mode, expect in [(0, [0, 0, 0, 0]), (1, [1, 0, 0, 1]), (2, [1, 1, 0, 1])]:
        cfg = packed_cfg(AVX512, packed_nhwc_input=mode)
        got = [packed_nhwc(i, cfg) for i in (strided, plain, pointwise, strided_1x1)]
        assert got == [bool(e) for e in expect], mode
    with pytest.raises(ValueError, match="packed_nhwc_input must be 0, 1 or 2"):
        packed_cfg(packed_nhwc_input=3)
    mod, _, _ = conv_module((1, 32, 14, 14), 32, stride=2)
    for mode in (0, 1):
        (func,) = prim_funcs(
            scheduled(mod, LLVM, cpu=packed_cfg(SSE, packed_nhwc_input=mode))
        ).values()
        assert func.attrs["codl.algorithm"] == "packed"
        assert int(func.attrs.get("codl.packed_nhwc", 0)) == mode


@pytest.mark.parametrize("target", RUN_TARGETS, ids=lambda t: str(t.attrs.get("mcpu", "generic")))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-oc{c[1]}-k{c[2]}-s{c[3]}")
def test_nhwc_input_packed_conv_matches_numpy(case, target):
    """Every case of :func:`test_packed_conv_matches_numpy` with the NHWC input copy
    (``packed_nhwc_input=2``: padded, unpadded, strided, dilated, batch 2, sliced channels)."""
    xshape, oc, k, stride, padding, dilation, residual = case
    mod, w, b = conv_module(
        xshape, oc, ksize=k, stride=stride, padding=padding, dilation=dilation, residual=residual
    )
    cfg = packed_cfg(cpu_config(target), packed_nhwc_input=2)
    (func,) = prim_funcs(scheduled(mod, target, cpu=cfg)).values()
    pointwise = k == 1 and stride == 1 and padding == 0
    assert int(func.attrs.get("codl.packed_nhwc", 0)) == (0 if pointwise else 1)
    built = runner.build(
        mod, "cpu", target=target, relax_pipeline=single_device_pipeline(target, cfg)
    )
    x = np.random.default_rng(4).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, w, b, stride, padding, dilation, residual))


def test_negative_chunk_bytes_is_refused():
    for field in (
        "packed_chunk_bytes",
        "packed_min_reduction",
        "packed_tile_bytes",
        "packed_strided_tile_bytes",
    ):
        with pytest.raises(ValueError, match=f"{field} must be >= 0"):
            dataclasses.replace(AVX512, **{field: -1})


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(
    c=st.integers(16, 40),
    blocks=st.integers(1, 3),
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    k=st.sampled_from([1, 3]),
    stride=st.sampled_from([1, 2]),
    pad=st.tuples(*[st.integers(0, 1)] * 4),
    nhwc=st.sampled_from([0, 2]),
    exact=st.booleans(),
)
def test_packed_conv_property(c, blocks, h, w, k, stride, pad, nhwc, exact):
    if h + pad[0] + pad[2] < k or w + pad[1] + pad[3] < k:
        return
    xshape, oc = (1, c, h, w), 4 * blocks
    mod, wt, b = conv_module(xshape, oc, ksize=k, stride=stride, padding=pad)
    cfg = packed_cfg(SSE, packed_nhwc_input=nhwc, packed_exact_tiles=exact)
    built = runner.build(mod, "cpu", target=LLVM, relax_pipeline=single_device_pipeline(LLVM, cfg))
    x = np.random.default_rng(5).standard_normal(xshape).astype("float32")
    assert_close(built([x])[0], reference(x, wt, b, stride, pad, 1))


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("dim", "ratio"), [("H", 0.5), pytest.param("OC", 0.5, marks=pytest.mark.slow)]
)
@needs_avx2
def test_co_executed_cpu_parts_get_packed_convs(opencl, dim, ratio, tmp_path, monkeypatch):
    """With packing switched on for every build (``compile --packed``), the CPU part of a split
    conv (halo rows or sliced constant weights) is a packed conv, the GPU part stays direct, and
    the co-executed model equals numpy."""
    mod, w, b = conv_module((1, 64, 12, 11), 64)
    plan = uniform_plan(mod, dim, ratio)
    x = np.random.default_rng(5).standard_normal((1, 64, 12, 11)).astype("float32")
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path))
    with packed_enabled("all"):
        got = codl_tvm.compile(mod, plan, gpu=POCL_TARGET, cpu=AVX2_TARGET)([x])[0]
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    built = built_algorithms(tmp_path)
    assert ("packed", "avx2") in built and ("direct", "pocl") in built, built
    assert_close(got, reference(x, w, b, 1, 1, 1))


# ---------------------------------------------------------------------------------------------
# the CPU-alone default of `codl-tvm compile`


@pytest.mark.parametrize("flag", [None, "--no-packed"])
def test_cpu_alone_builds_use_packed_convs_on_avx512(tmp_path, monkeypatch, capsys, flag):
    """A CPU artifact for an AVX-512 preset packs qualifying convs by default (the manifest says
    so); ``--no-packed`` keeps the direct/GEMM kernels. Both match the direct reference."""
    from codl_tvm.cli import main

    args = ["compile", "--device", "cpu", "--preset", "emulated-soc", "--no-winograd"]
    args += [flag] if flag else []
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "ir"))
    assert main([*args, "-o", str(tmp_path / "dumped"), "--no-reference"]) == 0
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    built = built_algorithms(tmp_path / "ir")
    assert (("packed", "avx512") in built) is (flag is None), built
    assert ("direct", "avx512") in built  # the 3-channel stem stays direct
    out = tmp_path / "cpu"
    assert main([*args, "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["packed"] is (flag is None)
    assert manifest["packed_cpu_alone"] is (flag is None)
    if host_has_avx512():
        capsys.readouterr()
        assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
        assert "-> OK" in capsys.readouterr().out


def test_cpu_alone_settings_apply_only_inside_their_block():
    from codl_tvm.schedules import cpu_alone_settings, cpu_overrides
    from codl_tvm.schedules.presets import CPU_ALONE_SETTINGS

    plain = cpu_config(AVX512_TARGET)
    assert plain.packed_chunk_bytes == 0 and plain.packed_max_gemm_pixels == 400
    with cpu_alone_settings():
        alone = cpu_config(AVX512_TARGET)
        assert alone.packed_chunk_bytes == CPU_ALONE_SETTINGS["avx512"]["packed_chunk_bytes"]
        assert alone.packed_min_gemm_channels == 128
        assert alone.packed_nhwc_input == 1  # strided packed convs read an NHWC copy
        assert alone.packed_exact_tiles and alone.winograd_min_channels == 128
        assert cpu_config(NEON_TARGET) == NEON  # no settings for NEON (not measured)
        with cpu_overrides(packed_chunk_bytes=0):  # an explicit override wins
            assert cpu_config(AVX512_TARGET).packed_chunk_bytes == 0
    assert cpu_config(AVX512_TARGET) == plain
    assert plain.packed_nhwc_input == 0  # co-executed parts: the profiled NCHW kernels
    assert not plain.packed_exact_tiles and plain.winograd_min_channels == 32


def test_cpu_alone_build_reads_strided_inputs_as_nhwc():
    """A whole-model CPU-alone build (``compile --device cpu`` on AVX-512) gives a strided
    packed conv the NHWC input copy and a stride-1 one none; the co-executed preset neither."""
    from codl_tvm.schedules import cpu_alone_settings, packed_enabled

    def nhwc(mod, cfg=None):
        (func,) = prim_funcs(scheduled(mod, AVX512_TARGET, cpu=cfg)).values()
        assert func.attrs["codl.algorithm"] == "packed"
        return int(func.attrs.get("codl.packed_nhwc", 0))

    strided, _, _ = conv_module((1, 64, 28, 28), 64, stride=2)
    plain, _, _ = conv_module((1, 64, 14, 14), 64)
    with packed_enabled("all"), cpu_alone_settings():
        assert nhwc(strided) == 1
        assert nhwc(plain) == 0
    assert nhwc(strided, packed_cfg(cpu_config(AVX512_TARGET))) == 0


def test_cpu_alone_build_algorithms_by_channels():
    """CPU-alone settings on AVX-512: Winograd from 128 channels (3x3, stride 1; from 32 on
    maps of 400 4x4 tiles), packed convs with tail-free tiles below (64 channels on 14x14:
    2 vectors x 7 columns, not 2 x 8); the co-executed preset keeps Winograd from 32 channels
    and the tiles with a tail."""
    from codl_tvm.schedules import cpu_alone_settings, packed_enabled, winograd_enabled

    def kernel(xshape, oc):
        mod, _, _ = conv_module(xshape, oc)
        (func,) = prim_funcs(scheduled(mod, AVX512_TARGET)).values()
        return str(func.attrs["codl.algorithm"]), str(func.attrs.get("codl.packed_tile", ""))

    with packed_enabled("all"), winograd_enabled("all"), cpu_alone_settings():
        assert kernel((1, 128, 28, 28), 128)[0] == "winograd"
        assert kernel((1, 64, 14, 14), 64) == ("packed", "2x1x7")
        assert kernel((1, 64, 80, 80), 64)[0] == "winograd"  # 400 tiles: winograd_wide_tiles
    with packed_enabled("all"), winograd_enabled("all"):
        assert kernel((1, 64, 28, 28), 64)[0] == "winograd"


def test_cpu_alone_artifact_packs_large_pointwise_convs(tmp_path, monkeypatch):
    """``compile --device cpu`` on AVX-512 packs a 1x1 conv with 128 input channels on a map
    past ``packed_max_gemm_pixels`` (the CPU-alone settings) and chunks it; a co-executed
    build's CPU part of the same conv keeps the GEMM kernel the cost models were profiled with."""
    from onnx import TensorProto, helper, numpy_helper

    from codl_tvm.cli import main

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((32, 128, 1, 1)) * 0.1).astype("f4"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "pointwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 24, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 24, 24])],
        [w],
    )
    model = tmp_path / "pointwise.onnx"
    model.write_bytes(helper.make_model(graph).SerializeToString())
    args = ["compile", str(model), "--preset", "emulated-soc", "--no-reference"]
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "cpu-ir"))
    assert main([*args, "--device", "cpu", "-o", str(tmp_path / "cpu")]) == 0
    assert built_algorithms(tmp_path / "cpu-ir") == [("packed", "avx512")]
    scheduled = next((tmp_path / "cpu-ir").glob("*-schedule.py")).read_text()
    assert '"codl.packed_chunk_tiles"' in scheduled
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "co-ir"))
    co = ["--device", "coexec", "--packed", "--dim", "H", "--ratio", "0.5"]
    assert main([*args, *co, "-o", str(tmp_path / "co")]) == 0
    built = built_algorithms(tmp_path / "co-ir")
    assert [a for a in built if a[1] == "avx512" and a[0] != "injective"] == [("gemm", "avx512")]


# ---------------------------------------------------------------------------------------------
# profiling the packed kernels (`codl-tvm profile --packed`) for the cost models


def _conv_onnx(path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 64, 3, 3), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 7, 7])],
        [w],
    )
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


@pytest.mark.opencl
def test_profile_packed_parts_and_fit_with_direct_data(opencl, tmp_path, capsys):
    """``profile --packed`` builds conv parts with a constant weight through the algorithm
    passes: CPU parts record ``packed``, GPU parts stay direct; a dataset keeps one algorithm
    setting; ``cost-model fit`` takes the direct and the packed datasets together."""
    from codl_tvm.cli import main
    from codl_tvm.cost_model.dataset import load_dataset

    model = _conv_onnx(tmp_path / "m.onnx")
    common = ["--model", str(model), "--ratios", "0,0.5", "--dims", "OC", "--repeats", "2"]
    common += ["--number", "1", "--no-sharing"]
    packed, direct = tmp_path / "packed.jsonl", tmp_path / "direct.jsonl"
    assert main(["profile", *common, "--packed", "-o", str(packed)]) == 0
    data = load_dataset(packed)
    assert set(data.meta["algorithms"]) == {"packed"}
    impls = {(r.processor, r.partition.ratio): r.impl for r in data.op_records}
    assert impls == {("cpu", 0.0): "packed", ("cpu", 0.5): "packed", ("gpu", 0.5): "direct"}
    # resuming it without --packed would mix settings under the same job keys: refused
    capsys.readouterr()
    assert main(["profile", *common, "-o", str(packed)]) != 0
    assert "algorithm switches" in capsys.readouterr().err
    # compiled here, measured "there": the directory's manifest carries the switches
    built, there = tmp_path / "built", tmp_path / "there.jsonl"
    assert main(["profile", *common[:6], "--packed", "--compile-dir", str(built)]) == 0
    assert main(["profile", "--run-dir", str(built), "--no-sharing", "-o", str(there)]) == 0
    data = load_dataset(there)
    assert set(data.meta["algorithms"]) == {"packed"}
    assert {r.impl for r in data.op_records if r.processor == "cpu"} == {"packed"}
    capsys.readouterr()
    assert main(["profile", "--run-dir", str(built), "--packed", "-o", str(direct)]) != 0
    assert "measures the parts its directory holds" in capsys.readouterr().err
    assert main(["profile", *common, "-o", str(direct)]) == 0
    assert {r.impl for r in load_dataset(direct).op_records if r.processor == "cpu"} == {"direct"}
    out = tmp_path / "m.json"
    argv = ["cost-model", "fit", str(direct), str(packed), "-o", str(out), "--kind", "gbdt"]
    # keep every record: which ones the interference rule drops depends on this machine's load
    argv += ["--drop-inconsistent", "0"]
    with pytest.warns(UserWarning, match=r"\('conv2d', 'cpu', 'packed'\)"):  # its own group
        assert main([*argv, "--holdout", "0"]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["dataset"] == [str(direct), str(packed)] and meta["n_train"] == 6
    capsys.readouterr()
    assert main(["cost-model", "eval", str(out), str(direct), str(packed), "--json"]) == 0
    assert "packed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.opencl
def test_cpu_alone_kernel_dataset_makes_coexec_builds_use_them(opencl, tmp_path, capsys):
    """``profile --packed --cpu-alone`` records the CPU-alone settings (a dataset of its own);
    ``cost-model fit`` marks a model fitted with it and refuses to mix it with preset-kernel
    algorithm data; ``compile`` with that model gives co-executed CPU functions the CPU-alone
    kernels by default (the planner predicted those), unless told not to; outputs unchanged."""
    from codl_tvm.cli import main
    from codl_tvm.cost_model.dataset import load_dataset

    model = _conv_onnx(tmp_path / "m.onnx")
    common = ["--model", str(model), "--ratios", "0,0.5", "--dims", "OC", "--repeats", "2"]
    common += ["--number", "1", "--no-sharing"]
    alone, preset, direct = (tmp_path / f"{n}.jsonl" for n in ("alone", "preset", "direct"))
    capsys.readouterr()
    assert main(["profile", *common, "--cpu-alone", "-o", str(alone)]) == 2
    assert "add --winograd and/or --packed" in capsys.readouterr().err
    assert main(["profile", *common, "--packed", "--cpu-alone", "-o", str(alone)]) == 0
    assert load_dataset(alone).meta["algorithms"]["cpu_alone"] == ["avx512"]
    # the preset's packed kernels are other kernels: not resumed into it
    assert main(["profile", *common, "--packed", "-o", str(alone)]) != 0
    assert "algorithm switches" in capsys.readouterr().err
    assert main(["profile", *common, "--packed", "-o", str(preset)]) == 0
    assert main(["profile", *common, "-o", str(direct)]) == 0
    fitted = tmp_path / "alone.json"
    fit = ["cost-model", "fit", "--kind", "codl", "--holdout", "0", "--preset", "mobile"]
    with pytest.warns(UserWarning, match="FLOPs fallback"):  # 2 records a group
        assert main([*fit, str(direct), str(alone), "-o", str(fitted)]) == 0
    assert json.loads(fitted.read_text())["meta"]["cpu_alone_settings"] is True
    capsys.readouterr()
    assert main([*fit, str(direct), str(alone), str(preset), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "different CPU kernel settings" in err and "preset.jsonl (preset)" in err
    assert not (tmp_path / "x").exists()
    # compile: a model fitted with CPU-alone data switches the co-executed CPU kernels to them
    # (the bundled CNN co-executes under the synthetic model; 2 records a group would not)
    synthetic = _model_with_packed()
    synthetic.meta["cpu_alone_settings"] = True
    synthetic.save(fitted)
    args = ["compile", "--preset", "emulated-soc", "--no-winograd", "--cost-model", str(fitted)]
    args.append("--no-measure")  # the planned co-executed build, whatever this machine times
    for flag, want in (((), True), (("--no-coexec-cpu-alone-kernels",), False)):
        out = tmp_path / f"a{len(flag)}"
        assert main([*args, *flag, "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest.get("coexec_cpu_alone_kernels", False) is want, manifest.get("plan")
        assert manifest["device"] == "coexec", manifest["plan"]
        if host_has_avx512():
            capsys.readouterr()
            assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
            assert "-> OK" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# planning with packed CPU parts


def _model_with_packed(factor: float = 0.5):
    """A synthetic CodlModel whose CPU convs also have ``packed`` records, ``factor`` times the
    direct latency (what `profile --packed` adds to a direct dataset)."""
    from codl_tvm.cost_model.analytical import CodlModel
    from codl_tvm.cost_model.dataset import OpRecord
    from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_records

    records = synthetic_records(SyntheticDevice())
    extra = [
        dataclasses.replace(r, impl="packed", latency_ms=r.latency_ms * factor)
        for r in records
        if isinstance(r, OpRecord) and r.op == "conv2d" and r.processor == "cpu"
    ]
    return CodlModel("pocl-local").fit(records + extra)


def test_planner_predicts_the_packed_kernels_the_build_makes():
    from codl_tvm.cost_model.synthetic import synthetic_cost_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner import PlannerConfig, plan_model

    from .test_planner import bundled_model_path

    mod = load_onnx(bundled_model_path()).mod
    cfg = PlannerConfig(cpu=dataclasses.replace(AVX512, conv_packed=True))
    with_packed = _model_with_packed()
    _, direct = plan_model(mod, with_packed, mode="cpu_only")
    _, packed = plan_model(mod, with_packed, mode="cpu_only", config=cfg)
    # the CPU alone is predicted faster with the packed kernels the config selects
    assert packed.summary.cpu_only_ms < direct.summary.cpu_only_ms
    assert not any("no packed data" in n for n in packed.notes)
    # a model without packed data predicts direct for them and says so
    _, report = plan_model(mod, synthetic_cost_model(), mode="cpu_only", config=cfg)
    notes = [n for n in report.notes if "no packed data" in n]
    assert notes and "profile --packed" in notes[0]


@pytest.mark.slow  # 11 s on 2 cores; CI keeps the co-executed build with --packed given
@pytest.mark.opencl
def test_coexec_cpu_parts_use_packed_when_the_cost_model_covers_it(
    opencl, tmp_path, capsys, monkeypatch
):
    """``compile`` (co-execution, packed left to its default) switches packed convs on for the
    CPU parts when the cost model has packed CPU data, and records it; not otherwise."""
    from codl_tvm.cli import main

    path = tmp_path / "packed-model.json"
    _model_with_packed().save(path)
    args = ["compile", "--preset", "emulated-soc", "--no-winograd", "--no-measure"]
    # the bundled CNN's plan puts an OC part of 45 channels (padded to 3 vectors) on the CPU
    monkeypatch.setenv("CODL_TVM_DUMP_IR", str(tmp_path / "ir"))
    dumped = ["--cost-model", str(path), "-o", str(tmp_path / "d"), "--no-reference"]
    assert main([*args, *dumped]) == 0
    monkeypatch.delenv("CODL_TVM_DUMP_IR")
    assert ("packed", "avx512") in built_algorithms(tmp_path / "ir")
    from codl_tvm.artifact import default_cost_model_for

    # the shipped emulated-soc model has packed data (profiled on the device machine); the H100
    # model has direct kernels only
    no_packed = default_cost_model_for("device-h100")
    for i, (cost_model, want) in enumerate(
        ((path, ["packed"]), (None, ["packed"]), (no_packed, []))
    ):
        out = tmp_path / f"coexec-{i}"
        extra = ["--cost-model", str(cost_model)] if cost_model else []
        assert main([*args, *extra, "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest.get("coexec_cpu_algorithms") == want, manifest.get("plan")
        # without packed data the artifact says that the CPU alone is predicted too slow
        assert manifest.get("cpu_alone_unmodelled") == (None if want else ["packed"])
        if manifest["device"] == "coexec" and host_has_avx512():
            capsys.readouterr()
            assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
            assert "-> OK" in capsys.readouterr().out


def test_profiled_packed_part_takes_the_packed_weight_as_input(tmp_path):
    """A profiled algorithm part reads its weight as an input in the transformed layout (no
    weight baked into the library), below the thresholds it stays direct."""
    from codl_tvm.cost_model.features import OpParams, Partition
    from codl_tvm.profiling.part_build import compile_part

    conv = OpParams("conv2d", 7, 7, 64, 45, kernel=3, stride=1, padding=(1, 1, 1, 1))
    small = OpParams("conv2d", 7, 7, 16, 32, kernel=3, stride=1, padding=(1, 1, 1, 1))
    with packed_enabled("all"):
        part = compile_part(conv, Partition("H", 0.0), "cpu", tmp_path, target=AVX512_TARGET)
        direct = compile_part(small, Partition("H", 0.0), "cpu", tmp_path, target=AVX512_TARGET)
    assert part.impl == "packed" and part.inputs == ((1, 64, 7, 7), (3, 64, 3, 3, 16))
    assert direct.impl == "direct" and direct.inputs[1] == (32, 16, 3, 3)
    # the selection a campaign filters on before building agrees with the builds
    from codl_tvm.cost_model.part_ir import part_rewrite

    with packed_enabled("all"):
        cfg = cpu_config(AVX512_TARGET)
    assert part_rewrite(conv, part.part, cfg).algorithm == "packed"
    assert part_rewrite(small, direct.part, cfg) is None
    assert part_rewrite(conv, part.part, None) is None
    assert (tmp_path / part.library).stat().st_size < 2_000_000


# ---------------------------------------------------------------------------------------------
# whole models as `compile --device cpu` builds them on AVX-512 (Winograd + packed convs)


def _whole_model(name: str, **overrides) -> list[str]:
    ort = pytest.importorskip("onnxruntime")
    from codl_tvm.frontend.importer import load_onnx, random_inputs
    from codl_tvm.frontend.models import light_model
    from codl_tvm.frontend.zoo import ZOO_MODELS, build_model

    proto = build_model(name, seed=5) if name in ZOO_MODELS else light_model(name, seed=3)
    model = load_onnx(proto)
    feeds = random_inputs(model, seed=7)
    target = AVX512_TARGET if host_has_avx512() else LLVM
    cfg = dataclasses.replace(cpu_config(target), conv_packed=True, winograd=True, **overrides)
    algos = algorithms(scheduled(model.mod, target, cpu=cfg))
    assert "packed" in algos, sorted(set(algos))
    pipeline = single_device_pipeline(target, cfg)
    got = runner.build(model.mod, "cpu", target=target, relax_pipeline=pipeline)(
        [feeds[s.name] for s in model.inputs]
    )
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for g, r in zip(got, sess.run(None, feeds)):
        scale = max(float(np.max(np.abs(r))), 1e-6)
        assert float(np.max(np.abs(g - r))) <= 1e-4 * scale + 1e-6
    return algos


@pytest.mark.parametrize(
    "name",
    ["squeezenet", *(pytest.param(n, marks=pytest.mark.slow) for n in ("resnet50", "posenet"))],
)
def test_whole_model_with_packed_convs_matches_onnxruntime(name):
    _whole_model(name)


def test_squeezenet_with_nhwc_input_packed_convs_matches_onnxruntime():
    """Every packed conv but the 1x1 stride-1 ones reads an NHWC copy of its input (the stem
    among them): the whole model still equals onnxruntime."""
    _whole_model("squeezenet", packed_min_in_channels=3, packed_strided=True, packed_nhwc_input=2)


def test_squeezenet_with_packed_stem_and_rounded_classifier_matches_onnxruntime():
    """The 3-channel stride-2 stem packed and the 1000-class conv in 64 blocks of 16 (AVX-512;
    4-lane hosts round 250 blocks to 250): the whole model still equals onnxruntime."""
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import light_model

    algos = _whole_model("squeezenet", packed_min_in_channels=3, packed_round_blocks=True)
    target = AVX512_TARGET if host_has_avx512() else LLVM
    cfg = dataclasses.replace(cpu_config(target), conv_packed=True, winograd=True)
    before = algorithms(scheduled(load_onnx(light_model("squeezenet", seed=3)).mod, target, cfg))
    # the stem and the 16-channel 3x3 conv (one kernel, called twice) join the packed kernels
    assert algos.count("packed") == before.count("packed") + 2


@pytest.mark.slow
@pytest.mark.opencl
def test_coexec_cpu_alone_kernels_switch(opencl, tmp_path, capsys, monkeypatch):
    """``compile --coexec-cpu-alone-kernels``: the CPU functions of a co-executed build get the
    CPU-alone kernels (here packed convs, off for a given plan otherwise); outputs unchanged."""
    from codl_tvm.cli import main

    args = ["compile", "--preset", "emulated-soc", "--no-winograd", "--dim", "H", "--ratio", "0.5"]
    built = {}
    for flag in ((), ("--coexec-cpu-alone-kernels",)):
        ir, out = tmp_path / f"ir{len(flag)}", tmp_path / f"a{len(flag)}"
        cache = ["--build-cache", str(tmp_path / "cache")]
        monkeypatch.setenv("CODL_TVM_DUMP_IR", str(ir))
        assert main([*args, *flag, *cache, "-o", str(ir / "a"), "--no-reference"]) == 0
        monkeypatch.delenv("CODL_TVM_DUMP_IR")
        built[bool(flag)] = set(built_algorithms(ir))
        # the same library from the build cache, with the reference outputs to check against
        assert main([*args, *flag, *cache, "-o", str(out)]) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["device"] == "coexec"
        assert manifest.get("coexec_cpu_alone_kernels", False) is bool(flag)
        if host_has_avx512():
            capsys.readouterr()
            assert main(["run", str(out), "--number", "1", "--repeat", "1"]) == 0
            assert "-> OK" in capsys.readouterr().out
    assert ("packed", "avx512") in built[True] - built[False]
    assert main(["compile", "--device", "cpu", "--coexec-cpu-alone-kernels", "-o", "x"]) == 2
    err = capsys.readouterr().err
    assert "applies to --device" in err and "coexec" in err
