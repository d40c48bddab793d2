"""The tiling of codl's OpenCL direct-conv rule, mirrored without TVM, and the features it
gives the GBDT: which tile a part's kernel got under the NVIDIA preset's settings the H100
campaigns were built with (:data:`DIRECT_TILINGS`, :func:`direct_tile`), the bounds checks
that tile leaves in the kernel (:func:`conv_guards`, the ``"guards"`` feature set named by
:data:`GUARD_FEATURE_NAMES`), and the preset settings that rebuild a recorded kernel
(:func:`direct_settings`, for ``kernel_counts``).

The thread tile is the rule's own function (``schedules.opencl.conv_thread_tile``); the
arithmetic around it (register tiles, split-K, work-group count) follows
``schedules/opencl.py``'s direct conv and is checked against the kernels it builds
(tests/test_cost_model_wave.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from codl_tvm.cost_model.features import OpFeatures

__all__ = [
    "DIRECT_TILINGS",
    "GUARD_FEATURE_NAMES",
    "DirectTiling",
    "conv_guards",
    "direct_settings",
    "direct_tile",
]

#: Bounds checks of codl's OpenCL direct conv (:func:`conv_guards`), after the dispatch-shape
#: features in the ``"guards"`` feature set.
GUARD_FEATURE_NAMES: tuple[str, ...] = ("guard_oc", "guard_oh", "guard_ow", "guard_oh_not_oc")


@dataclass(frozen=True)
class DirectTiling:
    """Settings of codl's OpenCL direct-conv rule (``schedules/opencl.py``) that shape its
    tile: threads per work-group along channels, rows and columns, outputs per work-item
    along channels and columns, the fewest work-items before register tiles shrink, and the
    largest split-K."""

    threads_oc: int
    threads_ow: int
    threads_oh: int
    threads_oh_pointwise: int
    reg_oc: int
    reg_ow: int
    max_workgroup_size: int
    min_work_items: int
    split_k: int
    split_k_min_reduction: int = 1024


#: The NVIDIA preset's settings the H100 campaigns were built with: the preset now (4 rows,
#: 16 channels per work-item) and before (2 rows, 8 channels), with and without split-K. Every
#: GPU conv record of the H100 dataset has the work-group size and count of one of them.
DIRECT_TILINGS: tuple[DirectTiling, ...] = tuple(
    DirectTiling(4, 16, rows, 2, reg_oc, 2, 1024, 32768, split_k)
    for rows, reg_oc in ((2, 8), (4, 16), (2, 16))
    for split_k in (8, 1)
)


def direct_tile(f: OpFeatures, t: DirectTiling) -> tuple[int, int, int, int, int, int]:
    """``(tile_oc, tile_oh, tile_ow, split_k, wg_size, wg_count)`` the direct-conv rule picks
    for the part under ``t`` (the rule's arithmetic, without TVM)."""
    q, p = f.part, f.params
    oc, oh, ow = q.oc, q.out_h, q.out_w
    groups = max(q.groups, 1)
    reg_oc, reg_ow = min(t.reg_oc, oc), min(t.reg_ow, ow)
    split = 1
    if groups == 1 and t.split_k > 1:
        items = math.ceil(oc / reg_oc) * oh * math.ceil(ow / reg_ow)
        while items * split < t.min_work_items and split * 2 <= t.split_k:
            if q.ic % (split * 2) or q.ic // (split * 2) * p.kernel**2 < t.split_k_min_reduction:
                break
            split *= 2
    # deferred: the schedules package imports TVM, which importing the cost-model package
    # does not (the GBDT imports this module)
    from codl_tvm.schedules.opencl import conv_thread_tile

    pointwise = p.kernel == 1 and p.stride == 1 and not any(p.padding) and groups == 1
    reg_oc, reg_ow, t_oc, t_oh, t_ow = conv_thread_tile(
        (oc, oh, ow),
        oc * oh * ow * split,
        (reg_oc, reg_ow),
        (t.threads_oc, t.threads_oh_pointwise if pointwise else t.threads_oh, t.threads_ow),
        t.min_work_items,
        t.max_workgroup_size,
    )
    tile_oc, tile_ow = t_oc * reg_oc, t_ow * reg_ow
    count = split * math.ceil(oc / tile_oc) * math.ceil(oh / t_oh) * math.ceil(ow / tile_ow)
    return tile_oc, t_oh, tile_ow, split, t_oc * t_oh * t_ow, count


def conv_guards(f: OpFeatures, tilings: Sequence[DirectTiling] = DIRECT_TILINGS) -> list[float]:
    """The bounds checks in a GPU direct conv's kernel: whether its work-group tile leaves a
    partial tile along output channels, rows and columns (TVM then wraps the input staging,
    the accumulation and the store in ``if (channel < oc)`` / ``if (row < out_h)`` guards), and
    whether the rows are guarded and the channels are not.

    The tile is the direct-conv rule's under the first of ``tilings`` that reproduces the
    part's recorded work-group size and count; NaN for other kernels and unknown dispatch.
    The last flag is the one that tells apart SqueezeNet's conv2d_25 parts of one dispatch
    shape on the H100 (13x13 rows in 2-row tiles: 13 channels in 4-channel tiles 19 us, 16 or
    32 channels 33 us; 4 rows, no guard, 21 us).
    """
    nan = float("nan")
    d = f.dispatch
    if f.op != "conv2d" or f.processor != "gpu" or f.impl != "direct" or not d.wg_count:
        return [nan] * len(GUARD_FEATURE_NAMES)
    q = f.part
    for t in tilings:
        tile_oc, tile_oh, tile_ow, _, size, count = direct_tile(f, t)
        if (size, count) == (d.wg_size, d.wg_count):
            g_oc, g_oh, g_ow = q.oc % tile_oc != 0, q.out_h % tile_oh != 0, q.out_w % tile_ow != 0
            return [float(g_oc), float(g_oh), float(g_ow), float(g_oh and not g_oc)]
    return [nan] * len(GUARD_FEATURE_NAMES)


def direct_settings(f: OpFeatures) -> dict[str, int]:
    """The OpenCL preset settings (``OpenCLConfig`` fields) of the first of
    :data:`DIRECT_TILINGS` that reproduces a GPU direct conv record's work-group size and count,
    to rebuild its kernel as the campaign did (``kernel_counts.part_kernel_counts``); empty (the
    preset as it is) for other parts and unknown dispatch."""
    d = f.dispatch
    if f.op != "conv2d" or f.processor != "gpu" or f.impl != "direct" or not d.wg_count:
        return {}
    for t in DIRECT_TILINGS:
        if direct_tile(f, t)[4:] == (d.wg_size, d.wg_count):
            return {
                "conv_threads_oc": t.threads_oc,
                "conv_threads_ow": t.threads_ow,
                "conv_threads_oh": t.threads_oh,
                "conv_threads_oh_pointwise": t.threads_oh_pointwise,
                "conv_reg_oc": t.reg_oc,
                "conv_reg_ow": t.reg_ow,
                "max_workgroup_size": t.max_workgroup_size,
                "min_work_items": t.min_work_items,
                "conv_split_k": t.split_k,
                "conv_split_k_min_reduction": t.split_k_min_reduction,
            }
    return {}
