"""Target presets for the devices codl-tvm deploys to, and how each is linked.

A :class:`TargetPreset` names a TVM target (JSON-dict form, as TVM 0.27 requires) for one kind of
device: the x86 host, aarch64 Android phones, aarch64 Linux boards, and OpenCL GPUs (Adreno, Mali,
a generic OpenCL device, PoCL) with an LLVM host for the CPU side. :func:`get_preset` looks one
up by name; :func:`export_library` writes a compiled model as a shared library for the preset's
device, choosing the link path:

- the host preset links with the system compiler (TVM's default);
- Android presets link with the Android NDK (``tvm.support.ndk.create_shared``) when
  ``TVM_NDK_CC`` names the NDK's clang (e.g. ``.../aarch64-linux-android29-clang``);
- otherwise a cross preset links with clang + lld (``--target=<triple> -fuse-ld=lld -nostdlib
  -Wl,--allow-shlib-undefined``): no sysroot is needed, because every symbol the model library
  uses (libc, the TVM runtime) is resolved when the TVM runtime on the device loads it.

Missing toolchains raise :class:`ToolchainError` naming what to install or set.

Presets for the machine running codl-tvm (``host``, ``opencl``, ``pocl``) compile the CPU side for
this machine's CPU, as ``clang -march=native`` does: LLVM's name for it as ``mcpu`` and its
features as ``mattr`` (:func:`host_cpu`). Without them LLVM emits baseline x86-64 (SSE2) code,
several times slower. :func:`cpu_record` describes the instruction set a CPU target needs (stored
in an artifact's manifest) and :func:`missing_cpu_features` says which of those the machine
running codl-tvm lacks, so a library built for another CPU is refused instead of dying of an
illegal instruction.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
from tvm.support import cc, ndk

from codl_tvm.core.errors import PresetError, ToolchainError
from codl_tvm.runtime.cpu_features import (  # re-exported: their home before runtime
    HostCPU,
    arch_name,
    host_cpu,
    host_isa_features,
    llvm_helper,
    missing_cpu_features,
)

__all__ = [
    "PRESETS",
    "HostCPU",
    "TargetPreset",
    "ToolchainError",
    "check_toolchain",
    "cpu_record",
    "export_library",
    "get_preset",
    "host_cpu",
    "host_cpu_spec",
    "host_isa_features",
    "link_method",
    "missing_cpu_features",
    "preset_names",
]


@dataclass(frozen=True)
class TargetPreset:
    """A named TVM target for one kind of device.

    Attributes
    ----------
    name
        The preset's name (``--target`` on the command line).
    description
        One line for listings.
    cpu
        The LLVM target (JSON-dict form) of the device's CPU; it is also the host of GPU targets.
    gpu
        The OpenCL target (JSON-dict form) of the device's GPU, or ``None`` for CPU-only presets.
    triple
        The LLVM target triple to cross-compile for, or ``None`` for the machine running codl-tvm.
    os
        ``"android"``, ``"linux"`` or ``"host"``: decides the link path.
    native
        The CPU is the machine running codl-tvm: its CPU name and features are detected
        (:func:`host_cpu_spec`) and added to ``cpu`` when a target is made.
    """

    name: str
    description: str
    cpu: dict[str, Any]
    gpu: dict[str, Any] | None = None
    triple: str | None = None
    os: str = "host"
    native: bool = field(default=False, kw_only=True)

    @property
    def is_cross(self) -> bool:
        """Whether the device's CPU differs from the machine running codl-tvm."""
        return self.triple is not None

    @property
    def has_gpu(self) -> bool:
        """Whether the preset has an OpenCL GPU target."""
        return self.gpu is not None

    def cpu_spec(self, mcpu: str | None = None) -> dict[str, Any]:
        """The JSON-dict form of the device's CPU target (``mcpu`` overrides the CPU model;
        a native preset's detected features are then dropped, as they describe another CPU)."""
        if mcpu:
            return {**self.cpu, "mcpu": mcpu}
        spec = dict(self.cpu)
        if self.native:
            spec.update(host_cpu_spec())
        return spec

    def cpu_target(self, mcpu: str | None = None):
        """The ``tvm.target.Target`` of the device's CPU (``mcpu`` overrides the CPU model)."""
        return tvm.target.Target(self.cpu_spec(mcpu))

    def gpu_target(self, mcpu: str | None = None):
        """The OpenCL ``tvm.target.Target`` with the device's CPU as host.

        Raises
        ------
        ValueError
            The preset has no GPU.
        """
        if self.gpu is None:
            raise ValueError(
                f"target preset '{self.name}' has no OpenCL GPU; presets with one: "
                f"{[p.name for p in PRESETS.values() if p.has_gpu]}"
            )
        return tvm.target.Target(dict(self.gpu), host=self.cpu_spec(mcpu))

    def target(self, device: str = "cpu", mcpu: str | None = None):
        """The target to build for ``device`` (``"cpu"`` or ``"opencl"``)."""
        if device == "cpu":
            return self.cpu_target(mcpu)
        if device in ("opencl", "gpu"):
            return self.gpu_target(mcpu)
        raise ValueError(
            f"unknown device {device!r} for target preset '{self.name}'; expected 'cpu' or 'opencl'"
        )


def _arm64(triple: str, mcpu: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": "llvm", "mtriple": triple, "mattr": ["+neon"]}
    if mcpu:
        spec["mcpu"] = mcpu
    return spec


_ANDROID = "aarch64-linux-android"
_LINUX_ARM64 = "aarch64-linux-gnu"


def _android(name: str, description: str, gpu: str | None = None) -> TargetPreset:
    """An aarch64 Android phone, with an OpenCL GPU of kind ``gpu`` if given."""
    return TargetPreset(
        name,
        description,
        cpu=_arm64(_ANDROID),
        gpu={"kind": "opencl", "device": gpu} if gpu else None,
        triple=_ANDROID,
        os="android",
    )


def _linux_arm64(
    name: str, description: str, mcpu: str | None = None, gpu: str | None = None
) -> TargetPreset:
    """An aarch64 Linux board, with an OpenCL GPU of kind ``gpu`` if given."""
    return TargetPreset(
        name,
        description,
        cpu=_arm64(_LINUX_ARM64, mcpu),
        gpu={"kind": "opencl", "device": gpu} if gpu else None,
        triple=_LINUX_ARM64,
        os="linux",
    )


def _pocl_gpu() -> dict[str, Any]:
    """PoCL's CPU OpenCL device: one thread a work-item, so small work-groups."""
    return {
        "kind": "opencl",
        "device": "pocl",
        "max_threads_per_block": 256,
        "max_num_threads": 256,
        "thread_warp_size": 1,
    }


PRESETS: dict[str, TargetPreset] = {
    p.name: p
    for p in (
        TargetPreset(
            "host",
            "the machine running codl-tvm (its CPU as LLVM detects it)",
            cpu={"kind": "llvm"},
            native=True,
        ),
        _android("android-arm64", "aarch64 Android phone CPU (NEON)"),
        _android("android-adreno", "aarch64 Android phone: Adreno GPU (OpenCL) + CPU", "adreno"),
        _android("android-mali", "aarch64 Android phone: Mali GPU (OpenCL) + CPU", "mali"),
        _linux_arm64("linux-arm64", "aarch64 Linux board CPU (NEON), e.g. under qemu-aarch64"),
        _linux_arm64("rpi4", "Raspberry Pi 4 (Cortex-A72, aarch64 Linux)", "cortex-a72"),
        _linux_arm64(
            "linux-arm64-mali",
            "aarch64 Linux board with a Mali GPU (e.g. RK3588)",
            "cortex-a76",
            "mali",
        ),
        TargetPreset(
            "linux-arm64-pocl",
            "aarch64 Linux with PoCL's CPU OpenCL device as the GPU (the emulated aarch64 device)",
            cpu=_arm64(_LINUX_ARM64),
            gpu=_pocl_gpu(),
            triple=_LINUX_ARM64,
            os="linux",
        ),
        TargetPreset(
            "opencl",
            "a generic OpenCL GPU on the host machine",
            cpu={"kind": "llvm"},
            gpu={"kind": "opencl"},
            native=True,
        ),
        TargetPreset(
            "pocl",
            "PoCL's CPU OpenCL device on the host machine (tests, CI)",
            cpu={"kind": "llvm"},
            gpu=_pocl_gpu(),
            native=True,
        ),
        TargetPreset(
            "device-h100",
            "a discrete pair: an NVIDIA H100 (OpenCL) + 16 AVX-512 Xeon cores",
            cpu={"kind": "llvm", "mcpu": "skylake-avx512"},
            gpu={"kind": "opencl", "device": "nvidia"},
        ),
        TargetPreset(
            "emulated-soc",
            "an emulated SoC on a Xeon: PoCL on some of its cores as the GPU, TVM's "
            "AVX-512 CPU kernels on the others",
            cpu={"kind": "llvm", "mcpu": "skylake-avx512"},
            gpu=_pocl_gpu(),
        ),
    )
}


def preset_names() -> list[str]:
    """Names of all target presets, in definition order."""
    return list(PRESETS)


def get_preset(name: str | TargetPreset) -> TargetPreset:
    """The preset called ``name`` (a :class:`TargetPreset` is returned unchanged).

    Raises
    ------
    PresetError
        No preset has that name; the message lists the valid names (a ``KeyError`` too).
    """
    if isinstance(name, TargetPreset):
        return name
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown target preset {name!r}; valid presets: {', '.join(PRESETS)}"
        ) from None


def link_method(preset: TargetPreset) -> str:
    """How :func:`export_library` links for ``preset``: ``"host"``, ``"ndk"`` or ``"clang"``."""
    if not preset.is_cross:
        return "host"
    if preset.os == "android" and os.environ.get("TVM_NDK_CC"):
        return "ndk"
    return "clang"


def _clang_options(triple: str) -> list[str]:
    return [f"--target={triple}", "-fuse-ld=lld", "-nostdlib", "-Wl,--allow-shlib-undefined"]


def check_toolchain(preset: TargetPreset) -> str:
    """Check that the linker for ``preset`` exists; return the link method.

    Raises
    ------
    ToolchainError
        The NDK compiler in ``TVM_NDK_CC`` or clang/lld is missing.
    """
    method = link_method(preset)
    if method == "ndk":
        ndk_cc = os.environ["TVM_NDK_CC"]
        if not (Path(ndk_cc).is_file() or shutil.which(ndk_cc)):
            raise ToolchainError(
                f"TVM_NDK_CC={ndk_cc} does not exist; point it at the NDK's clang "
                "(e.g. .../toolchains/llvm/prebuilt/linux-x86_64/bin/"
                "aarch64-linux-android29-clang) or unset it to use clang + lld"
            )
    elif method == "clang":
        missing = [tool for tool in ("clang", "ld.lld") if shutil.which(tool) is None]
        if missing:
            hint = " or set TVM_NDK_CC to an Android NDK clang" if preset.os == "android" else ""
            raise ToolchainError(
                f"cross-compiling for '{preset.name}' ({preset.triple}) needs clang and lld; "
                f"not found on PATH: {', '.join(missing)} (Debian/Ubuntu: apt-get install clang "
                f"lld{hint})"
            )
    return method


def export_library(executable, path: str | Path, preset: str | TargetPreset) -> Path:
    """Write ``executable`` (from ``tvm.compile``) as a shared library for ``preset``'s device.

    Parameters
    ----------
    executable
        A ``tvm.relax.VMExecutable`` or runtime module with ``export_library``.
    path
        The ``.so`` to write.
    preset
        A preset or its name.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ToolchainError
        The toolchain for the link path is missing, or the link failed.
    """
    preset = get_preset(preset)
    path = Path(path)
    method = check_toolchain(preset)
    if method == "host":
        executable.export_library(str(path))
        return path
    if method == "ndk":
        fcompile = ndk.create_shared
    else:
        fcompile = cc.cross_compiler("clang", options=_clang_options(preset.triple))
    try:
        executable.export_library(str(path), fcompile=fcompile)
    except RuntimeError as exc:
        lines = str(exc).strip().splitlines()
        raise ToolchainError(
            f"linking the model library for '{preset.name}' ({method}) failed: "
            f"{lines[-1] if lines else exc}"
        ) from exc
    return path


# ---------------------------------------------------------------------------------------------
# The CPU of the machine running codl-tvm, and what a CPU target's code needs.


def _cpu_features(spec: dict[str, Any]) -> frozenset[str]:
    """The features LLVM enables for an ``llvm`` target spec (its CPU model and ``mattr``)."""
    return frozenset(
        str(f) for f in llvm_helper("target.llvm_get_cpu_features")(tvm.target.Target(spec))
    )


def host_cpu_spec() -> dict[str, Any]:
    """The LLVM target (JSON-dict form) of this machine's CPU (a new dict on every call).

    ``mcpu`` is LLVM's name for the CPU; ``mattr`` corrects what that name implies to what the
    CPU really has: features the model lacks here are turned off (hypervisors hide some, e.g.
    ``-pku``) and features beyond it turned on. A CPU LLVM does not know (``"generic"``) gets
    no ``mcpu`` and all its features in ``mattr``.
    """
    spec = _host_cpu_spec()
    return {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}


@functools.cache
def _host_cpu_spec() -> dict[str, Any]:
    cpu = host_cpu()
    spec: dict[str, Any] = {"kind": "llvm"}
    if cpu.name != "generic":
        spec["mcpu"] = cpu.name
    implied = _cpu_features(spec)
    mattr = sorted(f"+{f}" for f in cpu.features - implied)
    mattr += sorted(f"-{f}" for f in implied & cpu.absent)
    if mattr:
        spec["mattr"] = tuple(mattr)  # cached: immutable
    return spec


# Features that change the instructions LLVM emits for a model's kernels. System features
# (pku, shstk, wbnoinvd, rdpru, ...) never appear in them, and hypervisors often hide them, so a
# CPU lacking one of those still runs the library: they are left out of the check.
_ISA_FEATURE = {
    "x86_64": re.compile(
        r"^(sse|ssse3|avx|fma|f16c|bmi|lzcnt|popcnt|movbe|aes|vaes|pclmul|vpclmulqdq|gfni|sha|"
        r"adx|amx|xop|tbm|cx16|cmov|crc32|sahf|prfchw|evex512|sm3|sm4)"
    ),
    "aarch64": re.compile(
        r"^(neon|fp-armv8|crypto|aes|sha2|sha3|sm4|crc|dotprod|fullfp16|fp16fml|i8mm|bf16|sve|"
        r"sme|lse|rcpc|jsconv|complxnum|rdm)"
    ),
}


def cpu_record(target) -> dict[str, Any]:
    """What a CPU target's code needs, for an artifact's manifest.

    Parameters
    ----------
    target
        An ``llvm`` ``tvm.target.Target``.

    Returns
    -------
    dict
        ``{"name": mcpu or "generic", "arch": "x86_64" | "aarch64" | ..., "features": [...]}``:
        the instruction-set features the target enables (sorted LLVM names).
    """
    spec = dict(target.export())
    triple = str(spec.get("mtriple") or "")
    arch = arch_name(triple.split("-", 1)[0]) if triple else arch_name(platform.machine())
    enabled = _cpu_features({k: spec[k] for k in ("kind", "mtriple", "mcpu", "mattr") if k in spec})
    pattern = _ISA_FEATURE.get(arch)
    isa = sorted(f for f in enabled if pattern is None or pattern.match(f))
    return {"name": str(spec.get("mcpu") or "generic"), "arch": arch, "features": isa}
