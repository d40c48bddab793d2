"""The CPU of the machine running codl-tvm, and whether it can run code made for another.

An artifact's manifest records the instruction-set features its CPU code was compiled for
(:func:`codl_tvm.build.targets.cpu_record`); loading it checks them against this machine
(:func:`missing_cpu_features`) instead of dying of an illegal instruction. The check runs where
TVM is runtime-only too (a phone, a board): it asks LLVM where TVM's compiler is here and reads
``/proc/cpuinfo`` where it is not.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm

from codl_tvm.core.errors import ToolchainError

__all__ = [
    "HostCPU",
    "arch_name",
    "cpuinfo_features",
    "host_cpu",
    "host_isa_features",
    "llvm_helper",
    "missing_cpu_features",
]


@dataclass(frozen=True)
class HostCPU:
    """The CPU of the machine running codl-tvm, as LLVM sees it.

    Attributes
    ----------
    name
        LLVM's name for it (``"znver4"``, ``"skylake-avx512"``); ``"generic"`` when LLVM does not
        know the model (a new CPU, or a hypervisor hiding it).
    features
        The features LLVM detected as present (LLVM's names: ``"avx2"``, ``"avx512f"``).
    absent
        The features LLVM detected as absent.
    """

    name: str
    features: frozenset[str]
    absent: frozenset[str]


def llvm_helper(name: str):
    """An LLVM helper of TVM's compiler library, or None (runtime-only TVM has none)."""
    return tvm.get_global_func(name, allow_missing=True)


@functools.cache
def host_cpu() -> HostCPU:
    """The CPU of this machine (LLVM's host detection, as ``clang -march=native``).

    Raises
    ------
    ToolchainError
        TVM runs without its compiler (no LLVM to ask).
    """
    get_name = llvm_helper("tvm.codegen.llvm.GetHostCPUName") or llvm_helper(
        "target.llvm_get_system_cpu"
    )
    get_features = llvm_helper("tvm.codegen.llvm.GetHostCPUFeatures")
    if get_name is None or get_features is None:
        raise ToolchainError(
            "detecting this machine's CPU needs TVM's LLVM compiler library (TVM runs "
            "runtime-only here)"
        )
    found = {str(k): bool(v) for k, v in dict(get_features()).items()}
    return HostCPU(
        name=str(get_name() or "generic"),
        features=frozenset(k for k, v in found.items() if v),
        absent=frozenset(k for k, v in found.items() if not v),
    )


_ARCH_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}


def arch_name(name: str) -> str:
    """The canonical name of a CPU architecture (``amd64`` and ``x86-64`` are ``x86_64``)."""
    return _ARCH_ALIASES.get(name.lower(), name.lower())


# /proc/cpuinfo flag -> LLVM feature, where the names differ (runtime-only TVM has no LLVM).
_CPUINFO_TO_LLVM = {
    "pni": "sse3",
    "sse4_1": "sse4.1",
    "sse4_2": "sse4.2",
    "pclmulqdq": "pclmul",
    "bmi1": "bmi",
    "abm": "lzcnt",
    "sha_ni": "sha",
    "lahf_lm": "sahf",
    "3dnowprefetch": "prfchw",
    "avx_vnni": "avxvnni",
    "amx_bf16": "amx-bf16",
    "amx_tile": "amx-tile",
    "amx_int8": "amx-int8",
    "asimd": "neon",
    "fp": "fp-armv8",
    "asimddp": "dotprod",
    "fphp": "fullfp16",
    "asimdfhm": "fp16fml",
    "atomics": "lse",
    "crc32": "crc",
    "asimdrdm": "rdm",
    "lrcpc": "rcpc",
    "jscvt": "jsconv",
    "fcma": "complxnum",
}


def cpuinfo_features(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(present, known)`` ISA features (LLVM names) from ``/proc/cpuinfo``'s text: the flags
    of the first CPU, and every feature the file can tell about (flags it names when present)."""
    flags: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = value.split()
            break
    present = set()
    for flag in flags:
        name = _CPUINFO_TO_LLVM.get(flag, flag)
        if name.startswith("avx512_"):
            name = "avx512" + name[len("avx512_") :]
        present.add(name)
    known = present | set(_CPUINFO_TO_LLVM.values())
    known |= {"sse", "sse2", "ssse3", "avx", "avx2", "fma", "f16c", "movbe", "popcnt", "aes"}
    known |= {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512vnni"}
    known |= {"avx512bf16", "avx512fp16", "avx512vbmi", "avx512vbmi2", "avx512ifma"}
    known |= {"gfni", "vaes", "vpclmulqdq", "adx", "cx16", "cmov", "sve", "sve2", "i8mm", "bf16"}
    return frozenset(present), frozenset(known)


def host_isa_features() -> tuple[frozenset[str], frozenset[str]] | None:
    """``(present, known)``: this machine's CPU features (LLVM names) and every feature the
    detection can tell about (a feature outside ``known`` is neither confirmed nor denied).

    LLVM's host detection where TVM's compiler is here, else ``/proc/cpuinfo`` (runtime-only
    TVM on a device); None where neither is available.
    """
    try:
        cpu = host_cpu()
    except ToolchainError:
        try:
            return cpuinfo_features(Path("/proc/cpuinfo").read_text())
        except OSError:
            return None
    return cpu.features, cpu.features | cpu.absent


def missing_cpu_features(record: dict[str, Any]) -> tuple[str | None, list[str]]:
    """What keeps this machine from running code made for ``record`` (:func:`cpu_record`).

    Returns
    -------
    (str | None, list[str])
        This machine's architecture when it differs from ``record["arch"]`` (else None), and the
        required features this machine's CPU lacks (empty when it can run the code, or when the
        features cannot be detected here). A different CPU model with the features is fine.
    """
    here = arch_name(platform.machine())
    if arch_name(str(record.get("arch") or here)) != here:
        return here, []
    found = host_isa_features()
    if found is None:
        return None, []
    present, known = found
    need = [str(f) for f in record.get("features") or ()]
    return None, [f for f in need if f in known and f not in present]
