"""Ahead-of-time OpenCL program binaries in an artifact, and what a load does with them.

OpenCL kernels travel as source; the driver compiles each one at its first launch, which
dominates a cold start (seconds on PoCL, tens of ms on NVIDIA). ``codl-tvm compile`` for a
device it can reach creates every kernel's program there and stores the binaries in the
artifact's ``program_binaries/`` folder (:func:`embed`), so the first run on that device loads
them instead of compiling. At load (:func:`prepare`) the folder is offered to the runtime plugin
and the programs of every kernel are created on spare threads while the caller goes on.

Safety lives in the plugin (``opencl_plugin.cc``): each file is named by the program cache's key
(source, device name, vendor, version, driver version, options), so another device or driver
never finds a binary and compiles from source; each file carries a hash of its payload, so a
truncated or altered binary is rebuilt from source; a binary the driver rejects falls back to
source too. Each such case logs a note and counts in :func:`codl_tvm.runtime.cache_stats`.

PoCL compiles a kernel's work-group function for each local size (and grid shape) at its first
launch, not when the program is built, and the binary it gives (``clGetProgramInfo``) carries
the kernels' folders of its cache as they are when the binary is first asked for (it keeps that
copy for the program's life). Stored right after the build, such a binary still leaves every
work-group function to compile in a cold process. :func:`embed_after_warm_up` therefore runs
the artifact once in a fresh process with a private PoCL cache, then asks for the binaries in a
second fresh process that builds the programs from that (now filled) cache: the stored binaries
carry the compiled work-group functions, and a cold process compiles nothing.

Environment: ``CODL_OPENCL_AOT=0`` ignores an artifact's binaries; ``CODL_OPENCL_OVERLAP=0``
creates programs at each kernel's first launch instead of on threads at load;
``CODL_OPENCL_BUILD_THREADS`` sets those threads (default: the CPU count, at most 8).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from codl_tvm import runtime
from codl_tvm.core.errors import ArtifactError

__all__ = [
    "BINARIES",
    "INDEX",
    "build_threads",
    "device_key",
    "device_key_of",
    "embed",
    "embed_after_warm_up",
    "embed_for_preset",
    "is_pocl",
    "opencl_modules",
    "prepare",
]

BINARIES = "program_binaries"
INDEX = "device.json"

logger = logging.getLogger(__name__)
_KEY_FIELDS = ("name", "vendor", "version", "driver_version")


def device_key(device: runtime.DeviceInfo) -> dict[str, str]:
    """The fields of an OpenCL device that the program cache's key holds."""
    return {f: getattr(device, f) for f in _KEY_FIELDS}


def opencl_modules(lib) -> list:
    """Every OpenCL module imported (directly or not) by a loaded library."""
    found, stack = [], [lib]
    while stack:
        mod = stack.pop()
        if mod.kind == "opencl":
            found.append(mod)
        stack.extend(mod.imports)
    return found


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() not in ("0", "off", "false", "no")


def build_threads() -> int:
    """Threads that create programs at load (``CODL_OPENCL_BUILD_THREADS``)."""
    value = os.environ.get("CODL_OPENCL_BUILD_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, min(8, os.cpu_count() or 1))


def embed(library: Path, out: Path, record: Mapping | None = None) -> dict[str, Any] | None:
    """Create every OpenCL kernel's program of ``library`` on this machine's OpenCL device and
    store the binaries in ``out/program_binaries``, beside those of the devices in ``record``
    (an earlier return value: binaries of several devices share the folder, their names
    differ).

    Returns
    -------
    dict or None
        The manifest's record: the folder and, per device, its key, kernel count and bytes;
        None where the library has no OpenCL kernels or no device gave binaries.
    """
    device = runtime.info().devices[0]
    lib = tvm.runtime.load_module(str(library))
    modules = opencl_modules(lib)
    if not modules:
        return None
    folder = out / BINARIES
    folder.mkdir(exist_ok=True)
    before = {f.name for f in folder.glob("*.bin")}
    export = folder / f".export-{os.getpid()}"
    export.mkdir()
    with runtime.exporting_program_binaries(export):
        for mod in modules:
            runtime.build_programs(mod, 0, build_threads(), wait=True)
    files = []
    for f in sorted(export.glob("*.bin")):
        files.append(folder / f.name)
        os.replace(f, files[-1])
    export.rmdir()
    key = device_key(device)
    devices = [d for d in (record or {}).get("devices", []) if device_key_of(d) != key]
    if files:
        entry = {**key, "kernels": len(files), "nbytes": sum(f.stat().st_size for f in files)}
        devices.append(entry)
    if not devices:
        if not before:
            folder.rmdir()
        logger.info(
            "note: '%s' gives no program binaries; the artifact ships source only", device.name
        )
        return None
    record = {"dir": BINARIES, "devices": devices}
    (folder / INDEX).write_text(json.dumps(record, indent=2) + "\n")
    logger.info(
        "stored %d OpenCL program binaries for '%s' (driver %s): the first run there skips the "
        "OpenCL compiler",
        len(files),
        device.name,
        device.driver_version,
    )
    return record


def is_pocl(info: runtime.OpenCLInfo) -> bool:
    """Whether the OpenCL platform in use is PoCL (its binaries need a warm-up run)."""
    text = f"{info.platform} {info.platform_version} {info.platform_vendor}".lower()
    return "portable computing language" in text or "pocl" in text


def embed_after_warm_up(
    path: Path, library: Path, record: Mapping | None = None
) -> dict[str, Any] | None:
    """:func:`embed` of ``library`` for the complete artifact ``path``, the binaries taken
    after one run of it (its reference inputs, else zeros), so that on PoCL they carry the
    work-group functions the run compiled. Both steps run in fresh processes that share a
    private PoCL cache (``POCL_CACHE_DIR``) and ignore the artifact's binaries: the second
    builds the programs from PoCL's filled cache and exports them. This process's platform
    and device are used.

    Returns
    -------
    dict or None
        As :func:`embed`; this device's entry has ``"after_warm_up": true``.

    Raises
    ------
    ArtifactError
        Where the run or the export fails (its error output in the message).
    """
    info = runtime.info()
    with tempfile.TemporaryDirectory(prefix="codl-warm-") as tmp:
        env = {
            **os.environ,
            "POCL_CACHE_DIR": str(Path(tmp) / "pocl"),
            "CODL_OPENCL_AOT": "0",
            "CODL_OPENCL_PLATFORM": info.platform,
        }
        # the artifact is loaded by the child (store imports this module: no import here);
        # where PoCL has cores to spare the run is shared out to parallel warm-up processes
        # (runtime.warm_up, which imports this module), each compiling its share of kernels
        art = f"load_artifact({str(path)!r}, verify=False, check_cpu=False)"
        calls = {
            "_warm_up_run": (
                f"warm_up_artifact(Path({str(path)!r})) if worth_warming() else _warm_up_run({art})"
            ),
            "_embed_json": f"_embed_json({str(library)!r}, {str(path)!r}, "
            f"{json.dumps(dict(record or {}))!r})",
        }
        out = ""
        for step, call in calls.items():
            code = (
                "from pathlib import Path; from codl_tvm.runtime.artifact import load_artifact; "
                "from codl_tvm.runtime.warm_up import warm_up_artifact, worth_warming; "
                f"from codl_tvm.runtime.program_binaries import {step}; {call}"
            )
            # an empty program cache per step: a program created from a binary (as the first
            # step's cached one) gives back that binary, not PoCL's filled cache
            env["CODL_TVM_CACHE_DIR"] = str(Path(tmp) / f"codl-{step}")
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
                raise ArtifactError(
                    f"{path}: the warm-up for PoCL's program binaries failed ({step}): {tail[0]}"
                )
            out = proc.stdout
    lines = out.strip().splitlines()
    result = json.loads(lines[-1]) if lines else None
    for line in lines[:-1]:  # the child's log lines (:func:`_embed_json`)
        logger.info("%s", line)
    if result:
        here = device_key(info.devices[0])
        for entry in result["devices"]:
            if device_key_of(entry) == here:
                entry["after_warm_up"] = True
        (path / str(result.get("dir", BINARIES)) / INDEX).write_text(
            json.dumps(result, indent=2) + "\n"
        )
    return result


def _warm_up_run(art) -> None:
    """One run of the artifact ``art`` (the first step of :func:`embed_after_warm_up`)."""
    ref = art.reference()
    if ref is not None:
        inputs = [ref[0][s.name] for s in art.model.inputs]
    else:
        inputs = [np.zeros(s.shape, s.dtype) for s in art.model.inputs]
    art(inputs)  # PoCL writes each work-group function to its cache as it compiles it


def _embed_json(library: str, path: str, record_json: str) -> None:
    """:func:`embed` of ``library`` into the artifact ``path``, its log lines then its record
    (JSON) on stdout (the second step of :func:`embed_after_warm_up`, in a child process)."""
    lines: list[str] = []
    collect = _LineCollector(lines)
    logger.addHandler(collect)
    level = logger.level
    logger.setLevel(logging.INFO)  # a fresh process logs warnings only
    try:
        record = embed(Path(library), Path(path), json.loads(record_json) or None)
    finally:
        logger.setLevel(level)
        logger.removeHandler(collect)
    # the child's stdout is the protocol with its parent, which logs the lines
    sys.stdout.write("\n".join([*lines, json.dumps(record)]) + "\n")
    sys.stdout.flush()


class _LineCollector(logging.Handler):
    """A logging handler that appends each record's message to a list."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def embed_for_preset(preset, library: Path, out: Path) -> dict[str, Any] | None:
    """:func:`embed` where this machine's OpenCL device is the ``preset``'s GPU: never for a
    cross-compiling preset, and where the preset names a device (``"device": "nvidia"``), only
    when this machine's platform or device carries that name; a note says why not."""
    if preset.is_cross:
        return None
    tag = str((preset.gpu or {}).get("device", "")).lower()
    info = runtime.info()
    device = info.devices[0]
    here = " ".join((info.platform, info.platform_vendor, device.name, device.vendor)).lower()
    if tag and tag not in here:
        logger.info(
            "note: preset %r targets a %s OpenCL device, this machine's is '%s' (%s): no "
            "program binaries stored (the first run there compiles the kernels)",
            preset.name,
            tag,
            device.name,
            info.platform,
        )
        return None
    return embed(library, out)


def device_key_of(entry: Mapping) -> dict[str, str]:
    """The device key of a record's device entry."""
    return {f: str(entry.get(f)) for f in _KEY_FIELDS}


def _check_cache_dir() -> None:
    """Note once where the program cache cannot be written (programs still build, uncached)."""
    if not _flag("CODL_OPENCL_PROGRAM_CACHE", True):
        return
    folder = runtime.default_cache_dir() / "opencl-programs"
    probe = folder if folder.exists() else next(p for p in folder.parents if p.exists())
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        warnings.warn(
            f"the OpenCL program cache {folder} is not writable: kernels without an artifact "
            "binary are compiled at every start (set CODL_TVM_CACHE_DIR to a writable folder)",
            stacklevel=3,
        )


def prepare(path: Path, manifest: Mapping, lib) -> dict[str, Any]:
    """Before an artifact's first run: offer its program binaries to the runtime when they
    were made for this device and driver (a note otherwise), and start creating every
    kernel's program on spare threads.

    Returns
    -------
    dict
        ``aot``: whether the binaries are offered; ``overlap``: whether program creation runs
        on threads; ``threads``; ``note``: why binaries are not used, if so.
    """
    state: dict[str, Any] = {"aot": False, "overlap": False, "threads": 0, "note": None}
    record = manifest.get("program_binaries")
    if isinstance(record, Mapping) and _flag("CODL_OPENCL_AOT", True):
        here = device_key(runtime.info().devices[0])
        built_for = [device_key_of(d) for d in record.get("devices", [])]
        if here in built_for:
            runtime.add_program_binary_dir(path / str(record.get("dir", BINARIES)))
            state["aot"] = True
        else:
            names = ", ".join(f"'{d['name']}' (driver {d['driver_version']})" for d in built_for)
            state["note"] = (
                f"{path}: program binaries were built for {names}; this device is "
                f"'{here['name']}' (driver {here['driver_version']}): kernels are compiled "
                "from source"
            )
            warnings.warn(state["note"], stacklevel=3)
    _check_cache_dir()
    if _flag("CODL_OPENCL_OVERLAP", True):
        state["threads"] = build_threads()
        for mod in opencl_modules(lib):
            runtime.build_programs(mod, 0, state["threads"], wait=False)
        state["overlap"] = True
    return state
