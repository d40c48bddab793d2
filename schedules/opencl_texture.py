"""Conversion kernels between NCHW buffers and NCHW4c OpenCL images (texture scopes).

TVM 0.27's own rule for these kernels (``s_tir.dlight.adreno.LayoutTransform``) caches the NCHW
input in registers and then stores one scalar per ``write_imagef``; a texture store always
writes a whole RGBA pixel, so each pixel ends up holding channel ``4k + 3`` in all four lanes.
:class:`TextureLayoutTransform` schedules the conversions so that every image access is one
whole pixel: towards an image, the four channels of a pixel are the innermost, vectorised loop
(four strided loads, one ``write_imagef``); from an image, the output's channel loop is split
into pixel and lane and the lane is vectorised (one ``read_imagef``, four strided stores).

It handles the ``te_layout_transform`` PrimFuncs that ``codl.ToTextureLayout``'s
``layout_transform`` bindings legalize to, once TVM's Adreno passes have put a texture scope on
one side (``SpecializePrimFuncBasedOnCallSite``). Put it before dlight's Adreno rules. It gates on
OpenCL targets whose keys hold ``texture``.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.target import Target

from .common import CodlRule

__all__ = ["TextureLayoutTransform", "is_texture_scope"]

#: Channels of one RGBA pixel.
_LANES = 4


def is_texture_scope(scope: str) -> bool:
    """Whether a buffer of this storage scope lives in an OpenCL image (TVM's convention)."""
    return "texture" in scope


def _threads(target: Target) -> int:
    limit = target.attrs.get("max_threads_per_block") or target.attrs.get("max_num_threads")
    return int(limit or 64)


class TextureLayoutTransform(CodlRule):
    """Whole-pixel conversion kernels NCHW <-> NCHW4c for image-backed tensors."""

    target_kind = "opencl"

    def is_target_available(self, target: Target) -> bool:
        return super().is_target_available(target) and "texture" in target.keys

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        root = sch.get_sblock("root")
        blocks = sch.get_child_blocks(root)
        if len(blocks) != 1:
            return f"{len(blocks)} blocks, a layout transform has one"
        blk = blocks[0]
        block = sch.get(blk)
        if len(block.reads) != 1 or len(block.writes) != 1:
            return "not a copy of one buffer into another"
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
            return "has a reduction"
        src, dst = block.reads[0].source, block.writes[0].source
        image = dst if is_texture_scope(dst.scope()) else src
        if not is_texture_scope(image.scope()):
            return "neither side is in a texture scope"
        if len(image.shape) != 5 or int(image.shape[-1]) != _LANES:
            return "the image side is not NCHW4c (innermost axis one RGBA pixel)"
        # topi's layout_transform loops over its input: NCHW (to an image) or NCHW4c (from one)
        loops = sch.get_loops(blk)
        extents = [int(sch.get(lp).extent) for lp in loops]
        if len(loops) == 4 and extents[1] % _LANES == 0 and image is dst:
            n, c, h, w = loops
            pixel, lane = sch.split(c, [None, _LANES])
            sch.reorder(n, pixel, h, w, lane)
            outer = [n, pixel, h, w]
        elif len(loops) == 5 and extents[-1] == _LANES and image is src:
            outer, lane = loops[:-1], loops[-1]
        else:
            return f"loops {extents} are neither NCHW to an image nor NCHW4c from one"
        bx, tx = sch.split(sch.fuse(*outer), [None, _threads(target)])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        # the pixel's four channels pass through registers, contiguous there, so the image
        # access is one vector of 4 (TVM scalarises a texture access whose lanes are strided)
        if image is dst:
            cache = sch.cache_read(blk, 0, "local")
            sch.compute_at(cache, tx)
        else:
            cache = sch.cache_write(blk, 0, "local")
            sch.reverse_compute_at(cache, tx)
        sch.vectorize(sch.get_loops(blk)[-1])
        return "layout_transform", "texture"

    def apply(self, func, target, tunable):
        # only layout transforms: this rule must not take the elementwise kernels dlight's
        # Adreno Fallback schedules, which read and write images as well
        if not isinstance(func, tirx.PrimFunc) or not _is_layout_transform(func):
            self._last_reason = "not a te_layout_transform PrimFunc"
            return None
        return super().apply(func, target, tunable)


def _is_layout_transform(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block named as topi's ``layout_transform`` names it."""
    sch = s_tir.Schedule(func)
    try:
        root = sch.get_sblock("root")
    except (s_tir.ScheduleError, ValueError):
        return False
    return [sch.get(b).name_hint for b in sch.get_child_blocks(root)] == ["te_layout_transform"]
