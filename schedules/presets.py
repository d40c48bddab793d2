"""Named schedule presets and the choice of preset for a target.

This module owns the preset instances of :class:`~codl_tvm.schedules.config.CPUConfig` (one per
CPU vector ISA) and :class:`~codl_tvm.schedules.config.OpenCLConfig` (one per OpenCL device
class), the tables of what builds for the CPU alone switch on, and :func:`cpu_preset` /
:func:`opencl_preset`, which pick a preset from a :class:`tvm.target.Target`:

- CPU (kind ``llvm``): keys containing ``arm_cpu`` give :data:`NEON` (128-bit, 32 registers).
  Otherwise the x86 preset follows ``mcpu``/``mattr``: AVX-512 (512-bit, 32 registers), AVX2
  (256-bit, 16 registers) or, for the plain ``llvm`` target, which LLVM compiles for generic
  x86-64, :data:`SSE` (128-bit, 16 registers).
- OpenCL (kind ``opencl``): the ``device`` attribute or a target key names the device class
  (``adreno``, ``mali``, ``nvidia``, ``pocl``); anything else gets :data:`OPENCL_GENERIC`.

The measurements behind the non-default numbers are in docs/benchmarks.md ("Schedule preset
defaults"); the comments here keep only the reason for each choice.
"""

from __future__ import annotations

from tvm.target import Target

from .config import CPUConfig, OpenCLConfig

__all__ = [
    "ADRENO",
    "AVX2",
    "AVX512",
    "CPU_ALONE_SETTINGS",
    "CPU_PRESETS",
    "MALI",
    "NEON",
    "NVIDIA",
    "OPENCL_GENERIC",
    "OPENCL_PRESETS",
    "PACKED_CPU_ALONE",
    "POCL",
    "SSE",
    "WINOGRAD_CANDIDATES",
    "WINOGRAD_CPU_ALONE",
    "cpu_preset",
    "opencl_preset",
]

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
# 16 channels x 1 row beat 8x2, 4x2, 4x4 and 8x1 on CoDL's conv shapes on a skylake-avx512 Xeon,
# except where 16 channels of weights no longer fit in L2 (see max_weight_tile_bytes).
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
# Convs with too few work-items for an H100's 132 SMs split their input channels (split-K)
# rather than shrink the register tiles. Each choice was measured faster on the H100, one change
# at a time (docs/benchmarks.md).
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
# CPU-style register tile: 16 output channels x one vector of up to 16 columns (AVX-512 on a
# skylake-avx512 Xeon; LLVM splits it on narrower CPUs), 4 rows per workgroup.
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
    # reads the [K, N] weight as 16-wide vectors; batch-1 dense ran several times faster than
    # dlight's GEMV on PoCL (VGG's fc6 about 12x).
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

#: The CPU presets by name.
CPU_PRESETS: dict[str, CPUConfig] = {c.name: c for c in (SSE, AVX2, AVX512, NEON)}
#: The OpenCL presets by device class (the generic preset is the fallback, not listed).
OPENCL_PRESETS: dict[str, OpenCLConfig] = {
    "adreno": ADRENO,
    "mali": MALI,
    "nvidia": NVIDIA,
    "pocl": POCL,
}

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

#: Presets that turn Winograd on inside ``winograd_enabled()`` (the generic targets stay off).
WINOGRAD_CANDIDATES = ("avx2", "avx512", "neon", "pocl", "nvidia", "adreno", "mali")
#: CPU presets whose builds for the CPU alone use Winograd by default (``codl-tvm compile``
#: without ``--winograd``/``--no-winograd``): measured faster on whole models there. Co-executed
#: CPU parts use it too where the cost model has Winograd data (``codl-tvm profile --winograd``;
#: the shipped emulated-soc model has).
WINOGRAD_CPU_ALONE = ("avx512",)
#: CPU presets whose builds for the CPU alone use channel-packed convs by default
#: (``codl-tvm compile`` without ``--packed``/``--no-packed``). Co-executed CPU parts use them
#: too where the cost model has packed data (the shipped emulated-soc model has).
PACKED_CPU_ALONE = ("avx512",)

#: CPUConfig fields that builds for the CPU alone set on top of a preset, where they measured
#: faster on whole models (AVX-512: a skylake-avx512 Xeon, 8 threads; each setting against the
#: ones before it, docs/benchmarks.md). Co-executed CPU parts keep the preset's values, the
#: kernels the cost models were profiled with, until a campaign measures these.
CPU_ALONE_SETTINGS: dict[str, dict[str, object]] = {
    "avx512": {
        # every 1x1 conv from 128 input channels packed, in 256 KiB pixel chunks
        "packed_chunk_bytes": 256 * 1024,
        "packed_max_gemm_pixels": 1 << 30,
        "packed_min_gemm_channels": 128,
        # other convs packed by reduction length, strided ones (stems) whatever their channels
        "packed_min_reduction": 128,
        "packed_strided": True,
        # strided packed convs read an NHWC copy (for stride-1 ones it slowed deep small maps)
        "packed_nhwc_input": 1,
        "packed_exact_tiles": True,
        # 16-64-channel 3x3 convs ran faster packed, except on large maps
        "winograd_min_channels": 128,
        "winograd_wide_tiles": 400,
    },
}


def cpu_preset(target: Target) -> CPUConfig:
    """The CPU preset of an ``llvm`` target, as it stands (no settings applied).

    Parameters
    ----------
    target : Target
        A target of kind ``llvm``.

    Returns
    -------
    CPUConfig
    """
    if target.kind.name != "llvm":
        raise ValueError(f"cpu_config needs an llvm target, got kind {target.kind.name!r}")
    mcpu = str(target.attrs.get("mcpu", "") or "").lower()
    mattr = [str(a).lower() for a in (target.attrs.get("mattr", None) or [])]
    if "arm_cpu" in target.keys:
        return NEON
    if mcpu in _X86_AVX512_CPUS or any(a.startswith("+avx512f") for a in mattr):
        return AVX512
    if mcpu in _X86_AVX2_CPUS or "+avx2" in mattr:
        return AVX2
    return SSE


def opencl_preset(target: Target) -> OpenCLConfig:
    """The OpenCL preset of a target's device class, as it stands (no settings applied).

    Parameters
    ----------
    target : Target
        A target of kind ``opencl``; its ``device`` attribute or keys name the device class.

    Returns
    -------
    OpenCLConfig
    """
    if target.kind.name != "opencl":
        raise ValueError(f"opencl_config needs an opencl target, got kind {target.kind.name!r}")
    names = [str(target.attrs.get("device", "") or "").lower(), *(str(k) for k in target.keys)]
    for name in names:
        if name in OPENCL_PRESETS:
            return OPENCL_PRESETS[name]
    return OPENCL_GENERIC
