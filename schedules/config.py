"""Tile sizes, vector widths and workgroup shapes of codl-tvm's schedule rules, per target.

Every number the rules use lives here, in frozen dataclasses with named presets, so a tuner can
sweep them and a test can pin them. :func:`cpu_config` and :func:`opencl_config` pick a preset from
a :class:`tvm.target.Target`:

- CPU (kind ``llvm``): keys containing ``arm_cpu`` give :data:`NEON` (128-bit, 32 registers).
  Otherwise the x86 preset follows ``mcpu``/``mattr``: AVX-512 (512-bit, 32 registers), AVX2
  (256-bit, 16 registers) or, for the plain ``llvm`` target, which LLVM compiles for generic
  x86-64, :data:`SSE` (128-bit, 16 registers).
- OpenCL (kind ``opencl``): the ``device`` attribute or a target key names the device class
  (``adreno``, ``mali``, ``nvidia``, ``pocl``); anything else gets :data:`OPENCL_GENERIC`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tvm.target import Target

__all__ = [
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
    "WINOGRAD_CPU_ALONE",
    "CPUConfig",
    "OpenCLConfig",
    "cpu_alone_on",
    "cpu_alone_settings",
    "cpu_config",
    "cpu_overrides",
    "opencl_config",
    "opencl_overrides",
    "packed_enabled",
]


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
        direct conv. In whole models on the device machine (8 AVX-512 threads,
        kernel by kernel) ResNet50's Winograd kernels ran 1.5x their
        isolated latency on 28x28 and 56x56 outputs (49 and 196 tiles) but 2.1x on 14x14 (16)
        and 3.3x on 7x7 (4).
    winograd_wide_tiles : int
        Outputs of at least this many ``m x m`` tiles take Winograd from
        ``winograd_wide_min_channels`` channels instead (0: off): a large map amortises the
        transforms over many tiles where a small one with the same channels does not (AVX-512:
        with ``winograd_min_channels=128`` the 104x104x64 conv ran 3.18 ms packed
        against 2.00 with Winograd, while SqueezeNet's 16-64-channel convs on 55x55 and smaller
        maps ran faster packed).
    winograd_wide_min_channels : int
        See ``winograd_wide_tiles``.
    conv_packed : bool
        Rewrite qualifying convs with constant weights as channel-packed convs, vectorised over
        output channels (:mod:`codl_tvm.schedules.packed`); off in every preset, switched on by
        :func:`packed_enabled` (builds for the CPU alone on :data:`PACKED_CPU_ALONE`).
    packed_oc_vectors : int
        Most output-channel vectors in one register tile of the packed conv.
    packed_min_in_channels : int
        Packed convs only with at least this many input channels: each output pixel is one
        broadcast per input channel and tap, so short reductions leave the loads dominant (a
        3-channel stem keeps ``direct``). Not swept; with 48/256 SqueezeNet's packed build beat
        its direct/GEMM build on the device machine (3.52 vs 3.79 ms), with 16 it lost.
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
        ... and only with at least this many input channels (not tuned on the device machine).
    packed_tile_bytes : int
        ``max_tile_bytes`` of packed convs (0: the same). Beyond 1024 bytes TVM allocates the
        accumulators from its workspace pool once per parallel task; LLVM still keeps a
        tail-free tile (``packed_exact_tiles``) in registers, up to 28 of 32 on AVX-512.
    packed_strided_tile_bytes : int
        ``max_tile_bytes`` of strided packed convs (0: ``packed_tile_bytes``). A 28-accumulator tile
        (2048) ran the stride-2 112x112x64 conv 1.6x faster on the device machine but slowed
        the deep stride-1 convs, so it is kept for strided ones. With the NHWC input
        (``packed_nhwc_input``) it no longer helped (stride-2 conv 0.47 vs 0.45 ms, whole models
        0.97-1.05x as long): off by default.
    packed_nhwc_input : int
        Input layout of packed convs other than 1x1 stride-1 ones: 0 reads the NCHW input (or
        its padded copy) directly; 1 makes strided packed convs copy their (padded) input to
        NHWC first; 2 every such packed conv. The reduction then walks input channels
        innermost, so each pixel's broadcasts read consecutive addresses; in NCHW every
        reduction step reads a different channel plane, a stride no hardware prefetcher follows
        (``H x W x 4`` bytes: 52 KB for a 114x114 padded plane). The copy costs one pass over
        the input, which the NCHW path pays too when the conv is padded. Builds for the CPU
        alone use 1 on AVX-512 (:data:`CPU_ALONE_SETTINGS`).
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
        off in every preset until measured on the device machine (dlight's Matmul/GEMV/
        Reduction rules otherwise). :func:`dense_enabled` switches it on.
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


SSE = CPUConfig(
    name="sse",
    vector_bits=128,
    max_row_vectors=4,
    conv_oc_tile=4,
    conv_oh_tile=2,
    max_accumulators=12,
)
AVX2 = CPUConfig(
    name="avx2",
    vector_bits=256,
    conv_oc_tile=4,
    conv_oh_tile=2,
    max_accumulators=12,
    winograd_tile=4,
)
# Measured on a skylake-avx512 Xeon (8 threads, CoDL's conv shapes): 16 channels x 1 row beat
# 8x2, 4x2, 4x4 and 8x1 on every shape but 13x13x1024, where 16 channels of weights no longer
# fit in L2 (see max_weight_tile_bytes).
AVX512 = CPUConfig(
    name="avx512",
    vector_bits=512,
    conv_oc_tile=16,
    conv_oh_tile=1,
    max_accumulators=28,
    winograd_tile=4,
    # 28x28 outputs (49 tiles) keep Winograd, 14x14 (16) do not; see winograd_min_tiles.
    winograd_min_tiles=32,
)
NEON = CPUConfig(
    name="neon",
    vector_bits=128,
    max_row_vectors=4,
    conv_oc_tile=8,
    conv_oh_tile=2,
    max_accumulators=24,
    winograd_tile=2,
)

OPENCL_GENERIC = OpenCLConfig(name="opencl-generic")
ADRENO = OpenCLConfig(
    name="adreno",
    conv_threads_oc=4,
    conv_threads_ow=16,
    conv_threads_oh=2,
    conv_reg_oc=4,
    conv_reg_ow=2,
    max_workgroup_size=256,
    pool_threads=64,
    conv_use_local_memory=True,
    winograd_tile=2,
    dense_use_local_memory=True,
    dense_gemv_threads_k=16,
)
# Mali has no on-chip local memory (it is ordinary cached memory): read global memory directly.
MALI = OpenCLConfig(
    name="mali",
    conv_threads_oc=4,
    conv_threads_ow=8,
    conv_threads_oh=2,
    conv_reg_oc=4,
    conv_reg_ow=2,
    max_workgroup_size=128,
    pool_threads=64,
    winograd_tile=2,
    dense_threads_m=4,
    dense_threads_n=8,
    dense_gemv_threads_k=16,
)
# 64 oc x 4 rows x 32 columns per workgroup of 256 work-items (2 rows for 1x1 convs), 32
# accumulators each; input rows and weights of 8 input channels at a time in local memory.
# Convs with too few work-items for 132 SMs split their input channels (split-K) rather than
# shrink the register tiles. Measured on the H100, one change at a time:
# - split-K: 13x13x1024 0.97 -> 0.78 ms, 7x7x512 0.21 -> 0.075;
# - 4 rows instead of 2: 0.72-0.92x as long on 3x3 convs (13x13x1024 0.78 -> 0.56 ms), 1.3x on
#   the 52x52 1x1 conv, which keeps 2;
# - 16 channels per work-item instead of 8: 104x104x64 0.137 -> 0.111 ms, 13x13x1024 0.569 ->
#   0.531, the other convs unchanged (4 output columns per work-item doubled 13x13x1024, 8
#   rows helped it to 0.50 but slowed three others). Kernel benchmark: docs/benchmarks.md.
NVIDIA = OpenCLConfig(
    name="nvidia",
    conv_threads_oc=4,
    conv_threads_ow=16,
    conv_threads_oh=4,
    conv_threads_oh_pointwise=2,
    conv_reg_oc=16,
    conv_reg_ow=2,
    max_workgroup_size=1024,
    pool_threads=256,
    conv_use_local_memory=True,
    conv_ic_chunk=8,
    min_work_items=32768,
    conv_split_k=8,
    winograd_tile=4,
    dense_threads_m=16,
    dense_threads_n=16,
    dense_use_local_memory=True,
    dense_gemv_threads_k=32,
    dense_gemv_rows=8,
)

# PoCL runs a workgroup as a loop over work-items on one core and vectorises only innermost
# loops, so a work-item with a reduction loop inside is scalar code. Each work-item is instead a
# CPU-style register tile: 16 output channels x one vector of up to 16 columns (AVX-512 on the
# device machine's Xeon; LLVM splits it on narrower CPUs), 4 rows per workgroup.
POCL = OpenCLConfig(
    name="pocl",
    conv_threads_oc=1,
    conv_threads_ow=1,
    conv_threads_oh=4,
    conv_reg_oc=16,
    conv_reg_ow=1,
    conv_vector_lanes=16,
    max_workgroup_size=256,
    pool_threads=64,
    winograd_tile=2,
    # codl's dense rule, its GEMM path even for one row: a work-item per 16 output features
    # reads the [K, N] weight as 16-wide vectors. Batch-1 dense on 12 PoCL cores, profiled on a
    # quiet machine (the ``emulated_soc_k12_dense`` dataset) against dlight's GEMV
    # (``emulated_soc_k12``): VGG's fc6 25088->4096 105.7 -> 9.0 ms (TVM's CPU build on
    # the other 4 cores: 14.2), 4096->4096 7.9 -> 1.4, 4096->1000 1.28 -> 0.46, ResNet50's
    # 2048->1000 0.71 -> 0.09. codl's GEMV path (a work-item per output, K serial) was slower
    # than dlight (in a run that overlapped another benchmark: ratios only).
    dense=True,
    dense_gemm_min_m=1,
    dense_threads_m=1,
    dense_threads_n=1,
    dense_reg_m=4,
    dense_reg_n=16,
    dense_vector_lanes=16,
    dense_gemv_threads_k=1,
    dense_gemv_rows=16,
)

_X86_AVX512_CPUS = (
    "skylake-avx512",
    "cascadelake",
    "cooperlake",
    "icelake-server",
    "icelake-client",
    "tigerlake",
    "sapphirerapids",
    "emeraldrapids",
    "graniterapids",
    "znver4",
    "znver5",
    "rocketlake",
    "cannonlake",
    "x86-64-v4",
)
_X86_AVX2_CPUS = (
    "haswell",
    "broadwell",
    "skylake",
    "alderlake",
    "raptorlake",
    "meteorlake",
    "znver1",
    "znver2",
    "znver3",
    "x86-64-v3",
    "core-avx2",
)
_OPENCL_PRESETS = {"adreno": ADRENO, "mali": MALI, "nvidia": NVIDIA, "pocl": POCL}


#: Presets that turn Winograd on inside :func:`winograd_enabled` (the generic targets stay off).
WINOGRAD_CANDIDATES = ("avx2", "avx512", "neon", "pocl", "nvidia", "adreno", "mali")
#: CPU presets whose builds for the CPU alone use Winograd by default (``codl-tvm compile``
#: without ``--winograd``/``--no-winograd``): measured faster on whole models there (AVX-512,
#: 8 threads: VGG19 1.48-1.78x, Inception v1 1.12x, ResNet50 1.02-1.08x). Co-executed CPU parts
#: use it too where the cost model has Winograd data (``codl-tvm profile --winograd``; the
#: shipped emulated-soc model has).
WINOGRAD_CPU_ALONE = ("avx512",)
_WINOGRAD_ON: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "codl_winograd_on", default=frozenset()
)
#: CPU presets whose builds for the CPU alone use channel-packed convs by default
#: (``codl-tvm compile`` without ``--packed``/``--no-packed``). Co-executed CPU parts use them
#: too where the cost model has packed data (the shipped emulated-soc model has).
PACKED_CPU_ALONE = ("avx512",)
_PACKED_ON: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "codl_packed_on", default=frozenset()
)


def _preset_names(switch: str, presets: Iterable[str] | str, cpu_only: bool = False) -> frozenset:
    cpus = {c.name for c in (SSE, AVX2, AVX512, NEON)}
    known = cpus if cpu_only else cpus | {OPENCL_GENERIC.name, *_OPENCL_PRESETS}
    names = frozenset(known if presets == "all" else presets)
    unknown = sorted(names - known)
    if unknown:
        raise ValueError(f"{switch}: unknown presets {unknown}; known: {sorted(known)}")
    return names


@contextlib.contextmanager
def winograd_enabled(presets: Iterable[str] | str = WINOGRAD_CANDIDATES) -> Iterator[None]:
    """Within the block, :func:`cpu_config` / :func:`opencl_config` return the named presets
    with ``winograd=True`` (each with its own ``winograd_tile``).

    Winograd is off in every preset until the device machine has measured it faster; this is
    the switch for builds that want it (``codl-tvm compile --winograd``) and for tests.

    Parameters
    ----------
    presets : Iterable[str] | str
        Preset names (:data:`WINOGRAD_CANDIDATES` by default), or ``"all"`` (the generic
        ``sse`` and ``opencl-generic`` presets too).
    """
    token = _WINOGRAD_ON.set(_preset_names("winograd_enabled", presets))
    try:
        yield
    finally:
        _WINOGRAD_ON.reset(token)


@contextlib.contextmanager
def packed_enabled(presets: Iterable[str] | str = PACKED_CPU_ALONE) -> Iterator[None]:
    """Within the block, :func:`cpu_config` returns the named CPU presets with
    ``conv_packed=True`` (channel-packed convs, :mod:`codl_tvm.schedules.packed`).

    Parameters
    ----------
    presets : Iterable[str] | str
        CPU preset names (:data:`PACKED_CPU_ALONE` by default), or ``"all"``.
    """
    token = _PACKED_ON.set(_preset_names("packed_enabled", presets, cpu_only=True))
    try:
        yield
    finally:
        _PACKED_ON.reset(token)


def packed_presets() -> frozenset[str]:
    """The presets :func:`packed_enabled` switched on here (empty outside such a block)."""
    return _PACKED_ON.get()


#: CPUConfig fields that builds for the CPU alone set on top of a preset, where they measured
#: faster; co-executed CPU parts keep the preset's values, the kernels the cost models were
#: profiled with, until a campaign measures these. AVX-512 (the device machine, 8 threads),
#: each measured against the settings before it in the same rounds:
#:
#: - every 1x1 conv with at least 128 input channels packed, in pixel chunks of 256 KiB of
#:   input: the 1x1 GEMM kernels on 28x28 and 56x56 maps ran 0.49-0.62x as long packed, the
#:   already-packed 14x14 ones 0.75-0.93x chunked; from 64 channels it was 0.79-1.13x, and
#:   SqueezeNet (16-64 channels) lost 3.31 -> 3.81 ms;
#: - other convs packed by reduction length (from 400 multiply-adds per output: 5x5 convs of
#:   16-32 channels ran 0.62-0.75x as long in Inception v1) and strided convs with any channels
#:   (the 3-channel stems): SqueezeNet 3.31 -> 2.99 ms, Inception v1 9.87 -> 9.05, AlexNet 8.42
#:   -> 8.00, ResNet50 21.0 -> 20.4, PoseNet 8.85 -> 8.66;
#: - strided packed convs read an NHWC copy of their input: the stride-2 112x112x64 conv 0.93 ->
#:   0.47 ms (onnxruntime 0.38), whole models 0.91-0.97x as long. NHWC for stride-1 convs too
#:   (``packed_nhwc_input=2``) slowed the deep small-map convs (13x13x1024: 2.9 -> 4.2 ms);
#: - tail-free register tiles (``packed_exact_tiles``: the 14x14 1x1 256->1024 conv 0.264 ->
#:   0.179 ms; 13x13x1024 3x3 4.78 -> 3.81 ms), packing from 128 multiply-adds per output and
#:   Winograd from 128 channels (the 16-64-channel 3x3 convs of SqueezeNet and VGG ran faster
#:   packed): SqueezeNet 2.88 -> 2.26 ms, ResNet50 22.9 -> 19.0, Inception v1 9.54 -> 8.25,
#:   AlexNet and VGG19 within noise;
#: - maps of at least 400 4x4 tiles keep Winograd from 32 channels (``winograd_wide_tiles``):
#:   104x104x64 3x3 3.27 -> 2.56 ms (onnxruntime 2.61), VGG19 63.7 -> 56.3 ms, the other models
#:   unchanged (identical kernels).
CPU_ALONE_SETTINGS: dict[str, dict[str, object]] = {
    "avx512": {
        "packed_chunk_bytes": 256 * 1024,
        "packed_max_gemm_pixels": 1 << 30,
        "packed_min_gemm_channels": 128,
        "packed_min_reduction": 128,
        "packed_strided": True,
        "packed_nhwc_input": 1,
        "packed_exact_tiles": True,
        "winograd_min_channels": 128,
        "winograd_wide_tiles": 400,
    },
}
_CPU_ALONE: contextvars.ContextVar[bool] = contextvars.ContextVar("codl_cpu_alone", default=False)


@contextlib.contextmanager
def cpu_alone_settings(on: bool = True) -> Iterator[None]:
    """Within the block, :func:`cpu_config` returns CPU presets with their
    :data:`CPU_ALONE_SETTINGS` (builds of a whole model for the CPU alone)."""
    token = _CPU_ALONE.set(on)
    try:
        yield
    finally:
        _CPU_ALONE.reset(token)


def cpu_alone_on() -> bool:
    """Whether a :func:`cpu_alone_settings` block is on here."""
    return _CPU_ALONE.get()


_DENSE_ON: contextvars.ContextVar[bool] = contextvars.ContextVar("codl_dense_on", default=False)


@contextlib.contextmanager
def dense_enabled(on: bool = True) -> Iterator[None]:
    """Within the block, :func:`opencl_config` returns presets with ``dense=on`` (codl's OpenCL
    dense rule instead of dlight's); off by default until measured on the device machine."""
    token = _DENSE_ON.set(on)
    try:
        yield
    finally:
        _DENSE_ON.reset(token)


_CPU_OVERRIDES: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "codl_cpu_overrides", default=()
)


@contextlib.contextmanager
def cpu_overrides(**fields) -> Iterator[None]:
    """Within the block, :func:`cpu_config` returns every CPU preset with ``fields`` replaced.

    For builds that compare one schedule parameter across whole models (A/B benchmarks,
    ``scripts/bench_cpu_models.py compile --cpu-config``) without a custom rule list.

    Parameters
    ----------
    **fields
        :class:`CPUConfig` fields and values (e.g. ``conv1x1_pad_pixels=False``).

    Raises
    ------
    ValueError
        A name that is not a :class:`CPUConfig` field.
    """
    with _overriding(_CPU_OVERRIDES, CPUConfig, "cpu_overrides", fields):
        yield


_OPENCL_OVERRIDES: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "codl_opencl_overrides", default=()
)


@contextlib.contextmanager
def opencl_overrides(**fields) -> Iterator[None]:
    """Within the block, :func:`opencl_config` returns every OpenCL preset with ``fields``
    replaced: to rebuild a part as a campaign built it under earlier preset settings (the cost
    model reads the kernels of recorded parts, ``cost_model.kernel_counts``).

    Raises
    ------
    ValueError
        A name that is not an :class:`OpenCLConfig` field.
    """
    with _overriding(_OPENCL_OVERRIDES, OpenCLConfig, "opencl_overrides", fields):
        yield


@contextlib.contextmanager
def _overriding(
    var: contextvars.ContextVar, config: type, what: str, fields: dict[str, object]
) -> Iterator[None]:
    """``var`` set to ``fields`` (checked against ``config``'s fields) within the block."""
    names = {f.name for f in dataclasses.fields(config)} - {"name"}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"{what}: {unknown} not {config.__name__} fields (have {sorted(names)})")
    token = var.set(tuple(fields.items()))
    try:
        yield
    finally:
        var.reset(token)


def winograd_presets() -> frozenset[str]:
    """The presets :func:`winograd_enabled` switched on here (empty outside such a block)."""
    return _WINOGRAD_ON.get()


def _switched(base):
    if base.name in _WINOGRAD_ON.get() and not base.winograd:
        base = dataclasses.replace(base, winograd=True)
    if isinstance(base, CPUConfig) and base.name in _PACKED_ON.get() and not base.conv_packed:
        base = dataclasses.replace(base, conv_packed=True)
    if isinstance(base, OpenCLConfig) and _DENSE_ON.get() and not base.dense:
        base = dataclasses.replace(base, dense=True)
    if isinstance(base, CPUConfig) and _CPU_ALONE.get() and base.name in CPU_ALONE_SETTINGS:
        base = dataclasses.replace(base, **CPU_ALONE_SETTINGS[base.name])
    if isinstance(base, CPUConfig) and _CPU_OVERRIDES.get():
        base = dataclasses.replace(base, **dict(_CPU_OVERRIDES.get()))
    if isinstance(base, OpenCLConfig) and _OPENCL_OVERRIDES.get():
        base = dataclasses.replace(base, **dict(_OPENCL_OVERRIDES.get()))
    return base


def cpu_config(target: Target, **overrides) -> CPUConfig:
    """The CPU preset for an ``llvm`` target, with optional field overrides.

    Parameters
    ----------
    target : Target
        A target of kind ``llvm``.
    **overrides
        Fields of :class:`CPUConfig` to replace (e.g. ``conv_oc_tile=4``).

    Returns
    -------
    CPUConfig
    """
    if target.kind.name != "llvm":
        raise ValueError(f"cpu_config needs an llvm target, got kind {target.kind.name!r}")
    mcpu = str(target.attrs.get("mcpu", "") or "").lower()
    mattr = [str(a).lower() for a in (target.attrs.get("mattr", None) or [])]
    if "arm_cpu" in target.keys:
        base = NEON
    elif mcpu in _X86_AVX512_CPUS or any(a.startswith("+avx512f") for a in mattr):
        base = AVX512
    elif mcpu in _X86_AVX2_CPUS or "+avx2" in mattr:
        base = AVX2
    else:
        base = SSE
    base = _switched(base)
    return dataclasses.replace(base, **overrides) if overrides else base


def opencl_config(target: Target, **overrides) -> OpenCLConfig:
    """The OpenCL preset for a target's device class, with optional field overrides.

    Parameters
    ----------
    target : Target
        A target of kind ``opencl``; its ``device`` attribute or keys name the device class.
    **overrides
        Fields of :class:`OpenCLConfig` to replace.

    Returns
    -------
    OpenCLConfig
    """
    if target.kind.name != "opencl":
        raise ValueError(f"opencl_config needs an opencl target, got kind {target.kind.name!r}")
    names = [str(target.attrs.get("device", "") or "").lower(), *(str(k) for k in target.keys)]
    base = OPENCL_GENERIC
    for name in names:
        if name in _OPENCL_PRESETS:
            base = _OPENCL_PRESETS[name]
            break
    base = _switched(base)
    max_threads = int(target.attrs.get("max_num_threads", base.max_workgroup_size))
    if max_threads < base.max_workgroup_size:
        base = dataclasses.replace(base, max_workgroup_size=max_threads)
    return dataclasses.replace(base, **overrides) if overrides else base
