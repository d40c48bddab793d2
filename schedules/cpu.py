"""CPU (``llvm``) schedule rules: conv2d (direct, GEMM 1x1, depthwise), reductions, injective.

Layout choice: NCHW stays the memory layout; tiling and vectorisation happen inside the schedule.
The co-execution passes split convs along H or OC of NCHW tensors at the Relax level, and a part's
rows (``Y[:, :, h0:h1, :]``) or channels (``Y[:, k0:k1]``) are then contiguous slices that CPU
and GPU write with no layout transform and no copy. A blocked layout (NCHWc) would vectorise over
channels instead, but would need a transform at every CPU/GPU boundary and make an OC split a
strided write; keeping NCHW also leaves weights untouched (no per-call packing).

Schedules (tile sizes and vector widths from :mod:`codl_tvm.schedules.config`):

``direct`` (any kernel, stride, dilation, groups)
    Register tile of ``oc_tile`` output channels x ``oh_tile`` rows x one vectorised run of the
    output row (``choose_row_width``: at most one register, or whole registers, and a divisor
    of the row, since TVM scalarises a vector loop with a tail), accumulated over
    ``(c, ky, kx)`` in a stack buffer that LLVM keeps in registers; weights are broadcast
    (folded into the FMA as ``{1to16}`` on AVX-512), input rows are vector loads. The tile
    loops ``(n, oc, oh, ow)`` are fused into one parallel loop. The channel tile shrinks when
    its weights would not fit in L2. Padding stays a separate block, parallel over rows
    (inlining its condition into the vector loop would scalarise it).
``gemm`` (1x1, stride 1, no padding, one group)
    ``out[f, p] = sum_c w[f, c] * x[c, p]`` over the flattened image ``p = y*W + x``:
    vectorised over ``p`` (any H, W, even 1 row), ``oc_tile`` rows of the weight in registers.
    A pixel count whose best tile would leave a tail (17x17 = 289 on AVX-512; 13x13 or 7x7 with
    4-lane NEON/SSE) or be one odd vector over several registers is padded to whole registers
    (``padded_row_width``, ``CPUConfig.conv1x1_pad_pixels``): the input is copied into a padded
    buffer and the extra columns are computed and dropped, instead of a vector loop with a
    tail, which TVM runs scalar.
``depthwise``
    The direct schedule with one input channel per output channel (no channel register reuse).
``pool`` / ``matmul`` / ``reduction``
    One reduction block: spatial loops outside, the reduction, then a vectorised innermost
    spatial run when every access is contiguous along it (matmul ``[M, K] x [K, N]``, pooling
    rows); otherwise parallel spatial loops with a serial reduction (global average pooling).
``injective``
    Elementwise/broadcast/layout kernels: producers inlined, outer loops fused and parallel,
    the innermost loop left plain (no index division per element; LLVM vectorises it).
    Pure reshapes are declined so that ``RewriteDataflowReshape`` can make them views.

Elementwise epilogues fused after a reduction (bias add, relu, clip, the average-pool divide) are
inlined into the write-back of the register tile, so they cost no extra pass over memory.
3x3 stride-1 convs with constant weights that the config selects (``CPUConfig.winograd``,
:func:`~codl_tvm.schedules.winograd.winograd_reason`) are rewritten before legalization and
scheduled by :class:`~codl_tvm.schedules.winograd.CPUWinograd` (``winograd``); the others use
``direct``. Measured numbers for the AVX-512 preset are in docs/benchmarks.md
(``scripts/bench_kernels.py``).
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.relax.analysis import has_reshape_pattern
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .analysis import (
    Conv2DInfo,
    FuncBlocks,
    classify_blocks,
    match_conv2d,
    match_pool2d,
    match_reduction,
    writer_of,
)
from .common import choose_row_width, padded_row_width
from .config import CPUConfig
from .cpu_common import (
    CPURule,
    finish_tile,
    inline_epilogue,
    prepare_prologue,
    schedule_injective,
)

__all__ = ["CPUConv2D", "CPUInjective", "CPUReduction", "conv2d_algorithm"]


def conv2d_algorithm(info: Conv2DInfo, config: CPUConfig | None = None) -> str:
    """The algorithm the CPU rule uses for a conv: ``gemm``, ``depthwise`` or ``direct``.

    ``winograd`` is chosen earlier, on Relax (:func:`~codl_tvm.schedules.winograd_reason`): a
    conv that reaches this rule is not a Winograd conv.
    """
    if info.pointwise and (config is None or config.conv1x1_gemm):
        return "gemm"
    if info.depthwise:
        return "depthwise"
    return "direct"


def _data_producer(sch: s_tir.Schedule, blocks: FuncBlocks, conv: SBlockRV) -> SBlockRV | None:
    """The prologue block that writes the conv's input (padding or a copy), if any."""
    reads = [region.source for region in sch.get(conv).reads]
    for block in blocks.prologue:
        if any(buf.same_as(sch.get(block).body.buffer) for buf in reads):
            return block
    return None


class CPUConv2D(CPURule):
    """NCHW conv2d on CPUs: ``gemm`` for 1x1 stride-1 unpadded, else ``direct``/``depthwise``.

    Declines (``explain`` gives the reason) when the function has no NCHW/OIHW conv2d block,
    has dynamic shapes, or more than one reduction.
    """

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        cfg = self._config(target)
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        info = match_conv2d(sch, blocks)
        if isinstance(info, str):
            return f"not a conv2d: {info}"
        algorithm = conv2d_algorithm(info, cfg)
        conv = blocks.main
        stride = info.stride_w
        padder = _data_producer(sch, blocks, conv) if stride > 1 else None
        if padder is not None:
            # Strided conv: store the (padded) input with its columns split by phase,
            # [n, c, h, w % s, w // s], so each tap reads a contiguous run of a phase
            # instead of a strided gather; the copy is one pass over the input.
            prepare_prologue(sch, blocks.without(padder), cfg)
            sch.transform_layout(
                padder,
                ("write", 0),
                lambda n, c, h, w: (n, c, h, w % stride, w // stride),
                pad_value=0.0,
            )
            schedule_injective(sch, padder, cfg)
        else:
            prepare_prologue(sch, blocks, cfg)
        writeback = sch.cache_write(conv, 0, "global")
        inline_epilogue(sch, blocks, cfg)
        lanes = cfg.lanes(info.dtype_bits)
        work = info.batch * info.out_channels * info.out_height * info.out_width
        work *= info.in_channels_per_group * info.kernel_h * info.kernel_w
        if algorithm == "gemm":
            features = self._gemm(sch, conv, writeback, info, cfg, lanes, work)
        else:
            features = self._direct(sch, conv, writeback, info, cfg, lanes, work)
        return algorithm, cfg.name, features

    @staticmethod
    def _oc_tile(
        cfg: CPUConfig, accumulators_per_oc: int, bytes_per_oc: int, info: Conv2DInfo
    ) -> int:
        weight_bytes = (
            info.in_channels_per_group * info.kernel_h * info.kernel_w * info.dtype_bits // 8
        )
        tile = max(1, cfg.conv_oc_tile)
        while tile > 1 and (
            tile * accumulators_per_oc > cfg.max_accumulators
            or tile * bytes_per_oc > cfg.max_tile_bytes
            or tile * weight_bytes > cfg.max_weight_tile_bytes
        ):
            tile //= 2
        return min(tile, info.out_channels)

    def _direct(self, sch, conv, writeback, info, cfg, lanes, work) -> dict[str, int]:
        width = choose_row_width(info.out_width, lanes, cfg.max_row_vectors, cfg.partial_vectors)
        nvec = math.ceil(width / lanes)
        oh_tile = min(cfg.conv_oh_tile if nvec == 1 else 1, info.out_height)
        oc_tile = self._oc_tile(cfg, nvec * oh_tile, oh_tile * width * info.dtype_bits // 8, info)
        n, f, y, x, c, ky, kx = sch.get_loops(conv)
        fo, fi = sch.split(f, [None, oc_tile])
        yo, yi = sch.split(y, [None, oh_tile])
        xo, xi = sch.split(x, [None, width])
        sch.reorder(n, fo, yo, xo, c, ky, kx, yi, fi, xi)
        par = sch.fuse(n, fo, yo, xo)
        unroll = [yi, fi]
        if info.kernel_w <= 7:
            unroll.append(kx)
        return finish_tile(sch, conv, writeback, par, c, xi, unroll, work, cfg)

    def _gemm(self, sch, conv, writeback, info, cfg, lanes, work) -> dict[str, int]:
        ow = info.out_width

        def flat_iter(n, f, y, x, c, ky, kx):
            return (n, f, y * ow + x, c, ky, kx)

        def flat_buf(n, f, y, x):
            return (n, f, y * ow + x)

        sch.transform_layout(conv, ("write", 0), flat_buf)
        sch.transform_block_layout(conv, flat_iter)
        sch.transform_block_layout(writeback, flat_buf)
        pixels = info.out_height * info.out_width
        padded = None
        if cfg.conv1x1_pad_pixels:
            padded = padded_row_width(pixels, lanes, cfg.max_row_vectors, cfg.partial_vectors)
        if padded is not None:
            try:  # dry run on a copy: a failure keeps the unpadded schedule, not no schedule
                self._pad_pixels(sch.copy(), conv, ow, padded[0], cfg)
            except (s_tir.ScheduleError, ValueError):
                padded = None
        if padded is not None:
            width = padded[0]
            self._pad_pixels(sch, conv, ow, width, cfg)
        else:
            width = choose_row_width(pixels, lanes, cfg.max_row_vectors, cfg.partial_vectors)
        nvec = math.ceil(width / lanes)
        oc_tile = self._oc_tile(cfg, nvec, width * info.dtype_bits // 8, info)
        n, f, p, c, ky, kx = sch.get_loops(conv)
        fo, fi = sch.split(f, [None, oc_tile])
        po, pi = sch.split(p, [None, width])
        sch.reorder(n, fo, po, c, ky, kx, fi, pi)
        par = sch.fuse(n, fo, po)
        return finish_tile(sch, conv, writeback, par, c, pi, [fi], work, cfg)

    @staticmethod
    def _pad_pixels(sch, conv, ow: int, width: int, cfg: CPUConfig) -> None:
        """Let the flattened GEMM compute a pixel count padded to a multiple of ``width``.

        The input is copied into ``[n, c, pixels_padded]`` (zeros after the image: a vectorised
        fill, then a plain copy, not a per-element condition) and the GEMM writes a padded
        accumulator buffer whose extra columns the write-back drops. Only the write-back keeps
        a bound check; the reduction loop has none, so it stays vectorised.
        """

        def data_read(stmt) -> int:
            f, c, ky, kx = (stmt.iter_vars[i].var for i in (1, 3, 4, 5))
            for index, region in enumerate(stmt.reads):
                idx = [r.min for r in region.region]
                weight = len(idx) == 4 and all(
                    isinstance(e, tirx.Var) and e.same_as(v) for e, v in zip(idx, (f, c, ky, kx))
                )
                if not weight and not region.source.same_as(stmt.writes[0].source):
                    return index
            raise ValueError("1x1 conv: no data operand besides the [f, c, ky, kx] weight")

        copy = sch.cache_read(conv, data_read(sch.get(conv)), "global")
        sch.transform_layout(copy, ("write", 0), lambda n, ch, y, x: (n, ch, y * ow + x))
        sch.transform_block_layout(copy, lambda n, ch, y, x: (n, ch, y * ow + x))
        sch.pad_einsum(conv, [1, 1, width, 1, 1, 1])
        stmt = sch.get(conv)
        padded_input = stmt.reads[data_read(stmt)].source
        pad_in = writer_of(sch, list(sch.get_producers(conv)), padded_input)
        if pad_in is None:
            raise ValueError(f"1x1 conv: no block writes {padded_input.name}")
        consumers = sch.get_consumers(conv)
        if len(consumers) != 1:
            raise ValueError(f"1x1 conv: {len(consumers)} consumers of the padded output")
        pad_out = consumers[0]
        sch.compute_inline(copy)
        sch.compute_inline(pad_out)
        fill = sch.decompose_padding(pad_in, sch.get_loops(pad_in)[0])
        schedule_injective(sch, fill, cfg)
        schedule_injective(sch, pad_in, cfg)


class CPUReduction(CPURule):
    """One reduction block (pooling, matmul, mean, ...) plus injective pro/epilogues."""

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        cfg = self._config(target)
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        if blocks.main is None:
            return "no reduction block"
        info = match_reduction(sch, blocks.main)
        if isinstance(info, str):
            return info
        algorithm = "reduction"
        if not isinstance(match_pool2d(sch, blocks), str):
            algorithm = "pool"
        elif info.kinds.endswith("SSR") or info.kinds == "SR":
            algorithm = "matmul"
        prepare_prologue(sch, blocks, cfg)
        main = blocks.main
        writeback = sch.cache_write(main, 0, "global")
        inline_epilogue(sch, blocks, cfg)
        n_spatial = info.kinds.count("S")
        loops = sch.get_loops(main)
        spatial, reduction = loops[:n_spatial], loops[n_spatial:]
        work = math.prod(info.extents)
        lanes = cfg.lanes(info.dtype_bits)
        vector_loop = None
        unroll: list[LoopRV] = []
        if info.vector_axis is not None and info.extents[n_spatial - 1] > 1:
            width = choose_row_width(
                info.extents[n_spatial - 1], lanes, cfg.max_row_vectors, cfg.partial_vectors
            )
            vo, vi = sch.split(spatial[-1], [None, width])
            outer = [*spatial[:-1], vo]
            inner = [vi]
            if algorithm == "matmul" and n_spatial >= 2 and info.extents[n_spatial - 2] > 1:
                m_tile = min(cfg.matmul_m_tile, info.extents[n_spatial - 2])
                mo, mi = sch.split(spatial[-2], [None, m_tile])
                outer = [*spatial[:-2], mo, vo]
                inner = [mi, vi]
                unroll.append(mi)
            sch.reorder(*outer, *reduction, *inner)
            vector_loop = vi
        else:
            outer = spatial
        par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        features = finish_tile(
            sch, main, writeback, par, reduction[0], vector_loop, unroll, work, cfg
        )
        return algorithm, cfg.name, features


class CPUInjective(CPURule):
    """Kernels without reductions: inline producers, fuse, parallel chunks."""

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        cfg = self._config(target)
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        if blocks.main is not None:
            return "has a reduction block"
        if has_reshape_pattern(sch.mod["main"]):
            return "a reshape: left for RewriteDataflowReshape to turn into a view"
        remaining = []
        for block in blocks.prologue[:-1]:
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                remaining.append(block)
        remaining.extend(blocks.prologue[-1:])
        for block in remaining:
            schedule_injective(sch, block, cfg)
        return "injective", cfg.name
