"""Schedules of kernels that compute on OpenCL images (TVM's ``global.texture*`` scopes).

The rules gate on OpenCL targets whose keys hold ``texture`` and go before dlight's Adreno
rules (:func:`codl_tvm.build.texture.schedule_passes`).

:class:`TextureLayoutTransform` schedules the conversions between NCHW buffers and NCHW4c
images that ``codl.ToTextureLayout``'s ``layout_transform`` bindings legalize to: one pixel per
work-item, its four channels gathered into registers and written with one ``write_imagef``
(towards an image; a pixel of an input with fewer channels gets zero lanes), or read with one
``read_imagef`` and scattered (from one), and the copies between two texture scopes
(:mod:`codl_tvm.passes.texture_scope_copy`): one ``read_imagef`` and one ``write_imagef`` per
pixel. In TVM 0.27 every
image store came out as four scalar stores of whole pixels (each pixel ending up with channel
``4k + 3`` in all lanes); the cause is in TIR lowering and is fixed there
(:func:`codl_tvm.build.texture.texture_store_type_fix`), after which dlight's own
``LayoutTransform`` is correct too. This rule is the simpler kernel (no register tile of four
pixels to transpose) and states why it declines.

:class:`TextureConv2d` is dlight's Adreno conv tiling with the zero padding inlined into the
conv's register cache of input pixels, so the conv reads its input image itself; dlight's rule
keeps the padding a kernel of its own that copies the image into a padded global buffer,
which the conv then reads (one extra kernel and buffer, and no texture reads in the conv).
It also takes depthwise convs over NCHW4c (:data:`DEPTHWISE_BLOCK`), which TVM 0.27's dlight
has no rule for: one output pixel per work-item over its window (:func:`schedule_window`),
the padding inlined into the image reads and each tap's weights one vector load, as the
Adreno depthwise schedule of TVM's former TOPI did.

:class:`TexturePool2D` schedules max, average and adaptive average pools (a global average
pool) the same way: one output pixel per work-item, its four lanes one vector.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight import adreno as dl_adreno
from tvm.s_tir.dlight.adreno import utils as dl_adreno_utils
from tvm.target import Target

from .common import CodlRule

__all__ = [
    "COPY_BLOCK",
    "DEPTHWISE_BLOCK",
    "TextureConv2d",
    "TextureLayoutTransform",
    "TexturePool2D",
    "is_texture_scope",
    "schedule_window",
]

#: The block of a copy kernel between two texture scopes
#: (:mod:`codl_tvm.passes.texture_scope_copy` makes them, :class:`TextureLayoutTransform`
#: schedules them).
COPY_BLOCK = "texture_copy"

#: The block of a depthwise conv over NCHW4c (:func:`codl_tvm.build.texture.
#: depthwise_conv2d_nchw4c` names it; :class:`TextureConv2d` schedules it).
DEPTHWISE_BLOCK = "depthwise_conv2d_NCHW4c"

#: Channels of one RGBA pixel.
_LANES = 4
#: A sum window of more pixels than this is summed row by row (:func:`schedule_window`).
ROW_SUM_WINDOW = 256


def is_texture_scope(scope: str) -> bool:
    """Whether a buffer of this storage scope lives in an OpenCL image (TVM's convention)."""
    return "texture" in scope


def _threads(target: Target, extent: int) -> int:
    """Work-items per workgroup over ``extent`` pixels: the largest divisor of ``extent`` within
    the target's limit. An exact split needs no bounds test, which the register caches' copy
    blocks would not get (TVM's ``reverse_compute_at`` drops the split's predicate, and the
    last workgroup would write past the tensor)."""
    limit = target.attrs.get("max_threads_per_block") or target.attrs.get("max_num_threads")
    limit = int(limit or 64)
    return max(d for d in range(1, min(limit, extent) + 1) if extent % d == 0)


class TextureLayoutTransform(CodlRule):
    """Whole-pixel conversion kernels NCHW <-> NCHW4c for image-backed tensors."""

    target_kind = "opencl"

    def is_target_available(self, target: Target) -> bool:
        return super().is_target_available(target) and "texture" in target.keys

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        root = sch.get_sblock("root")
        # elementwise producers fused into the conversion (a float16 model's cast of its
        # input) are computed in the conversion's registers
        for producer in sch.get_child_blocks(root)[:-1]:
            try:
                sch.compute_inline(producer)
            except s_tir.ScheduleError:
                return f"block {sch.get(producer).name_hint} cannot be inlined into the conversion"
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
        # topi's layout_transform loops over its input: NCHW (to an image) or NCHW4c (from one);
        # with padding (channels short of a pixel) over its NCHW4c output
        loops = sch.get_loops(blk)
        extents = [int(sch.get(lp).extent) for lp in loops]
        gather = len(loops) == 4 and extents[1] % _LANES == 0 and image is dst
        if gather:
            n, c, h, w = loops
            pixel, lane = sch.split(c, [None, _LANES])
            sch.reorder(n, pixel, h, w, lane)
            outer = [n, pixel, h, w]
        elif len(loops) == 5 and extents[-1] == _LANES:
            outer, lane = loops[:-1], loops[-1]
        else:
            return f"loops {extents} are neither NCHW to an image nor NCHW4c from one"
        fused = sch.fuse(*outer)
        bx, tx = sch.split(fused, [None, _threads(target, int(sch.get(fused).extent))])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if gather or (is_texture_scope(src.scope()) and is_texture_scope(dst.scope())):
            # the pixel's four channels are gathered in registers (from an image: one
            # read_imagef), contiguous there, and stored as one vector of 4 (one write_imagef)
            cache = sch.cache_read(blk, 0, "local")
            sch.compute_at(cache, tx)
            if not gather:
                sch.vectorize(sch.get_loops(cache)[-1])
        elif image is dst:
            # a padded pixel: its lanes (zero where the channel is padding) are computed into
            # registers one by one, then written as one vector (TVM cannot vectorise the
            # channel test into an image store)
            cache = sch.cache_write(blk, 0, "local")
            sch.reverse_compute_at(cache, tx)
            sch.vectorize(sch.get_loops(cache)[-1])
            sch.unroll(sch.get_loops(blk)[-1])
            return "layout_transform", "texture"
        # to an image: one write_imagef of the gathered pixel; from one: one read_imagef and
        # four strided stores
        sch.vectorize(sch.get_loops(blk)[-1])
        return "layout_transform", "texture"

    def apply(self, func, target, tunable):
        # only layout transforms: this rule must not take the elementwise kernels dlight's
        # Adreno Fallback schedules, which read and write images as well
        if not isinstance(func, tirx.PrimFunc) or not _is_layout_transform(func):
            self._last_reason = "not a te_layout_transform or texture_copy PrimFunc"
            return None
        return super().apply(func, target, tunable)


def _is_layout_transform(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` is one block named as topi's ``layout_transform`` names it."""
    sch = s_tir.Schedule(func)
    try:
        root = sch.get_sblock("root")
    except (s_tir.ScheduleError, ValueError):
        return False
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    # the conversion last, after elementwise producers fused into it (schedule inlines them)
    return bool(names) and names[-1] in (
        "te_layout_transform",
        "te_layout_transform_with_pad",
        COPY_BLOCK,
    )


class TextureConv2d(CodlRule):
    """TVM's Adreno conv schedule reading its input image directly.

    dlight's ``adreno.Conv2d`` keeps the zero padding a block of its own, which becomes a kernel
    copying the input image into a padded global buffer that the conv then reads: the conv
    never touches the image. This rule inlines the padding (a bounds test around each image
    read) and then applies the same tiling (``adreno.Conv2d.schedule_conv2d``), so the conv's
    register cache loads whole pixels from the image.
    """

    target_kind = "opencl"

    def is_target_available(self, target: Target) -> bool:
        return super().is_target_available(target) and "texture" in target.keys

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        names = [sch.get(b).name_hint for b in blocks]
        depthwise = [i for i, n in enumerate(names) if n == DEPTHWISE_BLOCK]
        if len(depthwise) == 1 and is_texture_scope(sch.mod["main"].params[0].scope()):
            # one output pixel per work-item over its KHxKW window, as TVM's old Adreno
            # depthwise schedule (topi/adreno/depthwise_conv2d_nchw.py): the padding inlined
            # into the image reads, the four lanes one vector
            why = schedule_window(sch, blocks, depthwise[0], target)
            return why or ("depthwise", "texture")
        convs = [b for b, n in zip(blocks, names) if n.startswith("conv2d_NCHWc")]
        if len(convs) != 1:
            return "not one NCHWc conv block"
        # the data is the PrimFunc's first parameter (TVM's conv2d_NCHWc_OIHWo legalization)
        if not is_texture_scope(sch.mod["main"].params[0].scope()):
            return "the conv's input is not an image"
        pads = [b for b, n in zip(blocks, names) if n == "conv2d_data_pad"]
        rest = [b for b in blocks if b != convs[0] and b not in pads]
        dl_adreno.Conv2d.schedule_conv2d(sch, convs[0])
        # after the tiling: the pad goes into the conv's register cache of input pixels, which
        # then reads the image (inlined before, the padding's bounds make reorder fail)
        for pad in pads:
            sch.compute_inline(pad)
        rest = dl_adreno_utils.schedule_inline_blocks(sch, rest)
        dl_adreno_utils.schedule_default(sch, rest)
        # dlight leaves out of ``rest`` a block it failed to inline into its producer: an
        # epilogue broadcasting the conv's output to a larger shape (a squeeze-and-excitation
        # scale of 1x1 pixels times its feature map). It gets a loop nest of its own, which
        # becomes a kernel of its own reading the conv's result from global memory.
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            if loops and sch.get(loops[0]).thread_binding is None:
                dl_adreno_utils.schedule_default(sch, [block])
        return "direct", "texture"


#: The reduction blocks of 2-D pools and adaptive average pools (topi's).
_POOL_BLOCKS = ("pool_max", "pool_sum", "adaptive_pool_sum")


class TexturePool2D(CodlRule):
    """Max, average and adaptive average 2-D pools (a global average pool) on NCHW4c images:
    one output pixel per work-item.

    A pixel's four channels stay the innermost loop, inside the window loops, so the window
    reads whole pixels (the padding inlined as a bounds test) and the result, held in four
    registers, is written as one pixel. dlight's Adreno ``Pool2D`` caches the result in one
    register for all four lanes, so every channel gets channel ``4k + 3``'s value. A global
    pool is one window over the whole image: ``C/4`` work-items each reading ``H*W`` pixels
    (dlight's Adreno ``Pool2D`` also gives each output pixel one work-item; a mobile CNN's last
    feature map is 7x7).
    """

    target_kind = "opencl"

    def is_target_available(self, target: Target) -> bool:
        return super().is_target_available(target) and "texture" in target.keys

    def schedule(self, sch: s_tir.Schedule, target: Target) -> tuple[str, str] | str:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        names = [sch.get(b).name_hint for b in blocks]
        pools = [i for i, n in enumerate(names) if n in _POOL_BLOCKS]
        if len(pools) != 1:
            return "not one pool reduction"
        if not any(is_texture_scope(p.scope()) for p in sch.mod["main"].params):
            return "no image among the parameters"
        why = schedule_window(sch, blocks, pools[0], target)
        return why or ("pool", "texture")


def schedule_window(sch: s_tir.Schedule, blocks: list, index: int, target: Target) -> str | None:
    """One output pixel per work-item for a reduction over a window of NCHW4c pixels (a pool,
    a global average pool, a depthwise conv); None when scheduled, else why not.

    ``blocks[index]`` is the reduction: data-parallel iterators ending with the 4-lane pixel,
    then two window iterators. A sum over more than :data:`ROW_SUM_WINDOW` pixels is summed
    row by row (``rfactor`` over the rows): each row's sum in registers, then added to the
    total, so float32 loses the digits of a row's length, not of the whole map's. The blocks
    before it (the padding) are inlined as a bounds test around each read; those after it (a
    division, a bias, an activation) are computed in the work-item's registers, and the pixel
    is written once. Every image the window reads is read
    as whole pixels into registers, as is a buffer operand with the lane innermost (a depthwise
    conv's packed weights: one vector load per tap).
    """
    red = blocks[index]
    kinds = "".join(
        "S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in sch.get(red).iter_vars
    )
    loops = sch.get_loops(red)
    if kinds != "SSSSSRR" or int(sch.get(loops[4]).extent) != _LANES:
        return f"iterators {kinds}, not a window over NCHW4c pixels (SSSSS over a 4-lane pixel, RR)"
    for b in blocks[:index]:
        sch.compute_inline(b)  # the padding: a bounds test around each read
    epilogue = blocks[index + 1 :]
    *pixel_loops, lane, r0, r1 = loops
    sch.reorder(*pixel_loops, r0, r1, lane)
    fused = sch.fuse(*pixel_loops)
    # the pixel count split exactly (see _threads): no work-item past the tensor
    bx, tx = sch.split(fused, [None, _threads(target, int(sch.get(fused).extent))])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    window = int(sch.get(r0).extent) * int(sch.get(r1).extent)
    rows = None
    if window > ROW_SUM_WINDOW and isinstance(sch.get(red).body.value, tirx.Add):
        # A sum over a whole map (InstanceNorm's mean of a 256x256 map: 65536 values) in one
        # float32 accumulator loses digits with every row; each row summed apart first, its
        # sum then added, keeps the error of a row's length instead of the map's.
        rows = sch.rfactor(r0, factor_axis=0)  # the loops are made anew
        sch.reverse_compute_at(red, sch.get_loops(rows)[2])  # each row's sum added after it
        sch.set_scope(rows, 0, "local")
        tx = sch.get_loops(rows)[1]
    if epilogue:
        sch.set_scope(red, 0, "local")  # the window sum lives in registers
        for b in epilogue[:-1]:
            sch.compute_inline(b)
        last = epilogue[-1]
    else:
        last = sch.cache_write(red, 0, "local")
    sch.reverse_compute_at(last, tx)
    sch.vectorize(sch.get_loops(last)[-1])
    init = sch.decompose_reduction(red, sch.get_loops(red)[2])
    sch.vectorize(sch.get_loops(init)[-1])
    reader = red
    if rows is not None:
        reader = rows
        row_init = sch.decompose_reduction(rows, sch.get_loops(rows)[3])
        sch.vectorize(sch.get_loops(row_init)[-1])
        sch.unroll(sch.get_loops(red)[-1])
    # each window pixel is read whole into registers (one read_imagef, the padding's bounds
    # test around it); the update itself cannot be vectorised inside the window loops
    written = {w.source for w in sch.get(reader).writes}  # the accumulator, in registers
    for i, region in enumerate(sch.get(reader).reads):
        buf = region.source
        if buf not in written and len(buf.shape) == 5 and int(buf.shape[-1]) == _LANES:
            pixel = sch.cache_read(reader, i, "local")
            sch.compute_at(pixel, sch.get_loops(reader)[-2])
            sch.vectorize(sch.get_loops(pixel)[-1])
    sch.unroll(sch.get_loops(reader)[-1])
    return None
