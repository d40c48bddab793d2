"""Compile a library's OpenCL kernels in parallel processes before it is timed.

A library's first run creates every kernel's program and, on PoCL, compiles each kernel's
work-group function; PoCL does both one kernel at a time within a process (its LLVM context is
locked), so the first run of a model of 100 kernels takes tens of seconds on the emulated SoC,
most of a default compile's timing. Both land in on-disk caches that later processes read: the
runtime's program cache (``CODL_TVM_CACHE_DIR``) and PoCL's kernel cache (``POCL_CACHE_DIR``).

:func:`warm_up` runs the library once in ``shards`` fresh processes, each of which creates the
programs of, and launches, only its share of the kernels (the runtime plugin deals a module's
kernels out longest source first, each to the shard with the least source so far, and skips
the others, whose outputs are then never written: the numbers of such a run mean nothing),
so the shards compile the kernels in
parallel; the process that times the library afterwards finds them compiled. It is done where
the OpenCL platform is PoCL and cores are to spare (:func:`worth_warming`): other drivers
create programs on the runtime's threads at load
(:func:`~codl_tvm.runtime.program_binaries.build_threads`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.core.interrupts import die_with_parent
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.program_binaries import is_pocl, opencl_modules

__all__ = [
    "WARM_UP_TIMEOUT_S",
    "WarmUpProcesses",
    "default_shards",
    "warm_up",
    "warm_up_artifact",
    "warm_up_libraries",
    "worth_warming",
]

logger = logging.getLogger(__name__)

#: Seconds a warm-up shard may run before it is stopped (its kernels then compile at the
#: timed library's first run, as without a warm-up).
WARM_UP_TIMEOUT_S = 600.0


def default_shards(most: int | None = 8) -> int:
    """Warm-up processes: one a core this process may run on but one (left to the compile),
    at most ``most`` (None: no bound); or the count ``CODL_OPENCL_WARM_UP`` gives (2 or more)."""
    forced = os.environ.get("CODL_OPENCL_WARM_UP", "").strip()
    if forced.isdigit() and int(forced) > 1:
        return int(forced)
    # a compile pinned to some cores (taskset) starts its warm-up processes on those
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(most or cores or 1, (cores or 1) - 1))


def worth_warming() -> bool:
    """Whether this machine's OpenCL platform compiles serially within a process and keeps
    what it compiled on disk (PoCL), and the machine has cores for two warm-up processes
    beside the compile, so that they shorten a first run (on two cores they lengthen the
    compile: the kernels compile no faster, and each process imports TVM).

    ``CODL_OPENCL_WARM_UP=1`` warms up wherever an OpenCL device is (``0``: nowhere; a
    count of 2 or more: in that many processes).
    """
    forced = os.environ.get("CODL_OPENCL_WARM_UP", "").strip().lower()
    if forced in ("0", "off", "false", "no"):
        return False
    if not runtime.is_available():
        return False
    if forced in ("1", "on", "true", "yes") or (forced.isdigit() and int(forced) > 1):
        return True
    return default_shards() >= 2 and is_pocl(runtime.info())


class WarmUpProcesses:
    """Warm-up processes started before their work is known: each starts Python and imports
    TVM's runtime (not its compiler library: ``TVM_USE_RUNTIME_LIB=1``), then waits for its
    spec. Started when a build begins, their start (seconds when many start at once) overlaps
    the build instead of following it; :func:`warm_up` takes them (once).

    Parameters
    ----------
    count
        Processes (default :func:`default_shards`).
    """

    def __init__(self, count: int | None = None) -> None:
        self.count = max(1, count or default_shards())
        self.spawned = time.time()
        env = {**os.environ, "TVM_USE_RUNTIME_LIB": os.environ.get("TVM_USE_RUNTIME_LIB", "1")}
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from codl_tvm.runtime.warm_up import run_shard; run_shard()",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(self.count)
        ]

    def close(self) -> None:
        """Stop the processes still running (unused ones, or a warm-up cut short)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None and not stream.closed:
                    stream.close()


def warm_up(
    library: Path,
    vm_devices: Sequence[str],
    inputs: Sequence[tuple[Sequence[int], str]],
    shards: int | None = None,
    processes: WarmUpProcesses | None = None,
) -> float:
    """Run ``library`` once in ``shards`` parallel processes, each launching its share of the
    OpenCL kernels, so that their programs and work-group functions are in the on-disk caches.

    Parameters
    ----------
    library
        An exported library with OpenCL kernels.
    vm_devices
        The VM's devices, one per slot (``"opencl"``, ``"cpu"``), as the timing gives them.
    inputs
        ``(shape, dtype)`` of each input of ``main``, in order (zeros are passed).
    shards
        Processes (default :func:`default_shards`).
    processes
        Processes started ahead (their count is the shards'); this call closes them.

    Returns
    -------
    float
        Seconds the warm-up took. A shard that fails or runs past :data:`WARM_UP_TIMEOUT_S`
        is logged and left: its kernels compile at the timed run instead.
    """
    spec = {
        "library": str(library),
        "devices": list(vm_devices),
        "inputs": [[list(shape), str(dtype)] for shape, dtype in inputs],
    }
    count = processes.count if processes is not None else max(1, shards or default_shards())
    specs = [{**spec, "index": i, "count": count} for i in range(count)]
    return _run_shards(specs, library.name, processes)[0]


def warm_up_artifact(path: Path, shards: int | None = None) -> float:
    """:func:`warm_up` of the artifact directory ``path`` (loaded as ``run`` loads it, its
    weights and devices included): the first step of
    :func:`~codl_tvm.runtime.program_binaries.embed_after_warm_up` where
    :func:`worth_warming`. Its seconds.

    Raises
    ------
    RuntimeError
        A shard failed or ran late: binaries taken now would lack its kernels' work-group
        functions.
    """
    count = max(1, shards or default_shards())
    specs = [{"artifact": str(path), "index": i, "count": count} for i in range(count)]
    seconds, finished = _run_shards(specs, path.name)
    if finished < count:
        raise RuntimeError(f"{count - finished} of {count} warm-up processes of {path} failed")
    return seconds


def warm_up_libraries(
    libraries: Sequence[tuple[Path, Sequence[str], Sequence[tuple[Sequence[int], str]]]],
    name: str,
    processes: int | None = None,
) -> float:
    """Run each of many small libraries once, whole, in ``processes`` parallel processes (the
    libraries dealt out largest file first, each to the process with the fewest bytes so
    far): a profiling campaign's GPU parts, one or two kernels each, whose compiling is most
    of their profiling on PoCL.

    Parameters
    ----------
    libraries
        ``(library, vm_devices, inputs)`` of each, as :func:`warm_up` takes them.
    name
        What the libraries are, for the log line.
    processes
        Processes (default :func:`default_shards`).

    Returns
    -------
    float
        Seconds the warm-up took. A library that fails to load or run is passed over (its
        timing reports it); a process that fails or runs late is logged and left.
    """
    count = max(1, min(processes or default_shards(), len(libraries)))
    shares: list[list] = [[] for _ in range(count)]
    load = [0] * count
    for lib, devices, inputs in sorted(libraries, key=lambda e: -Path(e[0]).stat().st_size):
        least = load.index(min(load))
        shares[least].append(
            [str(lib), list(devices), [[list(shape), str(dt)] for shape, dt in inputs]]
        )
        load[least] += Path(lib).stat().st_size
    specs = [{"libraries": share, "index": i, "count": count} for i, share in enumerate(shares)]
    return _run_shards(specs, name)[0]


def _run_shards(
    specs: Sequence[dict], name: str, processes: WarmUpProcesses | None = None
) -> tuple[float, int]:
    """Run :func:`run_shard` of each spec in a process of its own (``processes``, started
    ahead, or started now), all at once: their seconds, and how many finished."""
    count = len(specs)
    start = time.perf_counter()
    phases: list[dict] = []
    # in files: a campaign's share of libraries can outgrow a pipe's buffer
    folder = tempfile.TemporaryDirectory(prefix="codl-warm-up-")
    procs = processes if processes is not None else WarmUpProcesses(count)
    try:
        for index, (spec, proc) in enumerate(zip(specs, procs.procs, strict=True)):
            path = Path(folder.name) / f"{index}.json"
            path.write_text(json.dumps(spec))
            try:  # communicate() (in _wait) closes stdin
                proc.stdin.write(f"{path}\n")
                proc.stdin.flush()
            except BrokenPipeError:  # it died starting: _wait reports it
                pass
        for index, proc in enumerate(procs.procs):
            left = WARM_UP_TIMEOUT_S - (time.perf_counter() - start)
            phases += [p for p in [_wait(proc, index, name, left)] if p is not None]
    finally:  # a Ctrl-C (or any error) here leaves no shard running
        procs.close()
        folder.cleanup()
    seconds = time.perf_counter() - start
    # where a shard's time goes (its start: the interpreter and imports), to tune the count
    spans = {
        key: f"{min(p[key] for p in phases):.1f}-{max(p[key] for p in phases):.1f} s"
        for key in ("programs_s", "run_s")
        if phases
    }
    if phases:  # when each was ready for its spec, from its start (before the spec came)
        ready = [p["ready"] - procs.spawned for p in phases]
        spans["ready after"] = f"{min(ready):.1f}-{max(ready):.1f} s"
    logger.info(
        "compiled the OpenCL kernels of %s in %d process%s (%.1f s; %s)",
        name,
        count,
        "" if count == 1 else "es",
        seconds,
        ", ".join(f"{k.removesuffix('_s')} {v}" for k, v in spans.items()) or "no shard finished",
    )
    return seconds, len(phases)


def _wait(proc: subprocess.Popen, index: int, name: str, seconds: float) -> dict | None:
    """Wait up to ``seconds`` for warm-up shard ``index``: its phases (:func:`run_shard`), or
    None with a note where it failed or ran late."""
    try:
        out, err = proc.communicate(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        logger.info("note: warm-up shard %d of %s stopped after %.0f s", index, name, seconds)
        return None
    if proc.returncode != 0:
        tail = (err or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        logger.info("note: warm-up shard %d of %s failed: %s", index, name, tail[0])
        return None
    lines = (out or "").strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:  # something else wrote last: the timing is only a log line's
        return None


def run_shard() -> None:
    """One warm-up process (:class:`WarmUpProcesses`): once ready, it reads the path of its
    spec (JSON) on stdin, then runs the library once with its share of the kernels only
    (:func:`warm_up`), the artifact so (:func:`warm_up_artifact`), or its share of many
    libraries, each whole (:func:`warm_up_libraries`)."""
    # the compile (or its build worker) ends the shards: a Ctrl-C is its to handle
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    runtime.load()
    ready = time.time()
    line = sys.stdin.readline().strip()
    if not line:  # closed unused
        return
    spec = json.loads(Path(line).read_text())
    if "libraries" in spec:
        loaded = time.perf_counter()
        for library, devices, inputs in spec["libraries"]:
            try:
                _run_once(tvm.runtime.load_module(library), devices, inputs)
            except Exception:  # the part's timing reports what is wrong with it
                continue
        phases = {"ready": ready, "programs_s": 0.0, "run_s": time.perf_counter() - loaded}
        sys.stdout.write(json.dumps(phases) + "\n")
        return
    runtime.plugin_function("codl.opencl.set_warm_shard")(spec["index"], spec["count"])
    if "artifact" in spec:
        art = load_artifact(spec["artifact"], verify=False, check_cpu=False)
        loaded = time.perf_counter()  # its programs are created on threads as the run starts
        art([np.zeros(s.shape, s.dtype) for s in art.model.inputs])
        ran = time.perf_counter() - loaded
        sys.stdout.write(json.dumps({"ready": ready, "programs_s": 0.0, "run_s": ran}) + "\n")
        return
    lib = tvm.runtime.load_module(spec["library"])
    loaded = time.perf_counter()
    for mod in opencl_modules(lib):  # the shard's programs, those of kernels never launched too
        runtime.build_programs(mod, 0, 1, wait=True)
    built = time.perf_counter()
    _run_once(lib, spec["devices"], spec["inputs"])
    ran = time.perf_counter() - built
    phases = {"ready": ready, "programs_s": built - loaded, "run_s": ran}
    # the parent reads the last line of stdout
    sys.stdout.write(json.dumps(phases) + "\n")


def _run_once(lib, device_names: Sequence[str], inputs: Sequence) -> None:
    """``main`` of the loaded library ``lib`` once on zeros, waited for."""
    devices = [tvm.device(name, 0) for name in device_names]
    vm = VirtualMachine(lib, devices)
    args = [tvm.runtime.tensor(np.zeros(shape, dtype), devices[0]) for shape, dtype in inputs]
    vm["main"](*args)
    for dev in {str(d): d for d in devices}.values():
        dev.sync()
