"""OC cuts rounded to whole image pixels for the GPU (CoDL's hybrid data type).

A co-executed GPU part computes on OpenCL images only when its channels fill whole RGBA pixels
(:class:`~codl_tvm.passes.texture_parts.PackGpuParts`: a multiple of 4); a grid share such as
0.3 of 32 channels gives the GPU 10 and leaves the part in buffers. :func:`rounded_ratio` moves
a share to the nearest cut of whole pixels, so the planner can weigh it against the grid's cut
(:attr:`~codl_tvm.planner.split.config.PlannerConfig.gpu_channels`). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["rounded_ratio"]


def rounded_ratio(
    ratio: float, extent: int, cut_of: Callable[[float], int], multiple: int
) -> float | None:
    """The GPU share nearest ``ratio`` whose cut gives the GPU a multiple of ``multiple``
    channels of ``extent`` and leaves both processors some: ``ratio`` itself where its cut
    already does, else ``k / extent`` for the nearest such cut ``k`` (the lower one on a tie)
    that ``cut_of`` (share -> the GPU's channels, the partitioning passes' rounding) reproduces;
    None where no such cut exists (``extent`` of at most ``multiple`` channels, or a
    granularity the multiple does not fit).

    >>> rounded_ratio(0.3, 32, lambda r: round(r * 32), 4)
    0.25
    """
    cut = cut_of(ratio)
    if cut % multiple == 0 and 0 < cut < extent:
        return ratio
    low = cut // multiple * multiple
    for k in sorted((low, low + multiple), key=lambda k: (abs(k - cut), k)):
        if 0 < k < extent and cut_of(k / extent) == k:
            return k / extent
    return None
