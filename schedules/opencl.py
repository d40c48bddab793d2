"""OpenCL schedule rules: direct conv2d with workgroup tiling, and window pooling.

Works on the same NCHW PrimFuncs as the CPU rules (see :mod:`codl_tvm.schedules.cpu` for the
layout choice). Parameters per device class come from
:class:`~codl_tvm.schedules.config.OpenCLConfig`.

``direct`` conv2d
    Each work-item computes ``reg_oc`` output channels x ``reg_ow`` output columns of one row
    in private registers, accumulating over ``(c, ky, kx)``; a workgroup covers
    ``threads_oc * reg_oc`` channels x ``threads_oh`` rows x ``threads_ow * reg_ow`` columns.
    Padding is inlined into the input read (a bounds check per load, cheap on GPUs), fused
    elementwise epilogues into the register write-back. Grid: ``(n * oc blocks, oh blocks,
    ow blocks)``; thread tiles shrink to the output so a 1-row or 1-channel part of a split conv
    does not launch idle work-items, and register tiles shrink until at least
    ``min_work_items`` work-items run (a big GPU on a 13x13 layer). With
    ``conv_use_local_memory`` (NVIDIA, Adreno) the workgroup first stages ``conv_ic_chunk``
    input channels of its input rows (padding applied there) and of its weights in local
    memory, cooperatively, then reduces from local memory; the chunk shrinks to fit the
    target's ``max_shared_memory_per_block``. Grouped convs read global memory directly.
    A conv whose whole register tiles leave fewer than ``min_work_items`` work-items splits its
    input channels into ``conv_split_k`` slices at most (split-K, ``codl.split_k``): an
    ``rfactor`` kernel writes each slice's partial sums to a workspace, one work-item per
    output adds them in a second kernel with the epilogue fused.
    With ``conv_vector_lanes`` (CPU OpenCL: PoCL) each work-item is a CPU-style register tile:
    its output columns are one OpenCL vector (``vload16``/``float16``), since PoCL vectorises
    only innermost loops and would otherwise run the reduction in scalar code; padding then
    runs as its own kernel.
``pool``
    One work-item per output element; the window is reduced serially in a register. A window
    of more than :data:`SERIAL_WINDOW_MAX` elements (a mean over a whole feature map, as
    InstanceNorm is imported) is declined: one work-item per channel would sum thousands of
    values in float32 one after another (FST's 256x256 maps: 3e-4 from an exact answer, ten
    times onnxruntime's error) on a handful of work-items; dlight's cross-thread reduction
    takes it instead.

Dense/matmul, GEMV, other reductions and everything else fall back to dlight's GPU rules, wrapped
so that their kernels record ``codl.*`` attributes too (see
:func:`codl_tvm.schedules.schedule_rules`).
Winograd convs (3x3, stride 1, chosen before legalization with ``OpenCLConfig.winograd``) are
scheduled by :class:`~codl_tvm.schedules.winograd.OpenCLWinograd`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .analysis import (
    FuncBlocks,
    buffer_loads,
    classify_blocks,
    is_trivial_copy,
    match_conv2d,
    match_pool2d,
)
from .config import OpenCLConfig
from .opencl_common import (
    OpenCLRule,
    bind_spatial,
    fit_threads,
    inline_epilogue,
    inline_prologue,
    local_limit,
    opencl_vector_width,
    read_index,
)

__all__ = ["OpenCLConv2D", "OpenCLPool2D"]


def _data_buffer(sch: s_tir.Schedule, conv: SBlockRV):
    """The conv's input (pad output or parameter): the read that is not [f, c, ky, kx]."""
    stmt = sch.get(conv)
    weight = _weight_buffer(sch, conv, None)
    for region in stmt.reads:
        if not region.source.same_as(stmt.body.buffer) and not region.source.same_as(weight):
            return region.source
    raise s_tir.ScheduleError("conv block has no data operand")


def _weight_buffer(sch: s_tir.Schedule, conv: SBlockRV, _data):
    stmt = sch.get(conv)
    ivs = [iv.var for iv in stmt.iter_vars]
    f, c, ky, kx = ivs[1], ivs[4], ivs[5], ivs[6]
    for load in buffer_loads(stmt.body.value):
        idx = list(load.indices)
        if len(idx) == 4 and all(i.same_as(v) for i, v in zip(idx, (f, c, ky, kx))):
            return load.source
    raise s_tir.ScheduleError("conv block has no OIHW weight operand")


def conv_thread_tile(
    extents: tuple[int, int, int],
    outputs: int,
    registers: tuple[int, int],
    threads: tuple[int, int, int],
    min_work_items: int,
    max_workgroup_size: int,
    shrink_registers: bool = True,
) -> tuple[int, int, int, int, int]:
    """The direct conv's register and work-group tile: ``(reg_oc, reg_ow, t_oc, t_oh, t_ow)``.

    ``extents`` are the output channels, rows and columns, ``outputs`` the outputs times the
    split-K slices, ``registers`` the preset's (oc, ow) register tile and ``threads`` its (oc,
    oh, ow) work-group threads. The register tile halves while too few work-items would run
    (unless ``shrink_registers`` is off: the vector paths keep their lanes); the threads then
    fit the extents and halve until the work-group fits the device. Pure arithmetic, shared
    with the cost model's guard features, which must reproduce the kernels' tiles.
    """
    oc, oh, ow = extents
    reg_oc, reg_ow = registers
    while shrink_registers and outputs < min_work_items * reg_oc * reg_ow and reg_oc * reg_ow > 1:
        if reg_oc >= reg_ow:
            reg_oc = max(1, reg_oc // 2)
        else:
            reg_ow = max(1, reg_ow // 2)
    t_oc = fit_threads(threads[0], reg_oc, oc)
    t_ow = fit_threads(threads[2], reg_ow, ow)
    t_oh = fit_threads(threads[1], 1, oh)
    while t_oc * t_ow * t_oh > max_workgroup_size:
        if t_oc >= t_oh and t_oc > 1:
            t_oc = max(1, t_oc // 2)
        elif t_oh > 1:
            t_oh = max(1, t_oh // 2)
        else:
            t_ow = max(1, t_ow // 2)
    return reg_oc, reg_ow, t_oc, t_oh, t_ow


_STAGE_TOO_BIG = "local-memory stage larger than the device allows"
#: The largest pooling window one work-item reduces (the global pools of the benchmark CNNs:
#: 7x7 to 13x13).
SERIAL_WINDOW_MAX = 256


class OpenCLConv2D(OpenCLRule):
    """Direct NCHW conv2d with workgroup and register tiling (any shape, groups, dilation)."""

    _global_only = False

    def apply(self, func, target: Target, tunable: bool):
        # Bounds inference can stage far more than the tile estimate (e.g. a strided conv whose
        # padding is inlined into the copy): such a kernel would not build on the device
        # ("uses too much shared data"), so it is rescheduled reading global memory.
        out = super().apply(func, target, tunable)
        if out is None and self._last_reason and self._last_reason.startswith(_STAGE_TOO_BIG):
            self._global_only = True
            try:
                out = super().apply(func, target, tunable)
            finally:
                self._global_only = False
        return out

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        cfg = self._config(target)
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        info = match_conv2d(sch, blocks)
        if isinstance(info, str):
            return f"not a conv2d: {info}"
        tile = _conv_tile(cfg, info)
        chunk = 0
        if not self._global_only:
            chunk = self._local_chunk(
                cfg,
                target,
                info,
                tile.t_oc * tile.reg_oc,
                tile.t_oh,
                tile.t_ow * tile.reg_ow,
                tile.split_k,
            )
        conv = blocks.main
        data_buffer = _data_buffer(sch, conv)
        weight_buffer = _weight_buffer(sch, conv, data_buffer)
        padder = next(
            (b for b in blocks.prologue if sch.get(b).body.buffer.same_as(data_buffer)), None
        )
        if chunk:
            # the pad block is inlined into the local-memory copy below, not into the conv
            inline_prologue(sch, blocks.without(padder), cfg.pool_threads)
        elif tile.vector and padder is not None and not is_trivial_copy(sch, padder):
            # a bounds check inside the vector loop would scalarise it: pad in its own kernel
            inline_prologue(sch, blocks.without(padder), cfg.pool_threads)
            bind_spatial(sch, padder, cfg.pool_threads)
        else:
            inline_prologue(sch, blocks, cfg.pool_threads)
        total = conv
        if tile.split_k > 1:
            # partial sums of each input-channel slice (the block scheduled below), then a
            # kernel that adds the slices with the epilogue fused
            n, f, y, x, c, ky, kx = sch.get_loops(conv)
            slices, c = sch.split(c, [tile.split_k, None])
            conv = sch.rfactor(slices, 0)
            n, f, y, x, slices, c, ky, kx = sch.get_loops(conv)
            sch.reorder(slices, n, f, y, x)
            _schedule_slice_sum(sch, total, blocks, cfg.pool_threads)
        else:
            n, f, y, x, c, ky, kx = sch.get_loops(conv)
        bf, tf, rf = sch.split(f, [None, tile.t_oc, tile.reg_oc])
        by, ty = sch.split(y, [None, tile.t_oh])
        bx, tx, rx = sch.split(x, [None, tile.t_ow, tile.reg_ow])
        bz = sch.fuse(slices, n, bf) if tile.split_k > 1 else sch.fuse(n, bf)
        sch.bind(bz, "blockIdx.z")
        sch.bind(by, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        threads = tile.t_oc * tile.t_oh * tile.t_ow
        first_reduction = c
        if chunk:
            co, ci = sch.split(c, [None, chunk])
            sch.reorder(bz, by, bx, tf, ty, tx, co, ci, ky, kx, rf, rx)
        elif tile.oc_vector:
            sch.reorder(bz, by, bx, tf, ty, tx, c, ky, kx, rx, rf)
        else:
            sch.reorder(bz, by, bx, tf, ty, tx, c, ky, kx, rf, rx)
        t = sch.fuse(tf, ty, tx)
        sch.bind(t, "threadIdx.x")
        if chunk:
            buffers = (data_buffer, weight_buffer)
            staged = _stage_local(sch, conv, co, buffers, threads, padder, info.dtype_bits)
            first_reduction = co
            limit = local_limit(cfg, target)
            if staged > limit:
                return f"{_STAGE_TOO_BIG}: {staged} > {limit} bytes"
        writeback = sch.cache_write(conv, 0, "local")
        if tile.oc_vector:
            # channels innermost in the private accumulators: one vector per column
            sch.transform_layout(conv, ("write", 0), lambda n, f, y, x: (n, y, x, f))
        if tile.split_k == 1:
            inline_epilogue(sch, blocks, cfg.pool_threads)
        _finish_conv_tile(sch, conv, writeback, t, (rf, rx, kx), first_reduction, tile, info)
        groups = (
            info.batch
            * tile.split_k
            * math.ceil(info.out_channels / (tile.t_oc * tile.reg_oc))
            * math.ceil(info.out_height / tile.t_oh)
            * math.ceil(info.out_width / (tile.t_ow * tile.reg_ow))
        )
        # the conv's own launch (a padding kernel, if any, has its own shape)
        features = {"codl.workgroup_size": threads, "codl.workgroup_count": groups}
        if tile.split_k > 1:
            features["codl.split_k"] = tile.split_k
        return "direct", cfg.name, features

    @staticmethod
    def _local_chunk(
        cfg, target, info, tile_oc: int, tile_oh: int, tile_ow: int, split_k: int = 1
    ) -> int:
        """Input channels staged per step in local memory (0: read global memory directly);
        it divides each split-K slice's channels."""
        if not cfg.conv_use_local_memory:
            return 0
        if info.stride_h > 1 or info.stride_w > 1:
            # TVM 0.27 does not compact a strided conv's stage to its tile: the NVIDIA compiler
            # refused a 697 KB stage of a stride-2 224x224 conv that the loops said was 3 KB.
            return 0
        limit = local_limit(cfg, target)
        rows = (tile_oh - 1) * info.stride_h + (info.kernel_h - 1) * info.dilation_h + 1
        cols = (tile_ow - 1) * info.stride_w + (info.kernel_w - 1) * info.dilation_w + 1
        nbytes = info.dtype_bits // 8
        channels = info.in_channels_per_group // split_k
        chunk = min(cfg.conv_ic_chunk, channels)
        while chunk >= 1:
            data = chunk * rows * cols if info.groups == 1 else 0
            weights = tile_oc * chunk * info.kernel_h * info.kernel_w
            if (data + weights) * nbytes <= limit and channels % chunk == 0:
                break
            chunk -= 1
        if info.groups != 1 or chunk < 1:
            return 0  # grouped convs read a different input channel per output channel
        return chunk


@dataclass(frozen=True)
class _ConvTile:
    """The direct conv's tiles: registers per work-item, work-items per workgroup, split-K
    slices, and whether work-items are vectors over columns or over output channels."""

    reg_oc: int
    reg_ow: int
    t_oc: int
    t_oh: int
    t_ow: int
    split_k: int
    vector: bool
    oc_vector: bool


def _conv_tile(cfg: OpenCLConfig, info) -> _ConvTile:
    """The register, thread and split-K tiles of a direct conv under ``cfg``."""
    reg_oc = min(cfg.conv_reg_oc, info.out_channels)
    reg_ow = min(cfg.conv_reg_ow, info.out_width)
    vector = cfg.conv_vector_lanes > 1
    oc_vector = False
    if vector:
        reg_ow = opencl_vector_width(info.out_width, cfg.conv_vector_lanes)
        oc_lanes = opencl_vector_width(info.out_channels, cfg.conv_vector_lanes)
        if reg_ow < 4 and oc_lanes >= 4:
            # an odd row (13, 7, 27): vectorise over output channels instead, a row of
            # up to 16 columns unrolled; weights are gathered once per tap for the row
            oc_vector = True
            reg_oc = oc_lanes
            reg_ow = max(w for w in range(1, 17) if info.out_width % w == 0)
    outputs = info.batch * info.out_channels * info.out_height * info.out_width
    split_k = 1 if vector else _split_k(cfg, info, reg_oc, reg_ow)
    rows = cfg.conv_threads_oh_pointwise if info.pointwise else 0
    reg_oc, reg_ow, t_oc, t_oh, t_ow = conv_thread_tile(
        (info.out_channels, info.out_height, info.out_width),
        outputs * split_k,
        (reg_oc, reg_ow),
        (cfg.conv_threads_oc, rows or cfg.conv_threads_oh, cfg.conv_threads_ow),
        cfg.min_work_items,
        cfg.max_workgroup_size,
        shrink_registers=not vector,
    )
    return _ConvTile(reg_oc, reg_ow, t_oc, t_oh, t_ow, split_k, vector, oc_vector)


def _stage_local(
    sch: s_tir.Schedule,
    conv: SBlockRV,
    step: LoopRV,
    buffers: tuple,
    threads: int,
    padder: SBlockRV | None,
    dtype_bits: int,
) -> int:
    """Stage the conv's input rows and weights in local memory at each ``step`` of its
    channel chunks, copied cooperatively by the workgroup's ``threads`` (the pad block inlined
    into the input's copy); returns the bytes staged per step."""
    data_buffer = buffers[0]
    staged = 0
    for buf in buffers:
        index = read_index(sch, conv, buf)
        shared = sch.cache_read(conv, index, "shared")
        sch.compute_at(shared, step, preserve_unit_loops=True)
        inner = sch.get_loops(shared)[5:]
        # elements copied per step: the loops compute_at left under the stage point
        elements = 1
        for loop in inner:
            elements *= int(sch.get(loop).extent)
        staged += elements * dtype_bits // 8
        fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        _, tx_copy = sch.split(fused, [None, threads])
        sch.bind(tx_copy, "threadIdx.x")
        if buf.same_as(data_buffer) and padder is not None:
            sch.compute_inline(padder)
    return staged


def _finish_conv_tile(
    sch: s_tir.Schedule,
    conv: SBlockRV,
    writeback: SBlockRV,
    thread_loop: LoopRV,
    tile_loops: tuple[LoopRV, LoopRV, LoopRV],
    first_reduction: LoopRV,
    tile: _ConvTile,
    info,
) -> None:
    """Write the register tile back under the thread loop; unroll or vectorise the tile loops
    ``(rf, rx, kx)`` and split the zero-init off at ``first_reduction``."""
    rf, rx, kx = tile_loops
    sch.reverse_compute_at(writeback, thread_loop, preserve_unit_loops=True)
    if tile.oc_vector:
        sch.unroll(rx)
        sch.vectorize(rf)
    elif tile.vector and tile.reg_ow > 1:
        sch.unroll(rf)
        sch.vectorize(rx)
        sch.vectorize(sch.get_loops(writeback)[-1])
    else:
        sch.unroll(rf)
        sch.unroll(rx)
    if info.kernel_w <= 7:
        sch.unroll(kx)
    init = sch.decompose_reduction(conv, first_reduction)
    if (tile.vector and tile.reg_ow > 1) or tile.oc_vector:
        sch.vectorize(sch.get_loops(init)[-1])


def _split_k(cfg: OpenCLConfig, info, reg_oc: int, reg_ow: int) -> int:
    """Input-channel slices of a direct conv (1: no split-K; see ``OpenCLConfig.conv_split_k``).

    Doubles while the work-items with whole register tiles stay below ``min_work_items``, the
    slices divide the channels, and each keeps ``conv_split_k_min_reduction`` multiply-adds.
    """
    if info.groups != 1 or cfg.conv_split_k <= 1:
        return 1
    items = (
        info.batch
        * math.ceil(info.out_channels / reg_oc)
        * info.out_height
        * math.ceil(info.out_width / reg_ow)
    )
    taps = info.kernel_h * info.kernel_w
    split = 1
    while items * split < cfg.min_work_items and split * 2 <= cfg.conv_split_k:
        slices = split * 2
        if info.in_channels % slices:
            break
        if info.in_channels // slices * taps < cfg.conv_split_k_min_reduction:
            break
        split = slices
    return split


def _schedule_slice_sum(sch: s_tir.Schedule, total: SBlockRV, blocks: FuncBlocks, threads: int):
    """The split-K sum: one work-item per output adds the slices in a register, then writes
    it through the fused epilogue."""
    writeback = sch.cache_write(total, 0, "local")
    inline_epilogue(sch, FuncBlocks([], total, blocks.epilogue), threads)
    *spatial, slices = sch.get_loops(total)
    fused = sch.fuse(*spatial)
    extent = int(sch.get(fused).extent)
    bx, tx = sch.split(fused, [None, max(1, min(threads, extent))])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(writeback, tx, preserve_unit_loops=True)
    sch.decompose_reduction(total, slices)


class OpenCLPool2D(OpenCLRule):
    """NCHW window pooling (max, or the sum of an average pool with its divide fused)."""

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        cfg = self._config(target)
        blocks = classify_blocks(sch)
        if isinstance(blocks, str):
            return blocks
        info = match_pool2d(sch, blocks)
        if isinstance(info, str):
            return f"not a pool2d: {info}"
        if math.prod(info.window) > SERIAL_WINDOW_MAX:
            return (
                f"a {info.window[0]}x{info.window[1]} window is more than {SERIAL_WINDOW_MAX} "
                "values to sum in one work-item"
            )
        inline_prologue(sch, blocks, cfg.pool_threads)
        pool = blocks.main
        n, ch, y, x, ky, _ = sch.get_loops(pool)
        fused = sch.fuse(n, ch, y, x)
        total = math.prod(info.out_shape)
        bx, tx = sch.split(fused, [None, max(1, min(cfg.pool_threads, total))])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        writeback = sch.cache_write(pool, 0, "local")
        inline_epilogue(sch, blocks, cfg.pool_threads)
        sch.reverse_compute_at(writeback, tx, preserve_unit_loops=True)
        sch.decompose_reduction(pool, ky)
        return "pool", cfg.name
