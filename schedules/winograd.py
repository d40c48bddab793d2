"""Winograd convolution ``F(m x m, 3 x 3)`` for NCHW convs: compute, selection and schedules.

The algorithm is chosen per operator *before* legalization by
:class:`codl_tvm.passes.winograd.Conv2DWinograd`, which calls :func:`winograd_reason` with the
configuration of the processor the operator (or its co-execution part) runs on, transforms the
constant weight once at compile time (:func:`transform_weight`) and replaces the conv by one
``call_tir`` of :func:`winograd_conv2d`. The rules here then recognise that PrimFunc (with any
elementwise epilogue ``FuseOps`` fused after it) and schedule it for the PrimFunc's own target.

Compute (``a = m + 2``; ``P = N * ceil(OH / m) * ceil(OW / m)`` tiles; ``B``, ``A``, ``G`` the
Cook-Toom matrices of :func:`winograd_matrices`). Each block carries the annotation
``codl.winograd`` naming its stage, which is how the rules recognise the function (annotations
survive ``FuseTIR``; names do not matter):

``tile``    ``D[p, i, j, c]``: the ``a x a`` input tile of tile ``p`` (padding applied here, so
            padding semantics are exactly those of conv2d)
``input``   ``V[e, v, p, c] = sum_{i, j} B[i, e] * D[p, i, j, c] * B[j, v]``
``gemm``    ``M[e, v, p, k] = sum_c V[e, v, p, c] * U[e, v, c, k]`` (``a^2`` GEMMs; ``U`` is the
            transformed weight ``G g G^T``, a constant)
``inverse`` ``Y[n, k, y, x] = sum_{i, j} A[i, y % m] * M[i, j, p(n, y, x), k] * A[j, x % m]``

The transform matrices enter as constants selected by the (unrolled) loop indices, so after
unrolling TVM folds them away: multiplications by 0 disappear and by +-1 become additions.

Schedules (parameters from :mod:`codl_tvm.schedules.config`):

``CPUWinograd`` (llvm)
    ``input``: parallel over (tile, channel block); the input tile is gathered into a small
    buffer per tile and the ``a x a`` outputs are unrolled, vectorised over a block of input
    channels. ``gemm``: like the 1x1 GEMM conv, a register tile of ``max(matmul_m_tile,
    conv_oc_tile)`` tiles (fewer when the accumulators do not fit) x
    one vectorised run of output channels (``choose_row_width``), parallel over
    (``a^2`` batch, channel block, tile block). ``inverse``: parallel over (tile, channel
    block), ``m x m`` outputs x one vector of output channels in registers, fused epilogues
    inlined into the write-back.
``OpenCLWinograd`` (opencl)
    ``input``: one work-item per (input channel, tile), the tile and its ``a^2`` results in
    private memory. ``gemm``: blockIdx.z over the ``a^2`` GEMMs, workgroups of
    ``conv_threads_ow x conv_threads_oc`` work-items each computing ``conv_reg_ow`` tiles x
    ``conv_reg_oc`` output channels (with ``conv_vector_lanes``, PoCL, the channels are one
    OpenCL vector); with ``conv_use_local_memory`` (NVIDIA, Adreno) each step stages
    ``conv_ic_chunk`` input channels of the workgroup's tiles and weights in local memory.
    ``V`` is laid out ``[e, v, c, p]`` on OpenCL (coalesced along tiles).
    ``inverse``: one work-item per (tile, output channel), epilogue in the
    write-back. Three launches (plus none for the weight, which is a constant).

Kernels record ``codl.algorithm = "winograd"``; their dispatch features describe the GEMM launch
(the main kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm import s_tir, te, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.schedule import SBlockRV
from tvm.target import Target

# TVM's Cook-Toom construction: its public winograd_transform_matrices returns TE constants of
# one dtype, and the weight transform here needs the float64 matrices as numpy arrays
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

from .analysis import Conv2DInfo, FuncBlocks, iteration_kinds, stage_of
from .common import choose_row_width
from .config import CPUConfig, OpenCLConfig
from .cpu import conv2d_algorithm
from .cpu_common import CPURule, finish_tile, loop_extent, prepare_prologue
from .cpu_common import inline_epilogue as cpu_inline_epilogue
from .opencl_common import (
    OpenCLRule,
    bind_spatial,
    finish_register_tile,
    fit_threads,
    local_limit,
    opencl_vector_width,
    read_index,
)
from .opencl_common import inline_epilogue as gpu_inline_epilogue

__all__ = [
    "WINOGRAD_STAGE",
    "CPUWinograd",
    "OpenCLWinograd",
    "WinogradInfo",
    "conv2d_shape_info",
    "match_winograd",
    "select_conv2d_algorithm",
    "transform_weight",
    "winograd_conv2d",
    "winograd_matrices",
    "winograd_reason",
]

WINOGRAD_STAGE = "codl.winograd"
"""Block annotation naming the stage of a Winograd conv (``tile``, ``input``, ``gemm``,
``inverse``)."""

_STAGES = ("tile", "input", "gemm", "inverse")
_KINDS = {"tile": "SSSS", "input": "SSSSRR", "gemm": "SSSSR", "inverse": "SSSSRR"}
KERNEL = 3


# ---------------------------------------------------------------------------------------------
# selection


def conv2d_shape_info(
    data_shape: Sequence[int],
    weight_shape: Sequence[int],
    strides: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    dtype_bits: int = 32,
) -> Conv2DInfo:
    """A :class:`~codl_tvm.schedules.analysis.Conv2DInfo` from NCHW/OIHW shapes and attributes.

    ``padding`` is ``(top, left, bottom, right)``. Raises ValueError for inconsistent shapes.
    """
    n, c, h, w = (int(v) for v in data_shape)
    k, cg, kh, kw = (int(v) for v in weight_shape)
    sh, sw = (int(v) for v in strides)
    dh, dw = (int(v) for v in dilation)
    pt, pl, pb, pr = (int(v) for v in padding)
    if groups < 1 or c % groups or cg * groups != c:
        raise ValueError(
            f"conv2d: data {tuple(data_shape)} and weight {tuple(weight_shape)} do not match "
            f"groups={groups}"
        )
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"conv2d: output {oh}x{ow} is empty (data {tuple(data_shape)})")
    return Conv2DInfo(
        batch=n,
        out_channels=k,
        out_height=oh,
        out_width=ow,
        in_channels_per_group=cg,
        kernel_h=kh,
        kernel_w=kw,
        stride_h=sh,
        stride_w=sw,
        dilation_h=dh,
        dilation_w=dw,
        in_channels=c,
        dtype_bits=dtype_bits,
        padded=any((pt, pl, pb, pr)),
    )


def winograd_reason(info: Conv2DInfo, config: CPUConfig | OpenCLConfig) -> str | None:
    """Why a conv does not get Winograd under ``config`` (None: it does).

    Winograd applies to 3x3, stride-1, dilation-1, single-group float32 convs when the config
    enables it, both channel counts reach ``winograd_min_channels`` (on CPUs,
    ``winograd_wide_min_channels`` where the output holds ``winograd_wide_tiles`` tiles) and
    the output holds at least one whole ``m x m`` tile and ``winograd_min_tiles`` tiles in all.
    (The pass also needs a constant weight.)
    """
    m = config.winograd_tile
    if not config.winograd:
        return f"Winograd disabled in config {config.name!r}"
    if (info.kernel_h, info.kernel_w) != (KERNEL, KERNEL):
        return f"kernel {info.kernel_h}x{info.kernel_w}, Winograd needs 3x3"
    if (info.stride_h, info.stride_w) != (1, 1):
        return f"stride {info.stride_h}x{info.stride_w}, Winograd needs stride 1"
    if (info.dilation_h, info.dilation_w) != (1, 1):
        return f"dilation {info.dilation_h}x{info.dilation_w}, Winograd needs dilation 1"
    if info.groups != 1:
        return f"groups={info.groups}, Winograd needs one group"
    if info.dtype_bits != 32:
        return f"{info.dtype_bits}-bit data, Winograd is float32 only"
    if info.out_height < m or info.out_width < m:
        return f"output {info.out_height}x{info.out_width} smaller than one {m}x{m} tile"
    tiles = -(-info.out_height // m) * -(-info.out_width // m)
    field, low = "winograd_min_channels", config.winograd_min_channels
    wide = getattr(config, "winograd_wide_tiles", 0)
    if wide and tiles >= wide and config.winograd_wide_min_channels < low:
        field, low = "winograd_wide_min_channels", config.winograd_wide_min_channels
    if info.in_channels < low or info.out_channels < low:
        return f"channels {info.in_channels}->{info.out_channels} below {field}={low}"
    if tiles < config.winograd_min_tiles:
        return (
            f"output {info.out_height}x{info.out_width} holds {tiles} {m}x{m} tiles, below "
            f"winograd_min_tiles={config.winograd_min_tiles} (the transformed weight would "
            "stream from memory)"
        )
    return None


def select_conv2d_algorithm(info: Conv2DInfo, config: CPUConfig | OpenCLConfig) -> str:
    """The algorithm a conv with a constant weight is built with under ``config``.

    ``winograd`` where :func:`winograd_reason` accepts it; otherwise what the conv rules build:
    on the CPU :func:`~codl_tvm.schedules.cpu.conv2d_algorithm` (``gemm``, ``depthwise`` or
    ``direct``), on OpenCL ``direct``.
    """
    if winograd_reason(info, config) is None:
        return "winograd"
    if isinstance(config, CPUConfig):
        return conv2d_algorithm(info, config)
    return "direct"


# ---------------------------------------------------------------------------------------------
# compute


def winograd_matrices(tile: int, kernel: int = KERNEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cook-Toom matrices ``(A, B, G)`` of ``F(tile, kernel)`` (float64).

    ``A`` is ``a x m``, ``B`` is ``a x a``, ``G`` is ``a x r`` with ``a = m + r - 1``:
    ``y = A^T [(G g) * (B^T d)]`` for one dimension.
    """
    if tile not in (2, 4):
        raise ValueError(f"Winograd tile must be 2 or 4, got {tile!r}")
    points = _interpolation_points(tile + kernel - 2)
    a, b, g = _cook_toom_convolution(points, tile, kernel)
    return np.asarray(a, np.float64), np.asarray(b, np.float64), np.asarray(g, np.float64)


def transform_weight(weight: np.ndarray, tile: int) -> np.ndarray:
    """``U[e, v, c, k] = (G g_kc G^T)[e, v]`` of an OIHW 3x3 weight, float32 ``(a, a, C, K)``."""
    weight = np.asarray(weight)
    if weight.ndim != 4 or weight.shape[2:] != (KERNEL, KERNEL):
        raise ValueError(f"Winograd weight must be OIHW 3x3, got shape {weight.shape}")
    _, _, g = winograd_matrices(tile)
    u = np.einsum("ei,kcij,vj->evck", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u.astype(weight.dtype))


def _coefficient(matrix: np.ndarray, row, col, dtype: str):
    """``matrix[row, col]`` as an expression of loop indices: a chain of selects over its
    nonzero entries that folds to one constant once the loops are unrolled."""
    expr = tirx.const(0.0, dtype)
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            value = float(matrix[i, j])
            if value != 0.0:
                expr = tirx.Select(tirx.all(row == i, col == j), tirx.const(value, dtype), expr)
    return expr


def winograd_conv2d(
    data: te.Tensor, kernel_pack: te.Tensor, padding: Sequence[int], tile: int
) -> te.Tensor:
    """The Winograd conv of ``data`` (NCHW) with a transformed weight ``(a, a, C, K)``.

    Parameters
    ----------
    data : te.Tensor
        Input ``(N, C, H, W)``.
    kernel_pack : te.Tensor
        :func:`transform_weight` of the OIHW 3x3 weight.
    padding : Sequence[int]
        ``(top, left, bottom, right)``, as for conv2d.
    tile : int
        Output tile ``m`` (2 or 4).

    Returns
    -------
    te.Tensor
        ``(N, K, OH, OW)``, equal to the stride-1 3x3 conv2d.
    """
    n_, c_, h_, w_ = (int(v) for v in data.shape)
    alpha, alpha2, c2, k_ = (int(v) for v in kernel_pack.shape)
    if alpha != tile + KERNEL - 1 or alpha2 != alpha or c2 != c_:
        raise ValueError(
            f"winograd_conv2d: transformed weight {tuple(kernel_pack.shape)} does not match "
            f"tile {tile} and {c_} input channels"
        )
    a_mat, b_mat, _ = winograd_matrices(tile)
    pt, pl, pb, pr = (int(p) for p in padding)
    out_h, out_w = h_ + pt + pb - KERNEL + 1, w_ + pl + pr - KERNEL + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"winograd_conv2d: empty output {out_h}x{out_w}")
    n_h, n_w = math.ceil(out_h / tile), math.ceil(out_w / tile)
    tiles = n_ * n_h * n_w
    dtype = data.dtype

    def tile_value(p, i, j, c):
        n = p // (n_h * n_w)
        y = (p // n_w) % n_h * tile + i - pt
        x = p % n_w * tile + j - pl
        inside = tirx.all(y >= 0, y < h_, x >= 0, x < w_)
        return tirx.if_then_else(inside, data[n, c, y, x], tirx.const(0.0, dtype))

    d = te.compute(
        (tiles, alpha, alpha, c_), tile_value, name="wino_tile", attrs={WINOGRAD_STAGE: "tile"}
    )
    i = te.reduce_axis((0, alpha), "i")
    j = te.reduce_axis((0, alpha), "j")
    v = te.compute(
        (alpha, alpha, tiles, c_),
        lambda e, u, p, c: te.sum(
            _coefficient(b_mat, i, e, dtype) * d[p, i, j, c] * _coefficient(b_mat, j, u, dtype),
            axis=[i, j],
        ),
        name="wino_input",
        attrs={WINOGRAD_STAGE: "input"},
    )
    c = te.reduce_axis((0, c_), "c")
    m = te.compute(
        (alpha, alpha, tiles, k_),
        lambda e, u, p, k: te.sum(v[e, u, p, c] * kernel_pack[e, u, c, k], axis=[c]),
        name="wino_gemm",
        attrs={WINOGRAD_STAGE: "gemm"},
    )
    i2 = te.reduce_axis((0, alpha), "i")
    j2 = te.reduce_axis((0, alpha), "j")

    def inverse(n, k, y, x):
        p = n * (n_h * n_w) + y // tile * n_w + x // tile
        return te.sum(
            _coefficient(a_mat, i2, y % tile, dtype)
            * m[i2, j2, p, k]
            * _coefficient(a_mat, j2, x % tile, dtype),
            axis=[i2, j2],
        )

    return te.compute(
        (n_, k_, out_h, out_w), inverse, name="wino_inverse", attrs={WINOGRAD_STAGE: "inverse"}
    )


# ---------------------------------------------------------------------------------------------
# recognition


@dataclass(frozen=True)
class WinogradInfo:
    """The blocks and sizes of a Winograd conv PrimFunc (see the module docstring)."""

    prologue: list[SBlockRV]
    tile_block: SBlockRV
    input: SBlockRV
    gemm: SBlockRV
    inverse: SBlockRV
    epilogue: list[SBlockRV]
    tile: int
    alpha: int
    tiles: int
    in_channels: int
    out_channels: int
    batch: int
    out_height: int
    out_width: int
    dtype_bits: int


def _stage(sch: s_tir.Schedule, block: SBlockRV) -> str | None:
    return stage_of(sch, block, WINOGRAD_STAGE)


def _shape(buffer) -> tuple[int, ...] | None:
    dims = [v.value if isinstance(v, tirx.IntImm) else None for v in buffer.shape]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims)


def match_winograd(sch: s_tir.Schedule) -> WinogradInfo | str:
    """Recognise a :func:`winograd_conv2d` PrimFunc (plus injective pro- and epilogues)."""
    try:
        root = get_root_block(sch)
    except ValueError:
        return "the function body is not a root block"
    blocks = sch.get_child_blocks(root)
    stages = [_stage(sch, b) for b in blocks]
    found = [s for s in stages if s is not None]
    if not found:
        return f"no {WINOGRAD_STAGE} blocks (not a Winograd conv)"
    if found != list(_STAGES):
        return f"Winograd stages {found}, expected {list(_STAGES)}"
    first = stages.index("tile")
    if stages[first : first + 4] != list(_STAGES):
        return "Winograd stages are not consecutive"
    tile_b, input_b, gemm_b, inverse_b = blocks[first : first + 4]
    for name, block in zip(_STAGES, (tile_b, input_b, gemm_b, inverse_b), strict=True):
        if iteration_kinds(sch, block) != _KINDS[name]:
            return f"Winograd {name} block has iterations {iteration_kinds(sch, block)}"
        if not isinstance(sch.get(block).body, tirx.BufferStore):
            return f"Winograd {name} block is not a single buffer store"
    others = [*blocks[:first], *blocks[first + 4 :]]
    for b in others:
        if iteration_kinds(sch, b).count("R"):
            return "a reduction outside the Winograd stages"
        if not isinstance(sch.get(b).body, tirx.BufferStore):
            return f"block {sch.get(b).name_hint!r} is not a single buffer store"
    v_shape = _shape(sch.get(input_b).body.buffer)
    m_shape = _shape(sch.get(gemm_b).body.buffer)
    y_shape = _shape(sch.get(inverse_b).body.buffer)
    if v_shape is None or m_shape is None or y_shape is None:
        return "dynamic shapes"
    alpha, _, tiles, c = v_shape
    k = m_shape[3]
    n, _, oh, ow = y_shape
    return WinogradInfo(
        prologue=list(blocks[:first]),
        tile_block=tile_b,
        input=input_b,
        gemm=gemm_b,
        inverse=inverse_b,
        epilogue=list(blocks[first + 4 :]),
        tile=alpha - KERNEL + 1,
        alpha=alpha,
        tiles=tiles,
        in_channels=c,
        out_channels=k,
        batch=n,
        out_height=oh,
        out_width=ow,
        dtype_bits=int(sch.get(inverse_b).body.buffer.dtype.bits),
    )


def _unroll(sch: s_tir.Schedule, loops) -> None:
    for loop in loops:
        if loop_extent(sch, loop) > 1:
            sch.unroll(loop)


# ---------------------------------------------------------------------------------------------
# CPU


class CPUWinograd(CPURule):
    """Winograd conv on CPUs (see the module docstring); declines anything else."""

    def schedule(self, sch: s_tir.Schedule, target: Target):
        cfg = self._config(target)
        info = match_winograd(sch)
        if isinstance(info, str):
            return info
        prepare_prologue(sch, FuncBlocks(info.prologue, None, []), cfg)
        lanes = cfg.lanes(info.dtype_bits)
        self._input(sch, info, cfg, lanes)
        features = self._gemm(sch, info, cfg, lanes)
        self._inverse(sch, info, cfg, lanes)
        return "winograd", cfg.name, features

    @staticmethod
    def _input(sch: s_tir.Schedule, info: WinogradInfo, cfg: CPUConfig, lanes: int) -> None:
        block = info.input
        nbytes = info.dtype_bits // 8
        width = choose_row_width(info.in_channels, lanes, 1, cfg.partial_vectors)
        while width > 1 and info.alpha * info.alpha * width * nbytes > cfg.max_tile_bytes:
            width //= 2
        writeback = sch.cache_write(block, 0, "global")
        e, u, p, c, i, j = sch.get_loops(block)
        co, ci = sch.split(c, [None, width])
        sch.reorder(p, co, e, u, i, j, ci)
        par = sch.fuse(p, co)
        sch.compute_at(info.tile_block, par, preserve_unit_loops=True)
        tile_loops = sch.get_loops(info.tile_block)[1:]
        work = info.tiles * info.in_channels * info.alpha**4
        finish_tile(sch, block, writeback, par, i, ci, [e, u, i, j], work, cfg)
        # the gathered tile: (p, i, j, c) under the parallel loop, channels vectorised
        _unroll(sch, tile_loops[:-1])
        if width > 1 and loop_extent(sch, tile_loops[-1]) > 1:
            sch.vectorize(tile_loops[-1])

    @staticmethod
    def _gemm(sch, info: WinogradInfo, cfg: CPUConfig, lanes: int) -> dict[str, int]:
        block = info.gemm
        nbytes = info.dtype_bits // 8
        width = choose_row_width(info.out_channels, lanes, cfg.max_row_vectors, cfg.partial_vectors)
        nvec = math.ceil(width / lanes)
        rows = max(1, min(max(cfg.matmul_m_tile, cfg.conv_oc_tile), info.tiles))
        while rows > 1 and (
            rows * nvec > cfg.max_accumulators or rows * width * nbytes > cfg.max_tile_bytes
        ):
            rows //= 2
        writeback = sch.cache_write(block, 0, "global")
        e, u, p, k, c = sch.get_loops(block)
        batch = sch.fuse(e, u)
        ko, ki = sch.split(k, [None, width])
        po, pi = sch.split(p, [None, rows])
        sch.reorder(batch, ko, po, c, pi, ki)
        par = sch.fuse(batch, ko, po)
        work = info.alpha**2 * info.tiles * info.out_channels * info.in_channels
        return finish_tile(sch, block, writeback, par, c, ki, [pi], work, cfg)

    @staticmethod
    def _inverse(sch, info: WinogradInfo, cfg: CPUConfig, lanes: int) -> None:
        block = info.inverse
        m = info.tile
        width = choose_row_width(info.out_channels, lanes, 1, cfg.partial_vectors)
        writeback = sch.cache_write(block, 0, "global")
        # accumulators [y, x, k]: the vectorised channels are contiguous in the register tile
        sch.transform_layout(block, ("write", 0), lambda n, k, y, x: (n, y, x, k))
        cpu_inline_epilogue(sch, FuncBlocks([], block, info.epilogue), cfg)
        n, k, y, x, i, j = sch.get_loops(block)
        ty, yi = sch.split(y, [None, m])
        tx, xi = sch.split(x, [None, m])
        ko, ki = sch.split(k, [None, width])
        sch.reorder(n, ty, tx, ko, i, j, yi, xi, ki)
        par = sch.fuse(n, ty, tx, ko)
        sch.reverse_compute_at(writeback, par, preserve_unit_loops=True)
        work = info.tiles * m * m * info.out_channels * info.alpha**2
        if work >= cfg.min_parallel_work and loop_extent(sch, par) > 1:
            sch.parallel(par)
        _unroll(sch, [i, j, yi, xi])
        if loop_extent(sch, ki) > 1:
            sch.vectorize(ki)
        init = sch.decompose_reduction(block, i)
        init_loops = sch.get_loops(init)
        if loop_extent(sch, init_loops[-1]) > 1 and width > 1:
            sch.vectorize(init_loops[-1])


# ---------------------------------------------------------------------------------------------
# OpenCL


class OpenCLWinograd(OpenCLRule):
    """Winograd conv on OpenCL devices (see the module docstring); declines anything else."""

    def schedule(self, sch: s_tir.Schedule, target: Target):
        cfg = self._config(target)
        info = match_winograd(sch)
        if isinstance(info, str):
            return info
        for block in info.prologue:
            try:
                sch.compute_inline(block)
            except s_tir.ScheduleError:
                bind_spatial(sch, block, cfg.pool_threads)
        # V as [e, v, c, p]: work-items along tiles write it contiguously, and the GEMM reads
        # a run of tiles per channel (the intermediate buffer's layout is the schedule's choice)
        sch.transform_layout(info.input, ("write", 0), lambda e, u, p, c: (e, u, c, p))
        self._input(sch, info, cfg)
        features = self._gemm(sch, info, cfg, target)
        self._inverse(sch, info, cfg)
        return "winograd", cfg.name, features

    @staticmethod
    def _input(sch: s_tir.Schedule, info: WinogradInfo, cfg: OpenCLConfig) -> None:
        block = info.input
        writeback = sch.cache_write(block, 0, "local")
        e, u, p, c, i, j = sch.get_loops(block)
        sch.reorder(c, p, e, u, i, j)
        fused = sch.fuse(c, p)
        threads = max(1, min(cfg.pool_threads, info.tiles * info.in_channels))
        bx, tx = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.compute_at(info.tile_block, tx, preserve_unit_loops=True)
        sch.set_scope(info.tile_block, 0, "local")
        _unroll(sch, sch.get_loops(info.tile_block)[2:])
        sch.reverse_compute_at(writeback, tx, preserve_unit_loops=True)
        _unroll(sch, [e, u, i, j])
        sch.decompose_reduction(block, i)

    @staticmethod
    def _gemm(
        sch: s_tir.Schedule, info: WinogradInfo, cfg: OpenCLConfig, target: Target
    ) -> dict[str, int]:
        block = info.gemm
        k_, p_ = info.out_channels, info.tiles
        vector = cfg.conv_vector_lanes > 1
        if vector:
            reg_k = max(1, opencl_vector_width(k_, cfg.conv_vector_lanes))
            t_k = 1
            reg_p = 1
            t_p = fit_threads(max(cfg.conv_threads_oh, 1) * 4, 1, p_)
        else:
            reg_k = min(cfg.conv_reg_oc, k_)
            reg_p = min(cfg.conv_reg_ow, p_)
            outputs = info.alpha**2 * p_ * k_
            while outputs < cfg.min_work_items * reg_k * reg_p and reg_k * reg_p > 1:
                if reg_k >= reg_p:
                    reg_k = max(1, reg_k // 2)
                else:
                    reg_p = max(1, reg_p // 2)
            t_k = fit_threads(cfg.conv_threads_oc, reg_k, k_)
            t_p = fit_threads(cfg.conv_threads_ow * cfg.conv_threads_oh, reg_p, p_)
        while t_k * t_p > cfg.max_workgroup_size:
            if t_p >= t_k and t_p > 1:
                t_p = max(1, t_p // 2)
            else:
                t_k = max(1, t_k // 2)
        chunk = 0
        if cfg.conv_use_local_memory and not vector:
            chunk = _gemm_chunk(cfg, target, info, t_p * reg_p, t_k * reg_k)
        writeback = sch.cache_write(block, 0, "local")
        e, u, p, k, c = sch.get_loops(block)
        batch = sch.fuse(e, u)
        ko, tk, rk = sch.split(k, [None, t_k, reg_k])
        po, tp, rp = sch.split(p, [None, t_p, reg_p])
        if chunk:
            first, ci = sch.split(c, [None, chunk])
            sch.reorder(batch, ko, po, tp, tk, first, ci, rp, rk)
        else:
            first = c
            sch.reorder(batch, ko, po, tp, tk, c, rp, rk)
        sch.bind(batch, "blockIdx.z")
        sch.bind(po, "blockIdx.y")
        sch.bind(ko, "blockIdx.x")
        t = sch.fuse(tp, tk)
        sch.bind(t, "threadIdx.x")
        if chunk:
            # stage a chunk of input channels of the workgroup's tiles (V) and weights (U) in
            # local memory, copied cooperatively by all work-items
            out = sch.get(block).writes[0].source
            operands = [r.source for r in sch.get(block).reads if not r.source.same_as(out)]
            for operand in operands:
                index = read_index(sch, block, operand)
                shared = sch.cache_read(block, index, "shared")
                sch.compute_at(shared, first, preserve_unit_loops=True)
                inner = sch.get_loops(shared)[5:]
                fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
                _, tx_copy = sch.split(fused, [None, t_k * t_p])
                sch.bind(tx_copy, "threadIdx.x")
        finish_register_tile(sch, block, writeback, t, rp, rk, first, bool(vector and reg_k > 1))
        groups = info.alpha**2 * math.ceil(p_ / (t_p * reg_p)) * math.ceil(k_ / (t_k * reg_k))
        return {"codl.workgroup_size": t_k * t_p, "codl.workgroup_count": groups}

    @staticmethod
    def _inverse(sch: s_tir.Schedule, info: WinogradInfo, cfg: OpenCLConfig) -> None:
        block = info.inverse
        m = info.tile
        writeback = sch.cache_write(block, 0, "local")
        gpu_inline_epilogue(sch, FuncBlocks([], block, info.epilogue), cfg.pool_threads)
        n, k, y, x, i, j = sch.get_loops(block)
        ty, yi = sch.split(y, [None, m])
        tx, xi = sch.split(x, [None, m])
        sch.reorder(n, ty, tx, k, i, j, yi, xi)
        fused = sch.fuse(n, ty, tx, k)
        threads = max(1, min(cfg.pool_threads, loop_extent(sch, fused)))
        bx, t = sch.split(fused, [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(t, "threadIdx.x")
        sch.reverse_compute_at(writeback, t, preserve_unit_loops=True)
        _unroll(sch, [i, j, yi, xi])
        sch.decompose_reduction(block, i)


def _gemm_chunk(cfg: OpenCLConfig, target: Target, info: WinogradInfo, rows: int, cols: int) -> int:
    """Input channels of V and U staged in local memory per step of the GEMM (0: none).

    The largest chunk of at most ``conv_ic_chunk`` that divides the input channels and whose
    ``rows x chunk`` tiles of V plus ``chunk x cols`` weights fit the local memory limit.
    """
    limit = local_limit(cfg, target)
    nbytes = info.dtype_bits // 8
    for chunk in range(min(cfg.conv_ic_chunk, info.in_channels), 0, -1):
        if info.in_channels % chunk == 0 and chunk * (rows + cols) * nbytes <= limit:
            return chunk if chunk > 1 else 0
    return 0
