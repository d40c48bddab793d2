"""The schedule parameters of codl-tvm's rules: :class:`CPUConfig` and :class:`OpenCLConfig`.

This module owns the two frozen dataclasses and their validation; nothing else. The named
presets (one per CPU vector ISA and OpenCL device class) and the choice of preset for a
:class:`tvm.target.Target` are in :mod:`codl_tvm.schedules.presets`; the build-wide switches
(Winograd, packed convs, CPU-alone settings, codl's dense rule, field overrides) are one
:class:`~codl_tvm.schedules.settings.ScheduleSettings` object in
:mod:`codl_tvm.schedules.settings`, which also resolves a target's config
(:func:`~codl_tvm.schedules.settings.cpu_config`,
:func:`~codl_tvm.schedules.settings.opencl_config`).
Every number the rules use is a field here, so a tuner can sweep it and a test can pin it.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass

__all__ = ["CPUConfig", "OpenCLConfig"]

# Names this module held before the presets and settings moved out: deprecation aliases for one
# release, resolved on first use (presets and settings import this module).
_MOVED = {
    **dict.fromkeys(
        (
            "ADRENO",
            "AVX2",
            "AVX512",
            "CPU_ALONE_SETTINGS",
            "MALI",
            "NEON",
            "NVIDIA",
            "OPENCL_GENERIC",
            "PACKED_CPU_ALONE",
            "POCL",
            "SSE",
            "WINOGRAD_CANDIDATES",
            "WINOGRAD_CPU_ALONE",
        ),
        "presets",
    ),
    **dict.fromkeys(
        (
            "cpu_alone_on",
            "cpu_alone_settings",
            "cpu_config",
            "cpu_overrides",
            "dense_enabled",
            "opencl_config",
            "opencl_overrides",
            "packed_enabled",
            "packed_presets",
            "winograd_enabled",
            "winograd_presets",
        ),
        "settings",
    ),
}


def __getattr__(name: str):
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"codl_tvm.schedules.config.{name} is deprecated: import it from "
        f"codl_tvm.schedules.{module} (or codl_tvm.schedules)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def _check_winograd(config) -> None:
    if config.winograd_tile not in (2, 4):
        raise ValueError(
            f"{type(config).__name__} {config.name!r}: winograd_tile must be 2 or 4, "
            f"got {config.winograd_tile!r}"
        )
    if config.winograd_min_channels < 1:
        raise ValueError(
            f"{type(config).__name__} {config.name!r}: winograd_min_channels must be >= 1, "
            f"got {config.winograd_min_channels!r}"
        )
    if config.winograd_min_tiles < 0:
        raise ValueError(
            f"{type(config).__name__} {config.name!r}: winograd_min_tiles must be >= 0, "
            f"got {config.winograd_min_tiles!r}"
        )


@dataclass(frozen=True)
class CPUConfig:
    """Schedule parameters of one CPU vector ISA.

    Attributes
    ----------
    name : str
        Preset name, recorded on scheduled kernels (``codl.config``).
    vector_bits : int
        Width of one SIMD register in bits; the vector width in elements is
        ``vector_bits // dtype_bits``.
    max_row_vectors : int
        The vectorised output row tile (conv: output width) may span up to this many registers.
    partial_vectors : bool
        Let row tiles be vectors of any length up to one register (13 of 16 lanes), else only
        ``lanes / 2**k`` (see :func:`~codl_tvm.schedules.choose_row_width`).
    conv_oc_tile : int
        Output channels held in registers at once by the direct and GEMM conv (register tile).
    conv_oh_tile : int
        Output rows held in registers at once by the direct conv when one register covers the
        row tile (weights are then reused across rows).
    conv1x1_gemm : bool
        Schedule 1x1 stride-1 unpadded convs as a GEMM over the flattened image (``gemm``);
        False uses the ``direct`` schedule (row-vectorised, with the row register tile).
    conv1x1_pad_pixels : bool
        Let the ``gemm`` schedule pad the flattened image to whole registers where its best
        unpadded tile would leave a scalar tail or be an odd multi-register vector
        (:func:`~codl_tvm.schedules.common.padded_row_width`): one copy of the input into a
        padded buffer buys a tail-free vector loop.
    matmul_m_tile : int
        Rows of a matmul (or spatial axis next to the vectorised one in a reduction) held in
        registers at once.
    max_accumulators : int
        Upper bound on accumulator registers of one register tile; tiles shrink to fit.
    max_weight_tile_bytes : int
        Upper bound on the weights one register tile reads over its reduction (``oc_tile`` x
        ``C/groups`` x ``KH`` x ``KW``); the channel tile halves until they fit in L2 next to
        the input rows.
    max_tile_bytes : int
        Upper bound on the per-thread accumulator buffer of one tile. TVM's LLVM backend keeps a
        buffer of at most 1024 bytes on the stack (``kMaxStackAlloca``), where LLVM promotes it to
        registers; larger ones go to the heap workspace.
    min_parallel_work : int
        Loop iterations (outputs x reduction) below which a kernel runs serially (waking the
        thread pool costs more).
    injective_chunk : int
        Elements per parallel task of a one-dimensional elementwise kernel (multi-dimensional
        ones run their outer loops in parallel).
    winograd : bool
        Rewrite qualifying convs (3x3, stride 1, dilation 1, one group, constant weight) as
        Winograd convolutions (:mod:`codl_tvm.passes.winograd`, scheduled by
        :class:`~codl_tvm.schedules.winograd.CPUWinograd`).
    winograd_tile : int
        Output tile ``m`` of Winograd ``F(m x m, 3 x 3)``: 2 or 4 (4 saves more multiplies,
        2 has cheaper transforms and less rounding error).
    winograd_min_channels : int
        Winograd only when input and output channels are both at least this (the transforms
        are amortised over the channels).
    winograd_min_tiles : int
        Winograd only when the output holds at least this many ``m x m`` tiles (0: no limit).
        The transformed weight is ``(m+2)^2 / 9`` times the 3x3 weight (4x for ``m = 4``) and
        each of its elements serves one multiply-add per tile, so on small maps the Winograd
        GEMM streams weights from memory (about ``tiles / 2`` flops per byte) and loses to the
        direct conv (measurements: docs/benchmarks.md, "Schedule preset defaults").
    winograd_wide_tiles : int
        Outputs of at least this many ``m x m`` tiles take Winograd from
        ``winograd_wide_min_channels`` channels instead (0: off): a large map amortises the
        transforms over many tiles where a small one with the same channels does not.
    winograd_wide_min_channels : int
        See ``winograd_wide_tiles``.
    conv_packed : bool
        Rewrite qualifying convs with constant weights as channel-packed convs, vectorised over
        output channels (:mod:`codl_tvm.schedules.packed`); off in every preset, switched on by
        :func:`~codl_tvm.schedules.settings.packed_enabled` (builds for the CPU alone on
        :data:`~codl_tvm.schedules.presets.PACKED_CPU_ALONE`).
    packed_oc_vectors : int
        Most output-channel vectors in one register tile of the packed conv.
    packed_min_in_channels : int
        Packed convs only with at least this many input channels: each output pixel is one
        broadcast per input channel and tap, so short reductions leave the loads dominant (a
        3-channel stem keeps ``direct``). Not swept; 48 (with 256 for 1x1 convs) made
        SqueezeNet's packed build faster than its direct/GEMM build on AVX-512, 16 slower.
    packed_min_reduction : int
        When set (> 0), convs other than 1x1 stride-1 ones are packed by the length of their
        reduction (input channels x kernel taps) instead of ``packed_min_in_channels``: a 5x5
        conv of 16 channels (400) has the reduction of a 3x3 conv of 44. 0 keeps the channel
        rule (the presets and the profiled co-executed parts).
    packed_strided : bool
        Pack strided convs whatever their channels (a 3-channel stem): the direct kernel
        vectorises along the output row and gathers a strided conv's input.
    packed_max_gemm_pixels : int
        1x1 stride-1 convs are packed only up to this many output pixels; larger images keep
        the ``gemm`` schedule.
    packed_min_gemm_channels : int
        ... and only with at least this many input channels (not tuned).
    packed_tile_bytes : int
        ``max_tile_bytes`` of packed convs (0: the same). Beyond 1024 bytes TVM allocates the
        accumulators from its workspace pool once per parallel task; LLVM still keeps a
        tail-free tile (``packed_exact_tiles``) in registers, up to 28 of 32 on AVX-512.
    packed_strided_tile_bytes : int
        ``max_tile_bytes`` of strided packed convs (0: ``packed_tile_bytes``). Off by default:
        a larger tile sped up the stride-2 convs only while they read NCHW input, not with
        ``packed_nhwc_input``.
    packed_nhwc_input : int
        Input layout of packed convs other than 1x1 stride-1 ones: 0 reads the NCHW input (or
        its padded copy) directly; 1 makes strided packed convs copy their (padded) input to
        NHWC first; 2 every such packed conv. The reduction then walks input channels
        innermost, so each pixel's broadcasts read consecutive addresses; in NCHW every
        reduction step reads a different channel plane, a stride no hardware prefetcher follows
        (``H x W x 4`` bytes: 52 KB for a 114x114 padded plane). The copy costs one pass over
        the input, which the NCHW path pays too when the conv is padded. Builds for the CPU
        alone use 1 on AVX-512 (:data:`~codl_tvm.schedules.presets.CPU_ALONE_SETTINGS`).
    packed_chunk_weight_heavy : bool
        Chunk pointwise convs with more output channels than pixels too (their packed weight is
        larger than their input, e.g. SqueezeNet's 512->1000 conv on 13x13): chunks make every
        channel block read its weights once per chunk. False leaves them in the plain order,
        where each thread's channel blocks keep their weights in cache over the whole image.
    packed_round_blocks : bool
        Round a packed conv's output-channel blocks up to a multiple of ``packed_oc_vectors``
        (zero weights, sliced off) where that adds at most 1/16 more blocks: 1000 classes are 63
        blocks of 16, which no 2-vector tile divides, so every tile would hold one weight vector
        and reuse each broadcast input once (:func:`~codl_tvm.schedules.packed.packed_blocks`).
    packed_exact_tiles : bool
        Prefer register tiles of packed convs that divide the output (no tail) while they keep
        at least half the accumulators of the best tile with a tail
        (:func:`~codl_tvm.schedules.packed.packed_tile`): the tail's predicate sits inside the
        reduction loop, and LLVM keeps the guarded accumulators in memory in every tile.
    packed_chunk_bytes : int
        Pointwise packed convs walk the image in chunks of pixel tiles whose input (all input
        channels) fits this many bytes, running every output-channel block over one chunk
        before the next: the input streams from memory once and each block's weights stay in
        cache over the chunk; chunks shrink to leave at least
        :data:`~codl_tvm.schedules.packed.MIN_CHUNK_TASKS` of them. 0 keeps one loop over
        channel blocks outside the pixel tiles, which streams the whole input once per block
        (the schedule the shipped cost models were profiled with).
    """

    name: str
    vector_bits: int
    max_row_vectors: int = 2
    partial_vectors: bool = True
    conv_oc_tile: int = 4
    conv_oh_tile: int = 2
    conv1x1_gemm: bool = True
    conv1x1_pad_pixels: bool = True
    matmul_m_tile: int = 4
    max_accumulators: int = 12
    max_weight_tile_bytes: int = 320 * 1024
    max_tile_bytes: int = 1024
    min_parallel_work: int = 4096
    injective_chunk: int = 4096
    winograd: bool = False
    winograd_tile: int = 2
    winograd_min_channels: int = 32
    winograd_min_tiles: int = 0
    winograd_wide_tiles: int = 0
    winograd_wide_min_channels: int = 32
    conv_packed: bool = False
    packed_oc_vectors: int = 2
    packed_min_in_channels: int = 48
    packed_min_reduction: int = 0
    packed_strided: bool = False
    packed_max_gemm_pixels: int = 400
    packed_min_gemm_channels: int = 256
    packed_chunk_bytes: int = 0
    packed_tile_bytes: int = 0
    packed_strided_tile_bytes: int = 0
    packed_nhwc_input: int = 0
    packed_chunk_weight_heavy: bool = True
    packed_round_blocks: bool = False
    packed_exact_tiles: bool = False

    def __post_init__(self) -> None:
        _check_winograd(self)
        for field in (
            "packed_chunk_bytes",
            "packed_min_reduction",
            "packed_tile_bytes",
            "packed_strided_tile_bytes",
            "winograd_wide_tiles",
        ):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"CPUConfig {self.name!r}: {field} must be >= 0, got {getattr(self, field)!r}"
                )
        if self.winograd_wide_min_channels < 1:
            raise ValueError(
                f"CPUConfig {self.name!r}: winograd_wide_min_channels must be >= 1, "
                f"got {self.winograd_wide_min_channels!r}"
            )
        if self.packed_nhwc_input not in (0, 1, 2):
            raise ValueError(
                f"CPUConfig {self.name!r}: packed_nhwc_input must be 0, 1 or 2, "
                f"got {self.packed_nhwc_input!r}"
            )
        if self.packed_oc_vectors < 1:
            raise ValueError(
                f"CPUConfig {self.name!r}: packed_oc_vectors must be >= 1, "
                f"got {self.packed_oc_vectors!r}"
            )

    def lanes(self, dtype_bits: int) -> int:
        """Vector width in elements of ``dtype_bits`` bits (at least 1)."""
        return max(1, self.vector_bits // dtype_bits)


@dataclass(frozen=True)
class OpenCLConfig:
    """Schedule parameters of one OpenCL device class.

    Attributes
    ----------
    name : str
        Preset name, recorded on scheduled kernels (``codl.config``).
    conv_threads_oc : int
        Work-items along output channels in one workgroup of the direct conv.
    conv_threads_ow : int
        Work-items along output width in one workgroup.
    conv_threads_oh : int
        Work-items along output height in one workgroup.
    conv_threads_oh_pointwise : int
        ... for 1x1 stride-1 convs (0: ``conv_threads_oh``).
    conv_reg_oc : int
        Output channels computed by one work-item (register tile).
    conv_reg_ow : int
        Output columns computed by one work-item (register tile).
    conv_ic_chunk : int
        Input channels staged in local (shared) memory per step when ``conv_use_local_memory``;
        shrinks to fit the device's local memory.
    conv_use_local_memory : bool
        Stage input rows and weights of a workgroup's tile in local memory (GPUs with on-chip
        local memory; off for CPU OpenCL, where it only adds barriers).
    local_memory_bytes : int
        Local memory the conv may use per workgroup (0: the target's
        ``max_shared_memory_per_block``).
    max_workgroup_size : int
        Upper bound on work-items per workgroup; thread tiles shrink to fit.
    pool_threads : int
        Work-items per workgroup of pooling and other spatial kernels.
    conv_vector_lanes : int
        Vectorise each work-item's output columns with OpenCL vector types of up to this many
        lanes (``conv_reg_ow`` is then chosen like the CPU row width); 0 keeps scalar
        work-items (GPUs, which vectorise across work-items themselves).
    min_work_items : int
        Register tiles shrink until the conv launches at least this many work-items (a big GPU
        needs tens of thousands in flight; 0 keeps the tiles).
    conv_split_k : int
        Most slices the direct conv may split its input channels into (split-K) when it launches
        fewer than ``min_work_items`` work-items with whole register tiles: each slice's partial
        sums go to a buffer, and a second kernel adds the slices and applies the epilogue. A
        small map with many channels (13x13x1024) then fills a big GPU without shrinking the
        register tiles. 1 never splits.
    conv_split_k_min_reduction : int
        ... and each slice keeps at least this many multiply-adds per output (channels x taps).
    winograd, winograd_tile, winograd_min_channels, winograd_min_tiles
        As in :class:`CPUConfig`. The Winograd GEMM uses the conv's thread and register tiles
        (``conv_threads_oc`` x ``conv_reg_oc`` output channels, ``conv_threads_ow`` x
        ``conv_reg_ow`` tiles per workgroup); the transforms run ``pool_threads`` work-items
        per workgroup.
    dense : bool
        Schedule dense/matmul with codl's rule (:class:`~codl_tvm.schedules.OpenCLDense`);
        off in every preset but PoCL's until measured faster on the device class (dlight's
        Matmul/GEMV/Reduction rules otherwise).
        :func:`~codl_tvm.schedules.settings.dense_enabled` switches it on.
    dense_gemm_min_m : int
        Dense/matmul with at least this many rows (batch x M) is a tiled GEMM (``gemm``);
        fewer rows use the GEMV schedule (``gemv``).
    dense_threads_m, dense_threads_n : int
        Work-items along rows / output features in one GEMM workgroup.
    dense_reg_m, dense_reg_n : int
        Rows / output features computed by one work-item of the GEMM (register tile).
    dense_k_chunk : int
        Reduction elements per step of the GEMM (staged in local memory when
        ``dense_use_local_memory``); the largest divisor of K up to this is used.
    dense_use_local_memory : bool
        Stage the GEMM's input and weight tiles in local memory.
    dense_vector_lanes : int
        Vectorise each GEMM work-item's output features with OpenCL vectors of up to this many
        lanes (CPU OpenCL); 0 keeps scalar work-items.
    dense_gemv_threads_k : int
        Work-items that split the reduction of one GEMV output (cross-thread reduction);
        1 reduces serially in each work-item.
    dense_gemv_rows : int
        Output features per GEMV workgroup (one per work-item row).
    """

    name: str
    conv_threads_oc: int = 8
    conv_threads_ow: int = 8
    conv_threads_oh: int = 2
    conv_threads_oh_pointwise: int = 0
    conv_reg_oc: int = 4
    conv_reg_ow: int = 2
    conv_ic_chunk: int = 8
    conv_use_local_memory: bool = False
    local_memory_bytes: int = 0
    max_workgroup_size: int = 256
    pool_threads: int = 128
    conv_vector_lanes: int = 0
    min_work_items: int = 0
    conv_split_k: int = 1
    conv_split_k_min_reduction: int = 1024
    winograd: bool = False
    winograd_tile: int = 2
    winograd_min_channels: int = 32
    winograd_min_tiles: int = 0
    dense: bool = False
    dense_gemm_min_m: int = 8
    dense_threads_m: int = 8
    dense_threads_n: int = 8
    dense_reg_m: int = 4
    dense_reg_n: int = 4
    dense_k_chunk: int = 16
    dense_use_local_memory: bool = False
    dense_vector_lanes: int = 0
    dense_gemv_threads_k: int = 32
    dense_gemv_rows: int = 4

    def __post_init__(self) -> None:
        _check_winograd(self)
        if self.conv_split_k < 1:
            raise ValueError(
                f"OpenCLConfig {self.name!r}: conv_split_k must be >= 1, got {self.conv_split_k!r}"
            )
