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
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codl_tvm.errors import PresetError, ToolchainError

__all__ = [
    "PRESETS",
    "TargetPreset",
    "ToolchainError",
    "check_toolchain",
    "export_library",
    "get_preset",
    "link_method",
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
    """

    name: str
    description: str
    cpu: dict[str, Any]
    gpu: dict[str, Any] | None = None
    triple: str | None = None
    os: str = "host"

    @property
    def is_cross(self) -> bool:
        """Whether the device's CPU differs from the machine running codl-tvm."""
        return self.triple is not None

    @property
    def has_gpu(self) -> bool:
        """Whether the preset has an OpenCL GPU target."""
        return self.gpu is not None

    def cpu_target(self, mcpu: str | None = None):
        """The ``tvm.target.Target`` of the device's CPU (``mcpu`` overrides the CPU model)."""
        import tvm

        spec = dict(self.cpu)
        if mcpu:
            spec["mcpu"] = mcpu
        return tvm.target.Target(spec)

    def gpu_target(self, mcpu: str | None = None):
        """The OpenCL ``tvm.target.Target`` with the device's CPU as host.

        Raises
        ------
        ValueError
            The preset has no GPU.
        """
        import tvm

        if self.gpu is None:
            raise ValueError(
                f"target preset '{self.name}' has no OpenCL GPU; presets with one: "
                f"{[p.name for p in PRESETS.values() if p.has_gpu]}"
            )
        host = dict(self.cpu)
        if mcpu:
            host["mcpu"] = mcpu
        return tvm.target.Target(dict(self.gpu), host=host)

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

PRESETS: dict[str, TargetPreset] = {
    p.name: p
    for p in (
        TargetPreset(
            "host",
            "the machine running codl-tvm (x86-64 or whatever LLVM detects)",
            cpu={"kind": "llvm"},
        ),
        TargetPreset(
            "android-arm64",
            "aarch64 Android phone CPU (NEON)",
            cpu=_arm64(_ANDROID),
            triple=_ANDROID,
            os="android",
        ),
        TargetPreset(
            "android-adreno",
            "aarch64 Android phone: Adreno GPU (OpenCL) + CPU",
            cpu=_arm64(_ANDROID),
            gpu={"kind": "opencl", "device": "adreno"},
            triple=_ANDROID,
            os="android",
        ),
        TargetPreset(
            "android-mali",
            "aarch64 Android phone: Mali GPU (OpenCL) + CPU",
            cpu=_arm64(_ANDROID),
            gpu={"kind": "opencl", "device": "mali"},
            triple=_ANDROID,
            os="android",
        ),
        TargetPreset(
            "linux-arm64",
            "aarch64 Linux board CPU (NEON), e.g. under qemu-aarch64",
            cpu=_arm64(_LINUX_ARM64),
            triple=_LINUX_ARM64,
            os="linux",
        ),
        TargetPreset(
            "rpi4",
            "Raspberry Pi 4 (Cortex-A72, aarch64 Linux)",
            cpu=_arm64(_LINUX_ARM64, "cortex-a72"),
            triple=_LINUX_ARM64,
            os="linux",
        ),
        TargetPreset(
            "linux-arm64-mali",
            "aarch64 Linux board with a Mali GPU (e.g. RK3588)",
            cpu=_arm64(_LINUX_ARM64, "cortex-a76"),
            gpu={"kind": "opencl", "device": "mali"},
            triple=_LINUX_ARM64,
            os="linux",
        ),
        TargetPreset(
            "opencl",
            "a generic OpenCL GPU on the host machine",
            cpu={"kind": "llvm"},
            gpu={"kind": "opencl"},
        ),
        TargetPreset(
            "pocl",
            "PoCL's CPU OpenCL device on the host machine (tests, CI)",
            cpu={"kind": "llvm"},
            gpu={
                "kind": "opencl",
                "device": "pocl",
                "max_threads_per_block": 256,
                "max_num_threads": 256,
                "thread_warp_size": 1,
            },
        ),
        TargetPreset(
            "device-h100",
            "the device machine's discrete pair: NVIDIA H100 (OpenCL) + 16 AVX-512 Xeon cores",
            cpu={"kind": "llvm", "mcpu": "skylake-avx512"},
            gpu={"kind": "opencl", "device": "nvidia"},
        ),
        TargetPreset(
            "emulated-soc",
            "the device machine's emulated SoC: PoCL on some Xeon cores as the GPU, TVM's "
            "AVX-512 CPU kernels on the others",
            cpu={"kind": "llvm", "mcpu": "skylake-avx512"},
            gpu={
                "kind": "opencl",
                "device": "pocl",
                "max_threads_per_block": 256,
                "max_num_threads": 256,
                "thread_warp_size": 1,
            },
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
        cc = os.environ["TVM_NDK_CC"]
        if not (Path(cc).is_file() or shutil.which(cc)):
            raise ToolchainError(
                f"TVM_NDK_CC={cc} does not exist; point it at the NDK's clang "
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
        from tvm.support import ndk

        fcompile = ndk.create_shared
    else:
        from tvm.support import cc

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
