"""dlight-style schedule rules for CPU (llvm) and OpenCL targets.

Run after ``LegalizeOps`` + ``FuseOps`` + ``FuseTIR`` (NCHW PrimFuncs, padding as a separate
block, elementwise epilogues fused after the reduction), under ``with target:``:

.. code-block:: python

    from codl_tvm.schedules import apply_schedules

    with target:
        mod = apply_schedules(target)(mod)

``schedule_rules(target)`` lists the rules in order. Every rule gates on the PrimFunc's own
target (its ``target`` attribute, else the current target), so one list serves a heterogeneous
module: for an OpenCL build it holds the OpenCL rules, then the CPU rules (for PrimFuncs placed
on the host CPU), then dlight's GPU rules as a fallback. Scheduled kernels carry ``codl.*``
attributes (algorithm, preset, parallel extent, vector width, workgroup size and count; see
:mod:`codl_tvm.schedules.common`); :func:`explain` tells why rules declined a PrimFunc.
Winograd convs (:mod:`codl_tvm.schedules.winograd`) and channel-packed CPU convs
(:mod:`codl_tvm.schedules.packed`) are chosen before legalization by
``codl_tvm.passes.winograd.Conv2DWinograd``; their rules follow the direct conv rules and come
before every generic rule.

Build-wide switches (Winograd, packed convs, CPU-alone settings, codl's dense rule, preset
field overrides) travel as one :class:`~codl_tvm.schedules.settings.ScheduleSettings` object:
``schedule_rules(target, settings=...)`` hands it to every rule. The context managers
(:func:`winograd_enabled`, :func:`packed_enabled`, ...) set the settings in effect, which
:func:`current_settings` returns and the build pipeline reads once. Configs are in
:mod:`~codl_tvm.schedules.config`, presets in :mod:`~codl_tvm.schedules.presets`.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target import Target

from .common import CodlRule, RecordedRule, choose_row_width, kernel_features
from .config import CPUConfig, OpenCLConfig
from .cpu import CPUConv2D, CPUInjective, CPUReduction, conv2d_algorithm
from .opencl import OpenCLConv2D, OpenCLPool2D
from .opencl_dense import OpenCLDense
from .packed import CPUPackedConv2D, pack_weight, packed_conv2d, packed_reason
from .presets import (
    ADRENO,
    AVX2,
    AVX512,
    MALI,
    NEON,
    NVIDIA,
    OPENCL_GENERIC,
    POCL,
    SSE,
)
from .settings import (
    ScheduleSettings,
    cpu_alone_settings,
    cpu_config,
    cpu_overrides,
    current_settings,
    dense_enabled,
    opencl_config,
    opencl_overrides,
    packed_enabled,
    use_settings,
    winograd_enabled,
)
from .winograd import (
    CPUWinograd,
    OpenCLWinograd,
    conv2d_shape_info,
    match_winograd,
    select_conv2d_algorithm,
    transform_weight,
    winograd_conv2d,
    winograd_reason,
)

__all__ = [
    "ADRENO",
    "AVX2",
    "AVX512",
    "MALI",
    "NEON",
    "NVIDIA",
    "OPENCL_GENERIC",
    "POCL",
    "SSE",
    "CPUConfig",
    "CPUConv2D",
    "CPUInjective",
    "CPUPackedConv2D",
    "CPUReduction",
    "CPUWinograd",
    "CodlRule",
    "OpenCLConfig",
    "OpenCLConv2D",
    "OpenCLDense",
    "OpenCLPool2D",
    "OpenCLWinograd",
    "RecordedRule",
    "ScheduleSettings",
    "apply_schedules",
    "choose_row_width",
    "conv2d_algorithm",
    "conv2d_shape_info",
    "cpu_alone_settings",
    "cpu_config",
    "cpu_overrides",
    "current_settings",
    "dense_enabled",
    "explain",
    "kernel_features",
    "match_winograd",
    "opencl_config",
    "opencl_overrides",
    "pack_weight",
    "packed_conv2d",
    "packed_enabled",
    "packed_reason",
    "schedule_rules",
    "select_conv2d_algorithm",
    "transform_weight",
    "use_settings",
    "winograd_conv2d",
    "winograd_enabled",
    "winograd_reason",
]


def _cpu_rules(config: CPUConfig | None, settings: ScheduleSettings) -> list[ScheduleRule]:
    # CPUWinograd, CPUPackedConv2D and CPUConv2D match disjoint functions (a Winograd conv has
    # three reduction blocks, a packed conv a 5-D weight; the rules recognise their own block
    # annotations), so their order does not matter.
    return [
        CPUConv2D(config, settings),
        CPUWinograd(config, settings),
        CPUPackedConv2D(config, settings),
        CPUReduction(config, settings),
        CPUInjective(config, settings),
    ]


def _gpu_rules(config: OpenCLConfig | None, settings: ScheduleSettings) -> list[ScheduleRule]:
    return [
        OpenCLConv2D(config, settings),
        OpenCLWinograd(config, settings),
        OpenCLPool2D(config, settings),
        OpenCLDense(config, settings),
        RecordedRule(dl.gpu.Matmul(), "matmul"),
        RecordedRule(dl.gpu.GEMV(), "gemv", check_lowering=True),
        RecordedRule(dl.gpu.Reduction(), "reduction", check_lowering=True),
        RecordedRule(dl.gpu.GeneralReduction(), "reduction", check_lowering=True),
        RecordedRule(dl.gpu.Fallback(), "fallback"),
    ]


def schedule_rules(
    target: Target,
    cpu: CPUConfig | None = None,
    opencl: OpenCLConfig | None = None,
    settings: ScheduleSettings | None = None,
) -> list[ScheduleRule]:
    """The rules to apply for a build target, most specific first.

    Parameters
    ----------
    target : Target
        The build target: kind ``llvm`` (CPU only) or ``opencl`` (with an llvm host).
    cpu, opencl : CPUConfig | OpenCLConfig | None
        Fixed presets; by default each rule picks the preset of the PrimFunc's own target.
    settings : ScheduleSettings | None
        The build's switches, given to every rule; None: :func:`current_settings`, read here.

    Returns
    -------
    list[ScheduleRule]
    """
    settings = current_settings() if settings is None else settings
    kind = target.kind.name
    if kind == "llvm":
        return _cpu_rules(cpu, settings)
    if kind == "opencl":
        return [*_gpu_rules(opencl, settings), *_cpu_rules(cpu, settings)]
    raise ValueError(f"codl_tvm.schedules has rules for llvm and opencl targets, not {kind!r}")


def apply_schedules(
    target: Target,
    cpu: CPUConfig | None = None,
    opencl: OpenCLConfig | None = None,
    settings: ScheduleSettings | None = None,
) -> tvm.ir.transform.Pass:
    """A dlight ``ApplyDefaultSchedule`` pass with :func:`schedule_rules`; run under ``target``."""
    return dl.ApplyDefaultSchedule(*schedule_rules(target, cpu, opencl, settings))


def explain(
    func: tvm.tirx.PrimFunc, target: Target, settings: ScheduleSettings | None = None
) -> dict[str, str | None]:
    """For each codl rule of ``target``, why it declines ``func`` (None where it applies)."""
    return {
        type(rule).__name__: rule.explain(func, target)
        for rule in schedule_rules(target, settings=settings)
        if isinstance(rule, CodlRule)
    }
