"""Cold start: page-cache eviction and a breakdown of an artifact's first inference.

The first inference after a process starts is what a one-shot app feels (NNV12, MobiSys 2022).
:func:`evict` drops an artifact's files from the page cache (``posix_fadvise`` with
``POSIX_FADV_DONTNEED``, no root needed; dirty pages are flushed first) so the next read comes
from storage; :func:`resident_fraction` says how much of a file is cached (``mincore``).

``python -m codl_tvm.coldstart ARTIFACT`` is the measured process of ``scripts/bench_cold.py``:
it imports only the standard library before its first mark, then times each step of the first
inference on the system-wide monotonic clock (so the parent's time before it started the
process joins the same time line) and prints one JSON line:

``library_load``
    importing TVM and codl-tvm and loading the OpenCL runtime plugin;
``opencl_context``
    the OpenCL platform, device, context and queues;
``weight_read``
    loading the library, whose constants hold the weights (read from storage when cold); an
    artifact with its weights beside the library (``--weights beside``) starts their loader
    here, which reads them during ``first_run`` (``--weights overlap``) or before it
    (``--weights sequential``: this phase waits for every weight);
``program_creation``
    creating the OpenCL programs before the run (``--programs sequential``); ``lazy`` (each at
    its kernel's first launch) and ``overlap`` (on threads while the run goes on) leave it
    inside ``first_run``, and ``program_ns`` reports the creation time summed over threads;
``weight_transform``
    the VM's set-up, which places the constants on the devices (nothing is transformed at
    load: layout changes are folded into the constants at compile time);
``first_run``
    the first inference up to its outputs in host memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "PHASES",
    "artifact_files",
    "cold_ms",
    "cold_start_ms",
    "evict",
    "main",
    "measure",
    "resident_fraction",
]

PHASES = (
    "library_load",
    "opencl_context",
    "weight_read",
    "program_creation",
    "weight_transform",
    "first_run",
)
PROGRAM_MODES = ("lazy", "sequential", "overlap")
WEIGHT_MODES = ("overlap", "sequential")


def artifact_files(path: str | os.PathLike) -> list[Path]:
    """Every regular file under an artifact directory (what a cold start reads)."""
    root = Path(path)
    return sorted(p for p in root.rglob("*") if p.is_file())


def evict(paths: Iterable[str | os.PathLike]) -> int:
    """Drop ``paths`` from the page cache; return how many bytes were advised away.

    Dirty pages cannot be dropped, so each file is flushed (``fsync``) first. The advice is a
    hint: the kernel drops clean, unmapped pages; pages another process has mapped stay.
    """
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += size
        finally:
            os.close(fd)
    return total


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def resident_fraction(path: str | os.PathLike) -> float | None:
    """The fraction of ``path``'s pages in the page cache (``mincore``), or None where the C
    library has no ``mincore``. An empty file counts as fully resident."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mincore"):
        return None
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        # a mapping of its own: mapping reads nothing, and mincore only looks
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def cold_ms(phases_ms: dict[str, float]) -> float:
    """Cold inference as NNV12 counts it: loading the model to its first output, past the
    interpreter's start and the framework's own libraries (``library_load``)."""
    return sum(v for k, v in phases_ms.items() if k not in ("process_start", "library_load"))


def cold_start_ms(artifact: str | os.PathLike, scratch: str | os.PathLike) -> float:
    """One cold start of ``artifact`` (:func:`cold_ms`, in ms) in a fresh process, with the
    artifact's files evicted from the page cache and empty program caches (codl-tvm's, PoCL's
    and NVIDIA's, in a new folder under ``scratch``, removed afterwards).

    Raises
    ------
    RuntimeError
        The process failed; the message ends with its last line of stderr.
    """
    Path(scratch).mkdir(parents=True, exist_ok=True)
    caches = Path(tempfile.mkdtemp(prefix="caches-", dir=scratch))
    env = {
        **os.environ,
        "CODL_TVM_CACHE_DIR": str(caches / "codl"),
        "POCL_CACHE_DIR": str(caches / "pocl"),
        "CUDA_CACHE_PATH": str(caches / "cuda"),
    }
    try:
        evict(artifact_files(artifact))
        proc = subprocess.run(
            [sys.executable, "-m", "codl_tvm.coldstart", str(artifact)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"{artifact}: cold start failed: {last}")
    return cold_ms(json.loads(proc.stdout.strip().splitlines()[-1])["phases_ms"])


def measure(
    artifact: str | os.PathLike,
    programs: str = "overlap",
    warm: int = 0,
    save: str | os.PathLike | None = None,
    weights: str = "overlap",
) -> dict:
    """Load and run ``artifact`` once in this process, timing each step (see the module
    docstring); then ``warm`` more runs. Returns the marks (monotonic ns), the phases (ms),
    the program cache's counters and what the load did with the programs.

    ``CODL_OPENCL_AOT=0`` ignores the artifact's program binaries (the plugin reads the
    environment at load, as in any run). ``weights``: with weights beside the library, load
    them while the first run goes on (``overlap``, as any run does) or wait for all of them
    before it (``sequential``).
    """
    marks = {"main": time.monotonic_ns()}
    if programs not in PROGRAM_MODES:
        raise ValueError(f"programs must be one of {PROGRAM_MODES}, not {programs!r}")
    if weights not in WEIGHT_MODES:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, not {weights!r}")
    # deferred: importing TVM is the library-load phase this function measures
    import numpy as np
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm import runtime
    from codl_tvm.artifact import load_artifact, program_binaries
    from codl_tvm.artifact.store import LIBRARY, start_weights
    from codl_tvm.runner import _flatten, max_abs_difference

    art = load_artifact(artifact, verify=False)
    names = art.manifest["vm_devices"]
    opencl = "opencl" in names
    if opencl:
        runtime.load()
    marks["library_load"] = time.monotonic_ns()
    if opencl:
        runtime.info()  # creates the context and queues
    marks["opencl_context"] = time.monotonic_ns()
    lib = tvm.runtime.load_module(str(Path(artifact) / LIBRARY))
    devices = [tvm.opencl(0) if n == "opencl" else tvm.cpu(0) for n in names]
    loader = start_weights(art.path, art.manifest, devices[0])  # kept while the VM runs
    if loader is not None and weights == "sequential":
        loader.join()
    marks["weight_read"] = time.monotonic_ns()
    state = None
    stats0 = runtime.cache_stats() if opencl else {}
    if opencl:
        os.environ["CODL_OPENCL_OVERLAP"] = "1" if programs == "overlap" else "0"
        state = program_binaries.prepare(art.path, art.manifest, lib)
        if programs == "sequential":
            for mod in program_binaries.opencl_modules(lib):
                runtime.build_programs(mod, 0, 1, wait=True)
    marks["program_creation"] = time.monotonic_ns()
    vm = VirtualMachine(lib, devices)
    marks["weight_transform"] = time.monotonic_ns()
    ref = art.reference()
    if ref is not None:
        ordered = [np.asarray(ref[0][s.name], order="C") for s in art.model.inputs]
    else:  # no reference stored: any input times the same
        ordered = [np.ones(s.shape, s.dtype) for s in art.model.inputs]
    args = [tvm.runtime.tensor(x, devices[0]) for x in ordered]
    outs = _flatten(vm["main"](*args))
    marks["first_run"] = time.monotonic_ns()
    warm_ms = []
    for _ in range(warm):
        t0 = time.monotonic_ns()
        _flatten(vm["main"](*args))
        warm_ms.append((time.monotonic_ns() - t0) / 1e6)
    stats = runtime.cache_stats() if opencl else {}
    if save is not None:
        np.savez(save, *outs)
    prev = marks["main"]
    phases = {}
    for name in PHASES:
        phases[name] = (marks[name] - prev) / 1e6
        prev = marks[name]
    return {
        "artifact": str(artifact),
        "device": art.manifest["device"],
        "programs": programs,
        "weights": (art.manifest.get("weights") or {}).get("placement", "embedded"),
        "weights_mode": weights,
        "weights_error": None if loader is None or loader.error is None else str(loader.error),
        "marks_ns": marks,
        "phases_ms": phases,
        "program_ms": (stats.get("build_ns", 0) - stats0.get("build_ns", 0)) / 1e6,
        "cache_stats": stats,
        "load": state,
        "warm_ms": warm_ms,
        "max_abs_err": None if ref is None else max_abs_difference(outs, ref[1]),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m codl_tvm.coldstart ARTIFACT``: one measured cold start, as one JSON line."""
    import argparse  # deferred: this process's first mark comes before it

    p = argparse.ArgumentParser(prog="python -m codl_tvm.coldstart")
    p.add_argument("artifact")
    p.add_argument("--programs", choices=PROGRAM_MODES, default="overlap")
    p.add_argument("--warm", type=int, default=0, help="warm runs after the first")
    p.add_argument("--save", help="write the first run's outputs to this .npz")
    p.add_argument(
        "--weights",
        choices=WEIGHT_MODES,
        default="overlap",
        help="weights beside the library: load them during the first run or before it",
    )
    args = p.parse_args(argv)
    print(json.dumps(measure(args.artifact, args.programs, args.warm, args.save, args.weights)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
