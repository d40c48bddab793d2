"""Schedule steps shared by the CPU (``llvm``) rules of :mod:`codl_tvm.schedules.cpu`,
:mod:`~codl_tvm.schedules.packed` and :mod:`~codl_tvm.schedules.winograd`.

Owns the CPU rule base class (:class:`CPURule`) and the steps every CPU kernel takes around its
main loop nest: parallel elementwise blocks (:func:`schedule_injective`), prologues and
epilogues inlined or parallelised (:func:`prepare_prologue`, :func:`inline_epilogue`) and the
register tile's tail (:func:`finish_tile`).
"""

from __future__ import annotations

import math

from tvm import s_tir
from tvm.s_tir.schedule import LoopRV, SBlockRV
from tvm.target import Target

from .analysis import FuncBlocks, is_trivial_copy, reverse_inline_epilogue
from .common import ConfiguredRule
from .config import CPUConfig
from .settings import cpu_config

__all__ = [
    "CPURule",
    "finish_tile",
    "inline_epilogue",
    "loop_extent",
    "prepare_prologue",
    "schedule_injective",
]


def loop_extent(sch: s_tir.Schedule, loop: LoopRV) -> int:
    """The constant extent of ``loop``."""
    return int(sch.get(loop).extent)


def schedule_injective(sch: s_tir.Schedule, block: SBlockRV, cfg: CPUConfig) -> None:
    """Run a spatial block's outer loops in parallel; the innermost loop stays a plain loop.

    Fusing the innermost loop too would recover its index with a division and a modulo per
    element (measured: the padding copy of a conv then cost more than the conv).
    """
    loops = sch.get_loops(block)
    if not loops:
        return
    total = math.prod(loop_extent(sch, lp) for lp in loops)
    if total < cfg.min_parallel_work:
        return
    if len(loops) == 1:
        outer, _ = sch.split(loops[0], [None, max(cfg.injective_chunk, 1)])
    else:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    if loop_extent(sch, outer) > 1:
        sch.parallel(outer)


def prepare_prologue(sch: s_tir.Schedule, blocks: FuncBlocks, cfg: CPUConfig) -> None:
    """Inline plain copies/reshapes into their consumers; parallelise the rest (padding)."""
    for block in blocks.prologue:
        if is_trivial_copy(sch, block):
            try:
                sch.compute_inline(block)
                continue
            except s_tir.ScheduleError:
                pass
        schedule_injective(sch, block, cfg)


def inline_epilogue(sch: s_tir.Schedule, blocks: FuncBlocks, cfg: CPUConfig) -> None:
    """Inline elementwise epilogues into the write-back block; parallelise any that resist."""
    for block in reverse_inline_epilogue(sch, blocks):
        schedule_injective(sch, block, cfg)


def finish_tile(
    sch: s_tir.Schedule,
    main: SBlockRV,
    writeback: SBlockRV,
    parallel_loop: LoopRV,
    first_reduction: LoopRV,
    vector_loop: LoopRV | None,
    unroll: list[LoopRV],
    work: int,
    cfg: CPUConfig,
) -> dict[str, int]:
    """Common tail: write-back under the parallel loop, init split off, vectorise, unroll.

    Returns the ``codl.parallel_extent`` and ``codl.vector_width`` of this loop nest.
    """
    sch.reverse_compute_at(writeback, parallel_loop, preserve_unit_loops=True)
    features = {"codl.parallel_extent": 0, "codl.vector_width": 1}
    if work >= cfg.min_parallel_work and loop_extent(sch, parallel_loop) > 1:
        features["codl.parallel_extent"] = loop_extent(sch, parallel_loop)
        sch.parallel(parallel_loop)
    for loop in unroll:
        if loop_extent(sch, loop) > 1:
            sch.unroll(loop)
    if vector_loop is not None and loop_extent(sch, vector_loop) > 1:
        features["codl.vector_width"] = loop_extent(sch, vector_loop)
        sch.vectorize(vector_loop)
    wb_loops = sch.get_loops(writeback)
    if vector_loop is not None and len(wb_loops) > 1 and loop_extent(sch, wb_loops[-1]) > 1:
        sch.vectorize(wb_loops[-1])
    init = sch.decompose_reduction(main, first_reduction)
    init_loops = sch.get_loops(init)
    if vector_loop is not None and len(init_loops) > 1 and loop_extent(sch, init_loops[-1]) > 1:
        sch.vectorize(init_loops[-1])
    return features


class CPURule(ConfiguredRule):
    """Base of the CPU rules: gated on ``llvm`` targets; the default config is the target's
    preset under the rule's :class:`~codl_tvm.schedules.settings.ScheduleSettings`."""

    target_kind = "llvm"

    def default_config(self, target: Target) -> CPUConfig:
        return cpu_config(target, self.settings)
