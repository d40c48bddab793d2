"""Cold start: page-cache eviction and a breakdown of an artifact's first inference.

The first inference after a process starts is what a one-shot app feels (NNV12, MobiSys 2022).
:func:`evict` drops an artifact's files from the page cache (``posix_fadvise`` with
``POSIX_FADV_DONTNEED``, no root needed; dirty pages are flushed first) so the next read comes
from storage; :func:`resident_fraction` says how much of a file is cached (``mincore``).

``codl-tvm cold-start ARTIFACT`` (:func:`run_cold_start`; also ``scripts/bench_cold.py`` and the
``cold`` objective) evicts the artifact's files and starts the measured process,
``python -m codl_tvm.profiling.cold_start ARTIFACT`` (:func:`main`). That process imports only
the standard library before its first mark (this module and the package ``codl_tvm.profiling``
import nothing else; TVM comes with :mod:`codl_tvm.profiling.cold_steps`, imported after the
mark), then times each step of the first inference on the system-wide monotonic clock (so the
parent's time before it started the process joins the same time line) and prints one JSON line:

``library_load``
    importing TVM and codl-tvm and loading the OpenCL runtime plugin; the artifact's files
    are asked into the page cache (:func:`prefetch`) on a thread meanwhile, so that their
    read from storage overlaps the import instead of following it;
``input_read``
    reading the input (the artifact's stored reference input): the app's data, not the
    model's, so not counted as cold inference (:func:`cold_ms`);
``opencl_context``
    the OpenCL platform, device, context and queues; created on a thread while the library
    loads (``--context overlap``, the default: this phase is then what is left of it after
    ``weight_read``) or before it (``--context sequential``);
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

Phases follow their marks in time order. With each phase come the process's counters over it
(``getrusage``: minor and major page faults, blocks read, context switches; and the threads
alive at its end): what a phase did, not how long it took.

Run with ``TVM_USE_RUNTIME_LIB=1`` (:func:`run_cold_start` and ``scripts/bench_cold.py`` set
it), ``import tvm`` loads ``libtvm_runtime`` alone, not the compiler library, which is all a
run needs; the JSON's ``runtime_only`` says which was loaded.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "MODES",
    "PHASES",
    "Marks",
    "artifact_files",
    "check_modes",
    "cold_ms",
    "cold_start_ms",
    "evict",
    "main",
    "measure",
    "prefetch",
    "resident_fraction",
    "run_cold_start",
]

PHASES = (
    "library_load",
    "input_read",
    "opencl_context",
    "weight_read",
    "program_creation",
    "weight_transform",
    "first_run",
)
PROGRAM_MODES = ("lazy", "sequential", "overlap")
WEIGHT_MODES = ("overlap", "sequential")
CONTEXT_MODES = ("overlap", "sequential")
POOL_MODES = ("overlap", "lazy")
#: The choices of each mode of :func:`measure`.
MODES = {
    "programs": PROGRAM_MODES,
    "weights": WEIGHT_MODES,
    "context": CONTEXT_MODES,
    "pool": POOL_MODES,
}
#: Phases that are not cold inference: the interpreter, the framework's libraries, the input.
NOT_COLD = ("process_start", "library_load", "input_read")
#: ``getrusage`` fields reported per phase, under shorter names.
COUNTERS = {
    "ru_minflt": "minor_faults",
    "ru_majflt": "major_faults",
    "ru_inblock": "blocks_read",
    "ru_nvcsw": "voluntary_switches",
    "ru_nivcsw": "involuntary_switches",
}


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


def prefetch(paths: Iterable[str | os.PathLike]) -> int:
    """Ask the kernel to read ``paths`` into the page cache (``POSIX_FADV_WILLNEED``); return
    how many bytes were asked for. The reads go on in the background: a later ``mmap`` or
    ``read`` of the file finds its pages there (or waits for them) instead of faulting them in
    one read-around window after another. Files that cannot be opened are skipped.
    """
    total = 0
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
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
    interpreter's start, the framework's own libraries (``library_load``) and reading the
    input (``input_read``)."""
    return sum(v for k, v in phases_ms.items() if k not in NOT_COLD)


def run_cold_start(
    artifact: str | os.PathLike,
    modes: dict[str, str] | None = None,
    warm: int = 0,
    save: str | os.PathLike | None = None,
    evict_files: bool = True,
    scratch: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """One measured cold start of ``artifact`` in a fresh process (:func:`main`); returns its
    report (:func:`measure`).

    The artifact's files are evicted from the page cache first (``evict_files``). With
    ``scratch``, the process gets empty program caches (codl-tvm's, PoCL's and NVIDIA's) in a
    new folder under it, removed afterwards; without, it uses the caches of this environment.
    TVM's runtime library alone is loaded (``TVM_USE_RUNTIME_LIB=1``, unless the environment
    says otherwise). ``modes`` maps ``programs``, ``weights``, ``context`` and ``pool`` to
    their modes (:func:`measure`; default: each ``overlap``).

    Raises
    ------
    ValueError
        A mode that is not one of its choices.
    RuntimeError
        The process failed; the message ends with its last line of stderr.
    """
    modes = check_modes(**(modes or {}))
    env = dict(os.environ)
    env.setdefault("TVM_USE_RUNTIME_LIB", "1")
    caches = None
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
        caches = Path(tempfile.mkdtemp(prefix="caches-", dir=scratch))
        env.update(
            CODL_TVM_CACHE_DIR=str(caches / "codl"),
            POCL_CACHE_DIR=str(caches / "pocl"),
            CUDA_CACHE_PATH=str(caches / "cuda"),
        )
    cmd = [sys.executable, "-m", "codl_tvm.profiling.cold_start", str(artifact)]
    for name, mode in modes.items():
        cmd += [f"--{name}", mode]
    cmd += ["--warm", str(warm)] + (["--save", str(save)] if save is not None else [])
    try:
        if evict_files:
            evict(artifact_files(artifact))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        if caches is not None:
            shutil.rmtree(caches, ignore_errors=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"{artifact}: cold start failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cold_start_ms(artifact: str | os.PathLike, scratch: str | os.PathLike) -> float:
    """One cold start of ``artifact`` (:func:`cold_ms`, in ms) in a fresh process, with the
    artifact's files evicted from the page cache and empty program caches in a new folder
    under ``scratch`` (:func:`run_cold_start`).

    Raises
    ------
    RuntimeError
        The process failed; the message ends with its last line of stderr.
    """
    return cold_ms(run_cold_start(artifact, scratch=scratch)["phases_ms"])


def _counters() -> dict[str, int]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out = {name: getattr(usage, field) for field, name in COUNTERS.items()}
    try:
        out["threads"] = len(os.listdir("/proc/self/task"))
    except OSError:  # no procfs (not Linux)
        out["threads"] = threading.active_count()
    return out


class Marks:
    """The time (monotonic ns) and the process's counters at the end of each phase; ``main``
    is the first mark. Call with a phase's name to mark it."""

    def __init__(self) -> None:
        self.ns = {"main": time.monotonic_ns()}
        self.counters = {"main": _counters()}

    def __call__(self, name: str) -> None:
        self.ns[name] = time.monotonic_ns()
        self.counters[name] = _counters()

    def phases(self) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
        """Each phase's time (ms) since the mark before it, in time order, with the counters
        over it (``threads``: alive at its end)."""
        phases, counters = {}, {}
        prev = "main"
        for name in sorted(PHASES, key=self.ns.__getitem__):
            phases[name] = (self.ns[name] - self.ns[prev]) / 1e6
            counters[name] = {
                k: v - self.counters[prev][k] if k != "threads" else v
                for k, v in self.counters[name].items()
            }
            prev = name
        return phases, counters


class _Background(threading.Thread):
    """A daemon thread that keeps its function's result or exception for :meth:`result`."""

    def __init__(self, fn, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._fn, self._value, self._error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:  # re-raised on the caller's thread by result()
            self._error = exc

    def result(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def check_modes(
    programs: str = "overlap",
    weights: str = "overlap",
    context: str = "overlap",
    pool: str = "overlap",
) -> dict[str, str]:
    """The modes of a measurement (:func:`measure`), checked.

    Raises
    ------
    ValueError
        A mode that is not one of its choices (the message names the parameter).
    """
    modes = {"programs": programs, "weights": weights, "context": context, "pool": pool}
    for name, mode in modes.items():
        if mode not in MODES[name]:
            raise ValueError(f"{name} must be one of {MODES[name]}, not {mode!r}")
    return modes


def measure(
    artifact: str | os.PathLike,
    programs: str = "overlap",
    warm: int = 0,
    save: str | os.PathLike | None = None,
    weights: str = "overlap",
    context: str = "overlap",
    pool: str = "overlap",
) -> dict:
    """Load and run ``artifact`` once in this process, timing each step (see the module
    docstring); then ``warm`` more runs. Returns the marks (monotonic ns), the phases (ms) with
    their counters, the program cache's counters and what the load did with the programs.

    ``CODL_OPENCL_AOT=0`` ignores the artifact's program binaries (the plugin reads the
    environment at load, as in any run). ``weights``: with weights beside the library, load
    them while the first run goes on (``overlap``, as any run does) or wait for all of them
    before it (``sequential``). ``context``: create the OpenCL context on a thread while the
    library loads (``overlap``) or before it (``sequential``). ``pool``: start TVM's CPU thread
    pool while the library loads (``overlap``; builds that run CPU kernels) or at the first
    run's first parallel kernel (``lazy``, as TVM does).

    Meaningful once per process, in a process that has not imported TVM yet (:func:`main`).
    """
    marks = Marks()
    modes = check_modes(programs, weights, context, pool)
    # the artifact's reads start now, beside the imports (library, weights, binaries first)
    files = sorted(artifact_files(artifact), key=lambda f: f.suffix not in (".so", ".bin"))
    fetch = _Background(lambda: prefetch(files), "codl-prefetch")
    # deferred: importing TVM (through cold_steps) is the library-load phase measured here
    from codl_tvm.profiling.cold_steps import first_inference

    report = first_inference(artifact, marks, fetch.result, modes, warm, save)
    phases, counters = marks.phases()
    return {
        "artifact": str(artifact),
        "device": report.pop("device"),
        "programs": programs,
        "context": context,
        "pool": pool,
        "runtime_only": report.pop("runtime_only"),
        "prefetched_bytes": report.pop("prefetched_bytes"),
        "weights": report.pop("weights"),
        "weights_mode": weights,
        "weights_error": report.pop("weights_error"),
        "marks_ns": marks.ns,
        "phases_ms": phases,
        "counters": counters,
        **report,
    }


def main(argv: list[str] | None = None) -> int:
    """The measured process (``python -m codl_tvm.profiling.cold_start ARTIFACT``, started by
    :func:`run_cold_start` and ``codl-tvm cold-start``): one cold start, as one JSON line on
    stdout."""
    p = argparse.ArgumentParser(
        prog="python -m codl_tvm.profiling.cold_start",
        description="The measured process of `codl-tvm cold-start` (use that command instead).",
    )
    p.add_argument("artifact")
    p.add_argument("--programs", choices=PROGRAM_MODES, default="overlap")
    p.add_argument("--warm", type=int, default=0, help="warm runs after the first")
    p.add_argument("--save", help="write the first run's outputs to this .npz")
    p.add_argument("--weights", choices=WEIGHT_MODES, default="overlap")
    p.add_argument("--context", choices=CONTEXT_MODES, default="overlap")
    p.add_argument("--pool", choices=POOL_MODES, default="overlap")
    args = p.parse_args(argv)
    res = measure(
        args.artifact, args.programs, args.warm, args.save, args.weights, args.context, args.pool
    )
    sys.stdout.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
