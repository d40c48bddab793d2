"""Helpers shared by the benchmark scripts: result envelopes (command, commit, machine) and
robust timing statistics. Timing belongs on the device machine, never in tests."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = [
    "envelope",
    "git_commit",
    "machine_info",
    "pin_tvm_threads",
    "time_host_us",
    "write_json",
]


def git_commit() -> str:
    """The commit benchmarked: ``CODL_TVM_COMMIT`` (set where no .git travels) or git's HEAD."""
    env = os.environ.get("CODL_TVM_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict:
    """CPU model, core count and Python of this machine."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def envelope(command: list[str] | str, results: dict, **extra) -> dict:
    """Wrap results with the command that produced them, the commit and the machine."""
    cmd = command if isinstance(command, str) else " ".join(command)
    return {
        "command": cmd,
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **extra,
        "results": results,
    }


def write_json(path: str | Path, data: dict) -> None:
    """Write ``data`` as indented JSON, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def time_host_us(fn: Callable[[], object], repeat: int = 200, warmup: int = 20) -> dict:
    """Median/min/p90 host time of ``fn`` in microseconds (perf_counter_ns)."""
    for _ in range(warmup):
        fn()
    samples = np.empty(repeat)
    for i in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples[i] = (time.perf_counter_ns() - t0) / 1e3
    return {
        "median_us": float(np.median(samples)),
        "min_us": float(samples.min()),
        "p90_us": float(np.percentile(samples, 90)),
        "repeat": repeat,
    }


def pin_tvm_threads(cores: str, pin_main_thread: bool = True) -> list[int]:
    """Pin TVM's CPU thread pool to cores ``"LO-HI"`` (one worker per core); ValueError for a
    range that is not ``LO-HI`` with ``LO <= HI`` among this machine's cores.

    The emulated SoC of the benchmarks: TVM's CPU kernels on their own cores, PoCL's workers on
    the others (``POCL_AFFINITY=1``, ``POCL_CPU_MAX_CU_COUNT``).
    """
    import tvm

    lo_hi = cores.split("-")
    n = os.cpu_count() or 1
    if not (len(lo_hi) == 2 and all(v.isdigit() for v in lo_hi)) or not (
        int(lo_hi[0]) <= int(lo_hi[1]) < n
    ):
        raise ValueError(f"{cores!r}: expected LO-HI, cores of this machine (0-{n - 1})")
    lo, hi = (int(v) for v in lo_hi)
    cpus = list(range(lo, hi + 1))
    tvm.get_global_func("runtime.config_threadpool")(-2, len(cpus), [str(c) for c in cpus])
    if pin_main_thread:
        os.sched_setaffinity(0, set(cpus))
    return cpus
