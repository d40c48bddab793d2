"""Build-wide schedule settings as one explicit object, and the config a target gets under them.

This module owns :class:`ScheduleSettings` (which presets use Winograd or channel-packed convs,
whether the CPU-alone settings and codl's OpenCL dense rule are on, and field overrides of every
CPU / OpenCL preset) and the resolution of a target's config under it: :func:`cpu_config` and
:func:`opencl_config` take the preset of the target (:mod:`codl_tvm.schedules.presets`) and
apply the settings.

How settings reach the rules: explicitly. :func:`~codl_tvm.schedules.schedule_rules`,
:func:`~codl_tvm.schedules.apply_schedules`, every rule's constructor and
:class:`~codl_tvm.passes.winograd.Conv2DWinograd` take a ``settings`` argument; the build
pipeline (:mod:`codl_tvm.build.pipeline`) reads the settings once when it runs and passes the
same object to its algorithm and schedule phases, and a rule resolves its configs from the
object it was given. TVM's ``PassContext`` config was not an option: its keys must be
registered in C++ (``TVM_REGISTER_PASS_CONFIG_OPTION``), which Python cannot do in TVM 0.27.

For callers that switch settings around a whole build (the CLI, the profiler, tests), the
context managers :func:`winograd_enabled`, :func:`packed_enabled`, :func:`cpu_alone_settings`,
:func:`dense_enabled`, :func:`cpu_overrides` and :func:`opencl_overrides` (and
:func:`use_settings` for a whole object) set the settings in effect inside the block, which
:func:`current_settings` returns. That is the one ambient value left; it is read where a
pipeline, a rule list or a pass is built without explicit settings, never by a rule's
``apply``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tvm.target import Target

from .config import CPUConfig, OpenCLConfig
from .presets import (
    CPU_ALONE_SETTINGS,
    CPU_PRESETS,
    OPENCL_GENERIC,
    OPENCL_PRESETS,
    PACKED_CPU_ALONE,
    WINOGRAD_CANDIDATES,
    cpu_preset,
    opencl_preset,
)

__all__ = [
    "ScheduleSettings",
    "cpu_alone_on",
    "cpu_alone_settings",
    "cpu_config",
    "cpu_overrides",
    "current_settings",
    "dense_enabled",
    "opencl_config",
    "opencl_overrides",
    "packed_enabled",
    "packed_presets",
    "use_settings",
    "winograd_enabled",
    "winograd_presets",
]

Overrides = tuple[tuple[str, object], ...]


def preset_names(what: str, presets: Iterable[str] | str, cpu_only: bool = False) -> frozenset:
    """Preset names checked against the known presets (``"all"``: every one).

    Raises
    ------
    ValueError
        An unknown name; the message starts with ``what``.
    """
    known = set(CPU_PRESETS) if cpu_only else {*CPU_PRESETS, OPENCL_GENERIC.name, *OPENCL_PRESETS}
    names = frozenset(known if presets == "all" else presets)
    unknown = sorted(names - known)
    if unknown:
        raise ValueError(f"{what}: unknown presets {unknown}; known: {sorted(known)}")
    return names


def override_fields(what: str, config: type, fields: dict[str, object]) -> Overrides:
    """``fields`` as an overrides tuple, checked against ``config``'s dataclass fields.

    Raises
    ------
    ValueError
        A name that is not a field of ``config``; the message starts with ``what``.
    """
    names = {f.name for f in dataclasses.fields(config)} - {"name"}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"{what}: {unknown} not {config.__name__} fields (have {sorted(names)})")
    return tuple(fields.items())


@dataclass(frozen=True)
class ScheduleSettings:
    """The switches one build applies on top of the presets.

    Attributes
    ----------
    winograd : frozenset[str]
        Presets whose configs get ``winograd=True`` (each with its own ``winograd_tile``).
    packed : frozenset[str]
        CPU presets whose configs get ``conv_packed=True``.
    cpu_alone : bool
        CPU presets get their :data:`~codl_tvm.schedules.presets.CPU_ALONE_SETTINGS` (builds
        of a whole model for the CPU alone).
    dense : bool
        OpenCL presets get ``dense=True`` (codl's dense rule instead of dlight's).
    cpu_overrides, opencl_overrides : tuple[tuple[str, object], ...]
        ``(field, value)`` pairs replaced in every CPU / OpenCL preset, after the switches.
    """

    winograd: frozenset[str] = frozenset()
    packed: frozenset[str] = frozenset()
    cpu_alone: bool = False
    dense: bool = False
    cpu_overrides: Overrides = ()
    opencl_overrides: Overrides = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "winograd", preset_names("winograd", self.winograd))
        object.__setattr__(self, "packed", preset_names("packed", self.packed, cpu_only=True))
        cpu = override_fields("cpu_overrides", CPUConfig, dict(self.cpu_overrides))
        opencl = override_fields("opencl_overrides", OpenCLConfig, dict(self.opencl_overrides))
        object.__setattr__(self, "cpu_overrides", cpu)
        object.__setattr__(self, "opencl_overrides", opencl)

    def cpu(self, preset: CPUConfig) -> CPUConfig:
        """``preset`` with these settings applied."""
        if preset.name in self.winograd and not preset.winograd:
            preset = dataclasses.replace(preset, winograd=True)
        if preset.name in self.packed and not preset.conv_packed:
            preset = dataclasses.replace(preset, conv_packed=True)
        if self.cpu_alone and preset.name in CPU_ALONE_SETTINGS:
            preset = dataclasses.replace(preset, **CPU_ALONE_SETTINGS[preset.name])
        if self.cpu_overrides:
            preset = dataclasses.replace(preset, **dict(self.cpu_overrides))
        return preset

    def opencl(self, preset: OpenCLConfig, max_workgroup_size: int | None = None) -> OpenCLConfig:
        """``preset`` with these settings applied; ``max_workgroup_size`` (the target's
        ``max_num_threads``) caps the preset's before the overrides."""
        if preset.name in self.winograd and not preset.winograd:
            preset = dataclasses.replace(preset, winograd=True)
        if self.dense and not preset.dense:
            preset = dataclasses.replace(preset, dense=True)
        if self.opencl_overrides:
            preset = dataclasses.replace(preset, **dict(self.opencl_overrides))
        if max_workgroup_size is not None and max_workgroup_size < preset.max_workgroup_size:
            preset = dataclasses.replace(preset, max_workgroup_size=max_workgroup_size)
        return preset


_CURRENT: contextvars.ContextVar[ScheduleSettings] = contextvars.ContextVar(
    "codl_schedule_settings", default=ScheduleSettings()
)


def current_settings() -> ScheduleSettings:
    """The settings in effect here (those of the innermost settings block; none: defaults)."""
    return _CURRENT.get()


@contextlib.contextmanager
def use_settings(settings: ScheduleSettings) -> Iterator[ScheduleSettings]:
    """Within the block, :func:`current_settings` returns ``settings``."""
    token = _CURRENT.set(settings)
    try:
        yield settings
    finally:
        _CURRENT.reset(token)


def _with(**changes) -> contextlib.AbstractContextManager[ScheduleSettings]:
    return use_settings(dataclasses.replace(current_settings(), **changes))


def winograd_enabled(
    presets: Iterable[str] | str = WINOGRAD_CANDIDATES,
) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`cpu_config` / :func:`opencl_config` return the named presets
    with ``winograd=True`` (each with its own ``winograd_tile``).

    Winograd is off in every preset; this is the switch for builds that want it
    (``codl-tvm compile --winograd``) and for tests.

    Parameters
    ----------
    presets : Iterable[str] | str
        Preset names (:data:`~codl_tvm.schedules.presets.WINOGRAD_CANDIDATES` by default), or
        ``"all"`` (the generic ``sse`` and ``opencl-generic`` presets too).
    """
    return _with(winograd=preset_names("winograd_enabled", presets))


def packed_enabled(
    presets: Iterable[str] | str = PACKED_CPU_ALONE,
) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`cpu_config` returns the named CPU presets with
    ``conv_packed=True`` (channel-packed convs, :mod:`codl_tvm.schedules.packed`).

    Parameters
    ----------
    presets : Iterable[str] | str
        CPU preset names (:data:`~codl_tvm.schedules.presets.PACKED_CPU_ALONE` by default), or
        ``"all"``.
    """
    return _with(packed=preset_names("packed_enabled", presets, cpu_only=True))


def cpu_alone_settings(on: bool = True) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`cpu_config` returns CPU presets with their
    :data:`~codl_tvm.schedules.presets.CPU_ALONE_SETTINGS` (builds of a whole model for the
    CPU alone)."""
    return _with(cpu_alone=bool(on))


def dense_enabled(on: bool = True) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`opencl_config` returns presets with ``dense=on`` (codl's OpenCL
    dense rule instead of dlight's); off by default except in the PoCL preset."""
    return _with(dense=bool(on))


def cpu_overrides(**fields) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`cpu_config` returns every CPU preset with ``fields`` replaced.

    For builds that compare one schedule parameter across whole models (A/B benchmarks,
    ``scripts/bench_cpu_models.py compile --cpu-config``) without a custom rule list.

    Parameters
    ----------
    **fields
        :class:`~codl_tvm.schedules.config.CPUConfig` fields and values (e.g.
        ``conv1x1_pad_pixels=False``).

    Raises
    ------
    ValueError
        A name that is not a :class:`~codl_tvm.schedules.config.CPUConfig` field.
    """
    return _with(cpu_overrides=override_fields("cpu_overrides", CPUConfig, fields))


def opencl_overrides(**fields) -> contextlib.AbstractContextManager[ScheduleSettings]:
    """Within the block, :func:`opencl_config` returns every OpenCL preset with ``fields``
    replaced: to rebuild a part as a campaign built it under earlier preset settings (the cost
    model reads the kernels of recorded parts, ``cost_model.kernel_counts``).

    Raises
    ------
    ValueError
        A name that is not an :class:`~codl_tvm.schedules.config.OpenCLConfig` field.
    """
    return _with(opencl_overrides=override_fields("opencl_overrides", OpenCLConfig, fields))


def winograd_presets() -> frozenset[str]:
    """The presets :func:`winograd_enabled` switched on here (empty outside such a block)."""
    return current_settings().winograd


def packed_presets() -> frozenset[str]:
    """The presets :func:`packed_enabled` switched on here (empty outside such a block)."""
    return current_settings().packed


def cpu_alone_on() -> bool:
    """Whether a :func:`cpu_alone_settings` block is on here."""
    return current_settings().cpu_alone


def cpu_config(target: Target, settings: ScheduleSettings | None = None, **overrides) -> CPUConfig:
    """The CPU preset for an ``llvm`` target under ``settings``, with optional field overrides.

    Parameters
    ----------
    target : Target
        A target of kind ``llvm``.
    settings : ScheduleSettings | None
        The build's settings; None: :func:`current_settings`.
    **overrides
        Fields of :class:`~codl_tvm.schedules.config.CPUConfig` to replace (e.g.
        ``conv_oc_tile=4``).

    Returns
    -------
    CPUConfig
    """
    settings = current_settings() if settings is None else settings
    config = settings.cpu(cpu_preset(target))
    return dataclasses.replace(config, **overrides) if overrides else config


def opencl_config(
    target: Target, settings: ScheduleSettings | None = None, **overrides
) -> OpenCLConfig:
    """The OpenCL preset for a target's device class under ``settings``, with optional field
    overrides.

    Parameters
    ----------
    target : Target
        A target of kind ``opencl``; its ``device`` attribute or keys name the device class.
    settings : ScheduleSettings | None
        The build's settings; None: :func:`current_settings`.
    **overrides
        Fields of :class:`~codl_tvm.schedules.config.OpenCLConfig` to replace.

    Returns
    -------
    OpenCLConfig
    """
    settings = current_settings() if settings is None else settings
    preset = opencl_preset(target)
    max_threads = target.attrs.get("max_num_threads", None)
    config = settings.opencl(preset, None if max_threads is None else int(max_threads))
    return dataclasses.replace(config, **overrides) if overrides else config
