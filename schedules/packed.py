"""Channel-packed direct convolution for CPUs: vectorised over output channels, NCHW in and out.

The ``direct`` and ``gemm`` CPU schedules (:mod:`codl_tvm.schedules.cpu`) vectorise along the
output row or the flattened image. That wastes lanes where the image is small (a 7x7 map fills 7
of 16 AVX-512 lanes) and turns strided convs into gathers, and the GEMM's weight rows stream
from memory once per pixel tile when the input has thousands of channels. This kernel
vectorises along output channels instead, as NCHWc engines do, while activations stay NCHW (so
the co-execution passes' H and OC slices and every other kernel are unchanged):

``Y[n, k, y, x] = sum_{c, ky, kx} X[n, c, y*sh + ky*dh, x*sw + kx*dw] * Wp[k//L, c, ky, kx, k%L]``

``Wp`` is the OIHW weight packed once at compile time (:func:`pack_weight`, a constant; no
per-call cost), ``L`` the vector width. Per reduction step a register tile of ``oc_vectors``
weight vectors x ``rows x cols`` output pixels is updated with one broadcast input element per
pixel (AVX-512 folds the broadcast into the FMA). The accumulators live in a ``[y, x, k]``
buffer of at most ``max_tile_bytes`` (so LLVM keeps it in registers), and the write-back
transposes the tile into the NCHW output with the fused epilogue (bias, residual add, relu)
inlined. Parallel over (batch, channel block, row block, column block).

With ``CPUConfig.packed_nhwc_input`` a ``pad`` stage copies the (padded) input to NHWC and
the reduction runs input channels innermost: each pixel's broadcasts then read consecutive
addresses, where the NCHW input puts every reduction step on another channel plane (strided
convs over large maps streamed their input at a stride the prefetchers do not follow). The
output stays NCHW.

Output channels that do not fill whole vectors (an OC part of a split conv, 1000 classes) are
padded: the weight's last block is zero, the register tiles compute whole blocks, and a
``slice`` stage, which becomes the write-back, keeps the real channels.

Selection (:func:`packed_reason`): CPUs whose config enables it (``CPUConfig.conv_packed``;
builds for the CPU alone on the presets of :data:`~codl_tvm.schedules.presets.PACKED_CPU_ALONE`,
and co-executed CPU parts when the cost model has packed data),
one group, a constant weight, at least one vector of output channels, at least
``packed_min_in_channels`` input channels, and for 1x1 stride-1 convs at most
``packed_max_gemm_pixels`` output pixels and at least ``packed_min_gemm_channels`` input
channels. The channel thresholds followed SqueezeNet's regression on a skylake-avx512 Xeon
(0.87x packed, on its small-channel convs); they are not tuned.
The conv is rewritten before legalization by
:class:`codl_tvm.passes.winograd.Conv2DWinograd` (which chooses every conv's algorithm) and
scheduled by :class:`CPUPackedConv2D`; kernels record ``codl.algorithm = "packed"``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import SBlockRV
from tvm.target import Target

from .analysis import Conv2DInfo, FuncBlocks, iteration_kinds, stage_of
from .config import CPUConfig
from .cpu_common import CPURule, prepare_prologue
from .cpu_common import inline_epilogue as cpu_inline_epilogue

__all__ = [
    "MIN_CHUNK_TASKS",
    "PACKED_NHWC",
    "PACKED_STAGE",
    "PACKED_STRIDED",
    "CPUPackedConv2D",
    "PackedInfo",
    "match_packed",
    "pack_weight",
    "packed_blocks",
    "packed_conv2d",
    "packed_nhwc",
    "packed_reason",
    "packed_tile",
    "pointwise_chunk",
]

#: Block annotation naming the stage of a packed conv (``"pad"`` or ``"conv"``).
PACKED_STAGE = "codl.packed"
#: Conv-block annotation of a strided packed conv (its tile may differ:
#: ``CPUConfig.packed_strided_tile_bytes``).
PACKED_STRIDED = "codl.packed_strided"
#: Conv-block annotation of a packed conv that reads an NHWC copy of its input
#: (``CPUConfig.packed_nhwc_input``).
PACKED_NHWC = "codl.packed_nhwc"


def packed_reason(info: Conv2DInfo, config: CPUConfig) -> str | None:
    """Why a conv is not built as a channel-packed conv under ``config`` (None: it is).

    The pass also needs a constant weight.
    """
    if not isinstance(config, CPUConfig):
        return "packed convs are a CPU schedule"
    if not config.conv_packed:
        return f"packed convs disabled in config {config.name!r}"
    if info.groups != 1:
        return f"groups={info.groups}, the packed conv needs one group"
    lanes = config.lanes(info.dtype_bits)
    if lanes < 2:
        return "no vector unit"
    if info.out_channels < lanes:
        return f"{info.out_channels} output channels, fewer than one {lanes}-lane vector"
    strided = info.stride_h > 1 or info.stride_w > 1
    taps = info.in_channels * info.kernel_h * info.kernel_w
    low = config.packed_min_in_channels
    if config.packed_strided and strided:
        pass  # any channels: the direct kernel would gather the strided input
    elif config.packed_min_reduction and not info.pointwise:
        if taps < config.packed_min_reduction:
            return (
                f"{info.in_channels} input channels x {info.kernel_h}x{info.kernel_w} = {taps} "
                f"multiply-adds per output, below packed_min_reduction="
                f"{config.packed_min_reduction}"
            )
    elif info.in_channels < low:
        return f"{info.in_channels} input channels, below packed_min_in_channels={low}"
    pixels = info.out_height * info.out_width
    if info.pointwise and pixels > config.packed_max_gemm_pixels:
        return (
            f"1x1 conv over {pixels} pixels: the gemm schedule "
            f"(packed_max_gemm_pixels={config.packed_max_gemm_pixels})"
        )
    if info.pointwise and info.in_channels < config.packed_min_gemm_channels:
        return (
            f"1x1 conv with {info.in_channels} input channels: the gemm schedule "
            f"(packed_min_gemm_channels={config.packed_min_gemm_channels})"
        )
    return None


def packed_nhwc(info: Conv2DInfo, config: CPUConfig) -> bool:
    """Whether a packed conv reads an NHWC copy of its input (``packed_nhwc_input``): never for
    1x1 stride-1 convs (they tile the flattened image, whose pixels are contiguous already)."""
    if info.pointwise or not config.packed_nhwc_input:
        return False
    return config.packed_nhwc_input == 2 or info.stride_h > 1 or info.stride_w > 1


def packed_blocks(out_channels: int, lanes: int, config: CPUConfig) -> int:
    """Output-channel blocks of ``lanes`` a packed conv computes: ``ceil(O / lanes)``, rounded
    up to a multiple of ``packed_oc_vectors`` under ``packed_round_blocks`` when that adds at
    most 1/16 more (the extra blocks are zero weights, sliced off)."""
    blocks = -(-out_channels // lanes)
    step = config.packed_oc_vectors
    if config.packed_round_blocks and step > 1 and blocks % step:
        rounded = -(-blocks // step) * step
        if (rounded - blocks) * 16 <= blocks:
            return rounded
    return blocks


def pack_weight(weight: np.ndarray, lanes: int, blocks: int | None = None) -> np.ndarray:
    """OIHW ``weight`` as ``[blocks, I, KH, KW, lanes]`` (output channels innermost; blocks
    default ``ceil(O / lanes)``, and channels past ``O`` are zero)."""
    o, i, kh, kw = weight.shape
    blocks = -(-o // lanes) if blocks is None else blocks
    if blocks * lanes < o:
        raise ValueError(f"pack_weight: {blocks} blocks of {lanes} hold fewer than {o} channels")
    if blocks * lanes != o:
        pad = np.zeros((blocks * lanes - o, i, kh, kw), weight.dtype)
        weight = np.concatenate([weight, pad])
    packed = weight.reshape(blocks, lanes, i, kh, kw).transpose(0, 2, 3, 4, 1)
    return np.ascontiguousarray(packed)


def packed_conv2d(
    data: te.Tensor,
    weight_pack: te.Tensor,
    strides: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    out_channels: int | None = None,
    nhwc_input: bool = False,
) -> te.Tensor:
    """The conv2d of ``data`` (NCHW) with a :func:`pack_weight`-packed weight, NCHW out.

    Parameters
    ----------
    data : te.Tensor
        Input ``(N, C, H, W)``.
    weight_pack : te.Tensor
        ``(K / L, C, KH, KW, L)``.
    strides, dilation : Sequence[int]
        ``(h, w)``.
    padding : Sequence[int]
        ``(top, left, bottom, right)``.
    out_channels : int | None
        ``K`` when the packed weight ends in zero padding (default: ``K / L * L``); the conv
        then computes whole blocks and a ``slice`` stage keeps the first ``K``.
    nhwc_input : bool
        Copy the (padded) input to NHWC in a ``pad`` stage and reduce from it, input channels
        innermost (``CPUConfig.packed_nhwc_input``).

    Returns
    -------
    te.Tensor
        ``(N, K, OH, OW)``, equal to the one-group conv2d.
    """
    n_, c_, h_, w_ = (int(v) for v in data.shape)
    blocks, c2, kh, kw, lanes = (int(v) for v in weight_pack.shape)
    if c2 != c_:
        raise ValueError(
            f"packed_conv2d: packed weight {tuple(weight_pack.shape)} does not match {c_} "
            "input channels"
        )
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    pt, pl, pb, pr = (int(p) for p in padding)
    oh = (h_ + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w_ + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"packed_conv2d: empty output {oh}x{ow}")
    dtype = data.dtype

    def pad_value(n, c, y, x):
        if not any((pt, pl, pb, pr)):
            return data[n, c, y, x]
        inside = tirx.all(y >= pt, y < h_ + pt, x >= pl, x < w_ + pl)
        return tirx.if_then_else(inside, data[n, c, y - pt, x - pl], tirx.const(0.0, dtype))

    hp, wp = h_ + pt + pb, w_ + pl + pr
    if nhwc_input:
        src = te.compute(
            (n_, hp, wp, c_),
            lambda n, y, x, c: pad_value(n, c, y, x),
            name="packed_pad",
            attrs={PACKED_STAGE: "pad"},
        )
    elif any((pt, pl, pb, pr)):
        src = te.compute(
            (n_, c_, hp, wp), pad_value, name="packed_pad", attrs={PACKED_STAGE: "pad"}
        )
    else:
        src = data
    c = te.reduce_axis((0, c_), "c")
    ry = te.reduce_axis((0, kh), "ky")
    rx = te.reduce_axis((0, kw), "kx")
    k_ = blocks * lanes if out_channels is None else int(out_channels)
    if not 0 < k_ <= blocks * lanes:
        raise ValueError(
            f"packed_conv2d: {k_} output channels do not fit {blocks} blocks of {lanes}"
        )

    def read(n, c, y, x):
        return src[n, y, x, c] if nhwc_input else src[n, c, y, x]

    attrs = {PACKED_STAGE: "conv"}
    if sh > 1 or sw > 1:
        attrs[PACKED_STRIDED] = 1
    if nhwc_input:
        attrs[PACKED_NHWC] = 1
    conv = te.compute(
        (n_, blocks * lanes, oh, ow),
        lambda n, k, y, x: te.sum(
            read(n, c, y * sh + ry * dh, x * sw + rx * dw)
            * weight_pack[k // lanes, c, ry, rx, k % lanes],
            axis=[c, ry, rx],
        ),
        name="packed_conv",
        attrs=attrs,
    )
    if k_ == blocks * lanes:
        return conv
    return te.compute(
        (n_, k_, oh, ow),
        lambda n, k, y, x: conv[n, k, y, x],
        name="packed_slice",
        attrs={PACKED_STAGE: "slice"},
    )


def _divisors_up_to(extent: int, limit: int) -> list[int]:
    return [d for d in range(1, min(extent, limit) + 1) if extent % d == 0]


def _efficiency(extent: int, tile: int) -> float:
    """Share of a split's ``ceil(extent / tile) * tile`` iterations that are real (no tail)."""
    return extent / (math.ceil(extent / tile) * tile)


def packed_tile(
    out_channels: int, out_height: int, out_width: int, lanes: int, cfg: CPUConfig, nbytes: int = 4
) -> tuple[int, int, int]:
    """The register tile ``(oc_vectors, rows, cols)`` of a packed conv.

    At most ``min(max_accumulators, max_tile_bytes / vector bytes)`` accumulator registers
    (beyond ``max_tile_bytes`` TVM puts the tile on the heap, out of registers). The tile with
    most useful accumulators wins (more reuse of each loaded weight vector and input element),
    counting a split whose tile does not divide the output by its useful share (17 columns in
    tiles of 6 are 3 tiles, 17 of 18 useful; a divisor-only rule would take tiles of 1), then
    fewer wasted iterations, then more channel vectors, then wider rows (contiguous input
    and output runs). A pointwise conv passes its flattened image as one row
    (``out_height=1``).

    Under ``cfg.packed_exact_tiles`` the best tile that divides the output (no tail) wins
    instead, unless it has fewer than half the accumulators: a tail tile guards its last
    pixels with a predicate inside the reduction loop, and LLVM then keeps those
    accumulators in memory in every tile, not only the last (14x14 pointwise convs: 8 of the
    16 accumulators of a 2 x 8 tile loaded and stored on every reduction step).
    """
    budget = max(1, min(cfg.max_accumulators, cfg.max_tile_bytes // (lanes * nbytes)))
    blocks = out_channels // lanes
    best: tuple[float, float, int, int, int] | None = None
    exact: tuple[float, float, int, int, int] | None = None
    for ot in _divisors_up_to(blocks, cfg.packed_oc_vectors):
        for cols in range(1, min(out_width, budget // ot) + 1):
            for rows in range(1, min(out_height, budget // (ot * cols)) + 1):
                eff = _efficiency(out_width, cols) * _efficiency(out_height, rows)
                key = (round(ot * rows * cols * eff, 6), round(eff, 6), ot, cols, rows)
                if best is None or key[:4] > best[:4]:
                    best = key
                if eff == 1 and (exact is None or key[:4] > exact[:4]):
                    exact = key
    assert best is not None and exact is not None
    if cfg.packed_exact_tiles and 2 * exact[0] >= best[0]:
        best = exact
    return best[2], best[4], best[3]


#: Least pixel chunks chunking may leave (each runs every channel block; tiles permitting):
#: two per thread of an 8-thread pool, as the measured CPU-alone default chunks.
MIN_CHUNK_TASKS = 16


def pointwise_chunk(pixels: int, cols: int, bytes_per_pixel: int, budget: int) -> int:
    """Pixel tiles per chunk of a pointwise packed conv (0: no chunking).

    The largest divisor of the tile count (so no chunk has a tail) whose input,
    ``tiles * cols * bytes_per_pixel``, fits ``budget`` bytes and that leaves at least
    :data:`MIN_CHUNK_TASKS` chunks (or one per tile, with fewer tiles); 0 when ``budget`` is 0
    or the whole image fits it (then the plain order is the same walk).
    """
    tiles = math.ceil(pixels / cols)
    if budget <= 0:
        return 0
    fit = max(1, budget // max(1, cols * bytes_per_pixel))
    if fit >= tiles:
        return 0
    fit = min(fit, max(1, tiles // min(MIN_CHUNK_TASKS, tiles)))
    return max(_divisors_up_to(tiles, fit))


@dataclass(frozen=True)
class PackedInfo:
    """The blocks and sizes of a :func:`packed_conv2d` PrimFunc."""

    prologue: list[SBlockRV]
    conv: SBlockRV
    slice: SBlockRV | None
    epilogue: list[SBlockRV]
    batch: int
    out_channels: int
    out_height: int
    out_width: int
    reduction: int
    lanes: int
    dtype_bits: int
    pointwise: bool
    strided: bool = False
    nhwc: bool = False


def _stage(sch: s_tir.Schedule, block: SBlockRV) -> str | None:
    return stage_of(sch, block, PACKED_STAGE)


def match_packed(sch: s_tir.Schedule) -> PackedInfo | str:
    """Recognise a :func:`packed_conv2d` PrimFunc (plus injective pro- and epilogues)."""
    try:
        root = get_root_block(sch)
    except ValueError:
        return "the function body is not a root block"
    blocks = sch.get_child_blocks(root)
    convs = [i for i, b in enumerate(blocks) if _stage(sch, b) == "conv"]
    if not convs:
        return f"no {PACKED_STAGE} conv block (not a packed conv)"
    if len(convs) > 1:
        return f"{len(convs)} packed conv blocks"
    i = convs[0]
    for j, b in enumerate(blocks):
        if not isinstance(sch.get(b).body, tirx.BufferStore):
            return f"block {sch.get(b).name_hint!r} is not a single buffer store"
        if j != i and "R" in iteration_kinds(sch, b):
            return "a reduction outside the packed conv"
    conv = sch.get(blocks[i])
    kinds = iteration_kinds(sch, blocks[i])
    if kinds != "SSSSRRR":
        return f"packed conv block has iterations {kinds}"
    out = conv.body.buffer
    weight = conv.reads[-1].source
    src = conv.reads[0].source
    dims = [getattr(v, "value", None) for v in (*out.shape, *weight.shape)]
    if any(d is None for d in dims) or len(dims) != 9:
        return "dynamic shapes"
    n, k, oh, ow = dims[:4]
    after = list(blocks[i + 1 :])
    cut = after.pop(0) if after and _stage(sch, after[0]) == "slice" else None
    lanes = dims[8]
    reduction = math.prod(int(iv.dom.extent) for iv in conv.iter_vars[4:])
    kernel = [int(iv.dom.extent) for iv in conv.iter_vars[5:]]
    nhwc = PACKED_NHWC in conv.annotations
    src_hw = [getattr(v, "value", None) for v in (src.shape[1:3] if nhwc else src.shape[2:])]
    return PackedInfo(
        prologue=list(blocks[:i]),
        conv=blocks[i],
        slice=cut,
        epilogue=after,
        batch=n,
        out_channels=k,
        out_height=oh,
        out_width=ow,
        reduction=reduction,
        lanes=lanes,
        dtype_bits=int(out.dtype.bits),
        # 1x1 reading the same pixel it writes: tile the flattened image (no row tails)
        pointwise=kernel == [1, 1] and src_hw == [oh, ow],
        strided=PACKED_STRIDED in conv.annotations,
        nhwc=nhwc,
    )


class CPUPackedConv2D(CPURule):
    """Channel-packed conv on CPUs (see the module docstring); declines anything else."""

    def schedule(self, sch: s_tir.Schedule, target: Target):
        cfg = self._config(target)
        info = match_packed(sch)
        if isinstance(info, str):
            return info
        prepare_prologue(sch, FuncBlocks(info.prologue, None, []), cfg)
        conv = info.conv
        nbytes = info.dtype_bits // 8
        lanes = info.lanes
        ow = info.out_width
        if info.pointwise:
            height, width = 1, info.out_height * ow
        else:
            height, width = info.out_height, ow
        tile_bytes = cfg.packed_tile_bytes or cfg.max_tile_bytes
        if info.strided and cfg.packed_strided_tile_bytes:
            tile_bytes = cfg.packed_strided_tile_bytes
        tile_cfg = dataclasses.replace(cfg, max_tile_bytes=tile_bytes)
        ot, rows, cols = packed_tile(info.out_channels, height, width, lanes, tile_cfg, nbytes)
        writeback = sch.cache_write(conv, 0, "global")
        if info.slice is not None:
            # padded channels: the accumulators hold whole blocks and the slice, which keeps
            # the real channels, becomes the write-back
            sch.compute_inline(writeback)
            writeback = info.slice
        # accumulators [y, x, k] (pointwise: [pixel, k]): each register holds `lanes`
        # consecutive output channels
        if info.pointwise:
            sch.transform_layout(conv, ("write", 0), lambda n, k, y, x: (n, y * ow + x, k))
        else:
            sch.transform_layout(conv, ("write", 0), lambda n, k, y, x: (n, y, x, k))
        cpu_inline_epilogue(sch, FuncBlocks([], writeback, info.epilogue), cfg)
        if info.pointwise:
            sch.transform_block_layout(
                conv, lambda n, k, y, x, c, ky, kx: (n, k, y * ow + x, c, ky, kx)
            )
            sch.transform_block_layout(writeback, lambda n, k, y, x: (n, k, y * ow + x))
            n, k, x, c, ky, kx = sch.get_loops(conv)
        else:
            n, k, y, x, c, ky, kx = sch.get_loops(conv)
        ko, kt = sch.split(k, [None, ot * lanes])
        koi, ki = sch.split(kt, [ot, lanes])
        xo, xi = sch.split(x, [None, cols])
        chunk = 0
        if info.pointwise:
            yo, yi = None, None
            weight_heavy = info.out_channels > width
            if cfg.packed_chunk_weight_heavy or not weight_heavy:
                chunk = pointwise_chunk(
                    width, cols, info.reduction * nbytes, cfg.packed_chunk_bytes
                )
            if chunk:
                # (pixel chunk, channel block, tile in chunk): the chunk's input stays in cache
                # while every channel block reads it
                xoo, xoi = sch.split(xo, [None, chunk])
                sch.reorder(n, xoo, ko, xoi, c, ky, kx, xi, koi, ki)
                par = sch.fuse(n, xoo, ko)
                tile_loop = xoi
            else:
                sch.reorder(n, ko, xo, c, ky, kx, xi, koi, ki)
                par = sch.fuse(n, ko, xo)
                tile_loop = par
        else:
            yo, yi = sch.split(y, [None, rows])
            if info.nhwc:
                # channels innermost: each pixel's broadcasts walk consecutive NHWC addresses
                sch.reorder(n, ko, yo, xo, ky, kx, c, yi, xi, koi, ki)
            else:
                sch.reorder(n, ko, yo, xo, c, ky, kx, yi, xi, koi, ki)
            par = sch.fuse(n, ko, yo, xo)
            tile_loop = par
        # the accumulators are one register tile: written back after each tile
        sch.reverse_compute_at(writeback, tile_loop, preserve_unit_loops=True)
        work = info.batch * info.out_channels * info.out_height * info.out_width * info.reduction
        features = {
            "codl.parallel_extent": 0,
            "codl.vector_width": lanes,
            # channel vectors x rows x columns (pointwise: x pixels)
            "codl.packed_tile": f"{ot}x{rows}x{cols}",
        }
        if info.nhwc:
            features["codl.packed_nhwc"] = 1
        if chunk:
            features["codl.packed_chunk_tiles"] = chunk
        if work >= cfg.min_parallel_work and int(sch.get(par).extent) > 1:
            features["codl.parallel_extent"] = int(sch.get(par).extent)
            sch.parallel(par)
        unroll = [xi, koi] + ([yi] if yi is not None else [])
        if int(sch.get(kx).extent) <= 7 and not info.nhwc:
            unroll.append(kx)
        for loop in unroll:
            if int(sch.get(loop).extent) > 1:
                sch.unroll(loop)
        sch.vectorize(ki)
        init = sch.decompose_reduction(conv, ky if info.nhwc else c)
        sch.vectorize(sch.get_loops(init)[-1])
        return "packed", cfg.name, features
