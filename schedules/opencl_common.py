"""Schedule steps shared by the OpenCL rules of :mod:`codl_tvm.schedules.opencl`,
:mod:`~codl_tvm.schedules.opencl_dense` and :mod:`~codl_tvm.schedules.winograd`.

Owns the OpenCL rule base class (:class:`OpenCLRule`), the mapping of spatial blocks onto
workgroups (:func:`bind_spatial`, :func:`inline_prologue`, :func:`inline_epilogue`), a
work-item's register tile write-back (:func:`finish_register_tile`) and the arithmetic of
vector widths, thread counts and local-memory limits.
"""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .analysis import FuncBlocks, reverse_inline_epilogue
from .common import ConfiguredRule
from .config import OpenCLConfig
from .settings import opencl_config

__all__ = [
    "OpenCLRule",
    "bind_spatial",
    "finish_register_tile",
    "fit_threads",
    "inline_epilogue",
    "inline_prologue",
    "local_limit",
    "opencl_vector_width",
    "read_index",
]


def bind_spatial(sch: s_tir.Schedule, block: SBlockRV, threads: int) -> None:
    """Map a spatial block onto a 1-D grid of ``threads``-wide workgroups."""
    loops = sch.get_loops(block)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = int(sch.get(fused).extent)
    bx, tx = sch.split(fused, [None, max(1, min(threads, total))])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def inline_prologue(sch: s_tir.Schedule, blocks: FuncBlocks, threads: int) -> None:
    """Inline prologue blocks (padding, copies) into their consumers; bind those that resist."""
    for block in blocks.prologue:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            bind_spatial(sch, block, threads)


def inline_epilogue(sch: s_tir.Schedule, blocks: FuncBlocks, threads: int) -> None:
    """Inline elementwise epilogues into the write-back block; bind those that resist."""
    for block in reverse_inline_epilogue(sch, blocks):
        bind_spatial(sch, block, threads)


def finish_register_tile(
    sch: s_tir.Schedule,
    main: SBlockRV,
    writeback: SBlockRV,
    thread_loop: LoopRV,
    outer: LoopRV,
    inner: LoopRV,
    reduction_loop: LoopRV,
    vectorize: bool,
) -> None:
    """Write a work-item's register tile back under its thread loop: the ``outer`` tile loop
    unrolled, the ``inner`` one vectorised (write-back and zero-init too) or unrolled."""
    sch.reverse_compute_at(writeback, thread_loop, preserve_unit_loops=True)
    sch.unroll(outer)
    if vectorize:
        sch.vectorize(inner)
        sch.vectorize(sch.get_loops(writeback)[-1])
    else:
        sch.unroll(inner)
    init = sch.decompose_reduction(main, reduction_loop)
    if vectorize:
        sch.vectorize(sch.get_loops(init)[-1])


def read_index(sch: s_tir.Schedule, block: SBlockRV, buffer) -> int:
    """Position of ``buffer`` among ``block``'s reads (for ``cache_read``)."""
    for i, region in enumerate(sch.get(block).reads):
        if region.source.same_as(buffer):
            return i
    raise s_tir.ScheduleError(f"block does not read {buffer}")


class OpenCLRule(ConfiguredRule):
    """Base of the OpenCL rules: gated on ``opencl`` targets; the default config is the
    target's preset under the rule's :class:`~codl_tvm.schedules.settings.ScheduleSettings`."""

    target_kind = "opencl"

    def default_config(self, target: Target) -> OpenCLConfig:
        return opencl_config(target, self.settings)


def opencl_vector_width(extent: int, lanes: int) -> int:
    """Widest OpenCL vector type (16, 8, 4, 3 or 2 lanes, at most ``lanes``) dividing extent."""
    for width in (16, 8, 4, 3, 2):
        if width <= lanes and extent % width == 0:
            return width
    return 1


def fit_threads(threads: int, reg: int, extent: int) -> int:
    """Shrink a thread count so threads * reg does not overshoot extent by more than one tile."""
    return max(1, min(threads, math.ceil(extent / max(1, reg))))


def local_limit(cfg, target: Target) -> int:
    """Local memory one workgroup may use: the target's and the config's limits (the smaller),
    16 KiB (OpenCL's guaranteed minimum) when neither says."""
    limit = int(target.attrs.get("max_shared_memory_per_block", 0) or 0)
    if cfg.local_memory_bytes:
        limit = min(limit, cfg.local_memory_bytes) if limit else cfg.local_memory_bytes
    return limit or 16384
