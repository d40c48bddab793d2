"""Structural recognition of the PrimFuncs the schedule rules handle.

Operators are recognised from the TIR itself (iteration kinds, index expressions and the update
expression of the one reduction block), never from block or function names: a conv2d is a block
with iterations ``n, f, y, x`` (spatial) and ``c, ky, kx`` (reduction) computing
``out[n, f, y, x] += data[n, g(f) + c, y*sh + ky*dh, x*sw + kx*dw] * weight[f, c, ky, kx]``.
The block may be preceded by injective blocks (padding, reshape) and followed by elementwise
epilogues, which is what ``LegalizeOps`` + ``FuseOps`` + ``FuseTIR`` produce for NCHW convs.

Each ``match_*`` function returns either an info dataclass or a ``str`` saying why the function
does not match; rules turn the string into their decline reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import SBlockRV
from tvm.sym import detect_linear_equation

__all__ = [
    "Conv2DInfo",
    "FuncBlocks",
    "PoolInfo",
    "ReductionInfo",
    "buffer_loads",
    "classify_blocks",
    "is_trivial_copy",
    "iteration_kinds",
    "match_conv2d",
    "match_pool2d",
    "match_reduction",
    "stage_of",
    "strip_cast",
    "writer_of",
]


@dataclass
class FuncBlocks:
    """The root-level blocks of a PrimFunc split around its one reduction block."""

    prologue: list[SBlockRV]
    main: SBlockRV | None
    epilogue: list[SBlockRV]

    def without(self, block: SBlockRV | None) -> FuncBlocks:
        """These blocks less ``block`` in the prologue (all of them when it is None)."""
        if block is None:
            return self
        return FuncBlocks(
            prologue=[b for b in self.prologue if not b.same_as(block)],
            main=self.main,
            epilogue=self.epilogue,
        )


@dataclass(frozen=True)
class ReductionInfo:
    """A single reduction block: its iteration kinds and extents.

    Attributes
    ----------
    kinds : str
        One letter per block iteration, ``S`` (spatial) or ``R`` (reduction).
    extents : tuple[int, ...]
        Extents of the block's loops, outermost first.
    dtype_bits : int
        Bits of the output element type.
    vector_axis : int | None
        Index of the innermost spatial iteration if every buffer access is contiguous (or
        constant) along it, else None.
    """

    kinds: str
    extents: tuple[int, ...]
    dtype_bits: int
    vector_axis: int | None


@dataclass(frozen=True)
class Conv2DInfo:
    """A recognised NCHW/OIHW conv2d block (groups and depthwise included)."""

    batch: int
    out_channels: int
    out_height: int
    out_width: int
    in_channels_per_group: int
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int
    in_channels: int
    dtype_bits: int
    padded: bool

    @property
    def groups(self) -> int:
        return max(1, self.in_channels // self.in_channels_per_group)

    @property
    def depthwise(self) -> bool:
        return self.in_channels_per_group == 1 and self.groups == self.in_channels > 1

    @property
    def pointwise(self) -> bool:
        """1x1, stride 1, no padding, one group: a plain GEMM over the flattened image."""
        return (
            self.kernel_h == self.kernel_w == 1
            and self.stride_h == self.stride_w == 1
            and not self.padded
            and self.groups == 1
        )


@dataclass(frozen=True)
class PoolInfo:
    """A recognised NCHW pooling block (max or sum of a window)."""

    out_shape: tuple[int, int, int, int]
    window: tuple[int, int]
    stride: tuple[int, int]
    kind: str
    dtype_bits: int


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _is_reduction(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def classify_blocks(sch: s_tir.Schedule) -> FuncBlocks | str:
    """Split the root blocks into prologue, the one reduction block, and epilogue."""
    try:
        root = get_root_block(sch)
    except ValueError:
        return "the function body is not a root block"
    blocks = sch.get_child_blocks(root)
    reductions = [i for i, b in enumerate(blocks) if _is_reduction(sch, b)]
    if len(reductions) > 1:
        return f"{len(reductions)} reduction blocks (one expected)"
    for b in blocks:
        if sch.get(b).body is None or not isinstance(sch.get(b).body, tirx.BufferStore):
            return f"block {sch.get(b).name_hint!r} is not a single buffer store"
    if not reductions:
        return FuncBlocks(prologue=list(blocks), main=None, epilogue=[])
    i = reductions[0]
    return FuncBlocks(prologue=list(blocks[:i]), main=blocks[i], epilogue=list(blocks[i + 1 :]))


def _loop_extents(sch: s_tir.Schedule, block: SBlockRV) -> tuple[int, ...] | str:
    loops = sch.get_loops(block)
    block_stmt = sch.get(block)
    if len(loops) != len(block_stmt.iter_vars):
        return "block iterations are not bound one-to-one to loops"
    extents = []
    for loop, iv in zip(loops, block_stmt.iter_vars, strict=True):
        ext = _int(sch.get(loop).extent)
        if ext is None or _int(iv.dom.extent) != ext:
            return "dynamic or non-trivially bound loop extents"
        extents.append(ext)
    return tuple(extents)


def strip_cast(expr):
    """``expr`` without the casts around it (a mixed-precision load or product)."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr


def _coefficients(expr, variables) -> list[int] | None:
    coeffs = detect_linear_equation(expr, list(variables))
    if len(coeffs) != len(variables) + 1:
        return None
    out = [_int(c) for c in coeffs]
    return None if any(c is None for c in out) else out


def _uses(expr, var) -> bool:
    found = False

    def visit(node):
        nonlocal found
        if node.same_as(var):
            found = True

    tvm_ffi.structural_walk(expr, [(tirx.Var, visit)])
    return found


def _contiguous_along(indices, var) -> bool:
    """True if ``var`` appears only in the last index, with coefficient 1 or 2 (or not at all)."""
    for idx in indices[:-1]:
        if _uses(idx, var):
            return False
    if not indices:
        return True
    last = indices[-1]
    if not _uses(last, var):
        return True
    c = detect_linear_equation(last, [var])
    return len(c) == 2 and _int(c[0]) in (1, 2)


def buffer_loads(expr) -> list[TensorLoad]:
    """All buffer loads (``TensorLoad``, whose ``source`` is the buffer's data var) in expr."""
    found: list[TensorLoad] = []

    tvm_ffi.structural_walk(expr, [(TensorLoad, found.append)])
    return found


def match_reduction(sch: s_tir.Schedule, block: SBlockRV) -> ReductionInfo | str:
    """Describe a reduction block with spatial iterations first and reductions last."""
    stmt = sch.get(block)
    kinds = "".join(
        "S"
        if iv.iter_type == tirx.IterVar.DataPar
        else "R"
        if iv.iter_type == tirx.IterVar.CommReduce
        else "?"
        for iv in stmt.iter_vars
    )
    if "?" in kinds:
        return "block has iterations that are neither spatial nor reduction"
    n_spatial = kinds.index("R") if "R" in kinds else len(kinds)
    if "S" in kinds[n_spatial:]:
        return f"iteration kinds {kinds}: spatial iterations after reductions"
    if n_spatial == 0:
        return "reduction to a scalar (no spatial iteration)"
    extents = _loop_extents(sch, block)
    if isinstance(extents, str):
        return extents
    store = stmt.body
    spatial_vars = [iv.var for iv in stmt.iter_vars[:n_spatial]]
    if len(store.indices) != n_spatial or not all(
        isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(store.indices, spatial_vars)
    ):
        return "output is not indexed by the spatial iterations in order"
    vec_var = spatial_vars[-1]
    accesses = [load.indices for load in buffer_loads(store.value)]
    vector_axis = (
        n_spatial - 1 if all(_contiguous_along(list(ix), vec_var) for ix in accesses) else None
    )
    return ReductionInfo(
        kinds=kinds,
        extents=extents,
        dtype_bits=int(store.buffer.dtype.bits),
        vector_axis=vector_axis,
    )


def iteration_kinds(sch: s_tir.Schedule, block: SBlockRV) -> str:
    """One letter per block iteration: ``S`` (spatial) or ``R`` (reduction)."""
    return "".join(
        "S" if iv.iter_type == tirx.IterVar.DataPar else "R" for iv in sch.get(block).iter_vars
    )


def stage_of(sch: s_tir.Schedule, block: SBlockRV, key: str) -> str | None:
    """The block's annotation ``key`` as a string (the stage names of Winograd and packed
    convs), or None."""
    ann = sch.get(block).annotations
    return str(ann[key]) if key in ann else None


def writer_of(sch: s_tir.Schedule, blocks: list[SBlockRV], buffer) -> SBlockRV | None:
    """The block among ``blocks`` that writes ``buffer`` (None if none does)."""
    for b in blocks:
        if sch.get(b).body.buffer.same_as(buffer):
            return b
    return None


def _buffer_of(block_stmt, load: TensorLoad):
    """The Buffer a load reads, found through the block's read regions."""
    for region in block_stmt.reads:
        if region.source.same_as(load.source):
            return region.source
    return None


def is_trivial_copy(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """True if an injective block stores a plain load (no condition): safe to inline anywhere."""
    value = strip_cast(sch.get(block).body.value)
    return isinstance(value, TensorLoad)


def match_conv2d(sch: s_tir.Schedule, blocks: FuncBlocks) -> Conv2DInfo | str:
    """Recognise an NCHW conv2d reduction block (with groups, dilation, stride)."""
    if blocks.main is None:
        return "no reduction block"
    red = match_reduction(sch, blocks.main)
    if isinstance(red, str):
        return red
    if red.kinds != "SSSSRRR":
        return f"iteration kinds {red.kinds}, conv2d has SSSSRRR"
    stmt = sch.get(blocks.main)
    store = stmt.body
    n, f, y, x, c, ky, kx = (iv.var for iv in stmt.iter_vars)
    value = store.value
    if not isinstance(value, tirx.Add):
        return "update is not an accumulation (+)"
    acc, prod = value.a, strip_cast(value.b)
    if not (isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer)):
        acc, prod = value.b, strip_cast(value.a)
    if not (isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer)):
        return "update does not read its own output"
    if not isinstance(prod, tirx.Mul):
        return "accumulated value is not a product"
    a, b = strip_cast(prod.a), strip_cast(prod.b)
    if not (isinstance(a, TensorLoad) and isinstance(b, TensorLoad)):
        return "product operands are not buffer loads"

    def is_weight(load) -> bool:
        return len(load.indices) == 4 and all(
            isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(load.indices, (f, c, ky, kx))
        )

    if is_weight(b):
        data = a
    elif is_weight(a):
        data = b
    else:
        return "no operand is indexed [f, c, ky, kx] (OIHW weight)"
    if len(data.indices) != 4:
        return "data operand is not 4-D"
    i0, i1, i2, i3 = data.indices
    if not (isinstance(i0, tirx.Var) and i0.same_as(n)):
        return "data batch index is not the output batch"
    ch = detect_linear_equation(i1, [c])
    if len(ch) != 2 or _int(ch[0]) != 1:
        return "data channel index is not linear in the reduction channel"
    hy = _coefficients(i2, [y, ky])
    wx = _coefficients(i3, [x, kx])
    if hy is None or wx is None or min(hy[0], hy[1], wx[0], wx[1]) < 1:
        return "data spatial indices are not y*stride + ky*dilation"
    data_buffer = _buffer_of(stmt, data)
    if data_buffer is None:
        return "data operand buffer not found among the block's reads"
    padder = writer_of(sch, blocks.prologue, data_buffer)
    padded = padder is not None and not is_trivial_copy(sch, padder)
    ext = red.extents
    return Conv2DInfo(
        batch=ext[0],
        out_channels=ext[1],
        out_height=ext[2],
        out_width=ext[3],
        in_channels_per_group=ext[4],
        kernel_h=ext[5],
        kernel_w=ext[6],
        stride_h=hy[0],
        stride_w=wx[0],
        dilation_h=hy[1],
        dilation_w=wx[1],
        in_channels=int(data_buffer.shape[1]),
        dtype_bits=red.dtype_bits,
        padded=padded,
    )


def match_pool2d(sch: s_tir.Schedule, blocks: FuncBlocks) -> PoolInfo | str:
    """Recognise an NCHW window reduction (max pool or the sum of an average pool)."""
    if blocks.main is None:
        return "no reduction block"
    red = match_reduction(sch, blocks.main)
    if isinstance(red, str):
        return red
    if red.kinds != "SSSSRR":
        return f"iteration kinds {red.kinds}, pool2d has SSSSRR"
    stmt = sch.get(blocks.main)
    n, ch, y, x, ky, kx = (iv.var for iv in stmt.iter_vars)
    value = stmt.body.value
    if isinstance(value, tirx.Max):
        kind = "max"
    elif isinstance(value, tirx.Add):
        kind = "sum"
    else:
        return "update is neither max nor +"
    loads = [ld for ld in buffer_loads(value) if not ld.source.same_as(stmt.body.buffer)]
    if len(loads) != 1 or len(loads[0].indices) != 4:
        return "window reduction must read one 4-D input"
    i0, i1, i2, i3 = loads[0].indices
    if not (i0.same_as(n) and i1.same_as(ch)):
        return "input is not indexed [n, c, ...] by the output batch and channel"
    hy = _coefficients(i2, [y, ky])
    wx = _coefficients(i3, [x, kx])
    if hy is None or wx is None:
        return "window indices are not linear"
    e = red.extents
    return PoolInfo(
        out_shape=(e[0], e[1], e[2], e[3]),
        window=(e[4], e[5]),
        stride=(hy[0], wx[0]),
        kind=kind,
        dtype_bits=red.dtype_bits,
    )


def covers_producer(sch: s_tir.Schedule, main: SBlockRV, epilogue: SBlockRV) -> bool:
    """Whether an epilogue block iterates over as many points as the main block's output.

    ``reverse_compute_inline`` of an epilogue that reads only part of the main block's output
    (a ``strided_slice`` FuseOps fused after a conv: the input rows of the next operator's part)
    makes TVM 0.27 write the *whole* output range into the smaller buffer, out of bounds.
    Such an epilogue stays a block of its own.
    """
    spatial = [iv for iv in sch.get(main).iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    produced = 1
    for iv in spatial:
        extent = _int(iv.dom.extent)
        if extent is None:
            return False
        produced *= extent
    consumed = 1
    for iv in sch.get(epilogue).iter_vars:
        extent = _int(iv.dom.extent)
        if extent is None:
            return False
        consumed *= extent
    return consumed == produced


def _intermediate_readers(sch: s_tir.Schedule) -> dict:
    """Each buffer a block of the function writes, with the blocks that read it."""
    written: set = set()
    readers: dict = {}

    def visit(block):
        for region in block.writes:
            written.add(region.source)
        for region in block.reads:
            readers.setdefault(region.source, []).append(block)

    tvm_ffi.structural_walk(sch.mod["main"].body, [(s_tir.SBlock, visit)])
    return {buf: blocks for buf, blocks in readers.items() if buf in written}


def sole_reader(sch: s_tir.Schedule, block: SBlockRV) -> bool:
    """Whether ``block`` is the only reader of every intermediate buffer it reads.

    TVM 0.27's ``reverse_compute_inline`` does not check it: inlining the sigmoid of a conv's
    SiLU epilogue (``y = x * sigmoid(x)``, ``x`` read by both blocks) into the conv's write-back
    drops ``x``'s allocation while the multiply still reads it, and the function is ill-formed.
    """
    stmt = sch.get(block)
    shared = _intermediate_readers(sch)
    return all(
        all(other.same_as(stmt) for other in shared.get(region.source, ())) for region in stmt.reads
    )


def inline_elementwise_steps(sch: s_tir.Schedule, epilogue: list[SBlockRV]) -> list[SBlockRV]:
    """Inline the epilogue blocks before the last into their consumers where an intermediate
    has several readers (``x * sigmoid(x)``: the sigmoid into the multiply), so that the last
    block is the conv output's only reader and can be inlined into the write-back; returns the
    blocks left. Chains with one reader per step are left as they are."""
    if len(epilogue) < 2 or all(sole_reader(sch, b) for b in epilogue):
        return list(epilogue)
    left = []
    for block in epilogue[:-1]:
        try:
            sch.compute_inline(block)
        except (s_tir.ScheduleError, tvm.error.InternalError):
            left.append(block)
    return [*left, epilogue[-1]]


def reverse_inline_epilogue(sch: s_tir.Schedule, blocks: FuncBlocks) -> list[SBlockRV]:
    """Inline the elementwise epilogue blocks into the block that writes the main output, in
    order, while that is safe; return the blocks left for the caller to schedule on their own.

    Stops at an epilogue that reads only a slice of the output (TVM 0.27 would write the whole
    range into the smaller buffer, :func:`covers_producer`), one that is not the only reader of
    what it reads (:func:`sole_reader`), or one TVM refuses (it raises ``InternalError``, "Cannot
    dispatch a null expression", for some, e.g. InstanceNormalization's variance step)."""
    remaining = inline_elementwise_steps(sch, blocks.epilogue)
    while remaining:
        if blocks.main is not None and not covers_producer(sch, blocks.main, remaining[0]):
            break
        if not sole_reader(sch, remaining[0]):
            break
        try:
            sch.reverse_compute_inline(remaining[0])
        except (s_tir.ScheduleError, tvm.error.InternalError):
            break
        remaining.pop(0)
    return remaining
