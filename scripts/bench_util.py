"""Helpers the benchmark scripts share: result envelopes (the command, the commit and the
machine a result came from), and building and running co-executed libraries.

Not part of the installed package: scripts import it as ``bench_util`` (a script's folder is on
``sys.path`` when Python runs it; tests load scripts with ``tests/scripts_util.py``, which puts
this folder there too). The timing statistics are the library's
(:mod:`codl_tvm.profiling.stats`), the thread pinning too (:mod:`codl_tvm.runtime.threads`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.runtime.threads import pin_tvm_threads

__all__ = [
    "coexec_targets",
    "envelope",
    "git_commit",
    "machine_info",
    "open_opencl",
    "run_coexec_library",
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


def coexec_targets(mcpu: str, gpu_device: str = ""):
    """The ``(gpu, cpu)`` targets of a co-executed benchmark build: LLVM's CPU model ``mcpu`` for
    the CPU and as the OpenCL target's host; ``gpu_device`` (``pocl``, ``nvidia``, ...) picks the
    schedules' OpenCL preset when given."""
    cpu = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    spec = {"kind": "opencl", **({"device": gpu_device} if gpu_device else {})}
    return tvm.target.Target(spec, host={"kind": "llvm", "mcpu": mcpu}), cpu


def open_opencl(platform_name: str | None = None, tvm_cpus: str = "") -> tuple[Any, dict]:
    """Load the codl-tvm OpenCL runtime on ``platform_name`` (None: the runtime's choice, or the
    platform already in use) and pin TVM's CPU threads to
    ``tvm_cpus`` (``"LO-HI"``) when given; returns the runtime's info and the record of the
    device a benchmark's results name (platform, device, compute units)."""
    runtime.load(platform=platform_name)
    info = runtime.info()
    if tvm_cpus:
        pin_tvm_threads(tvm_cpus)
    record = {
        "platform": info.platform,
        "device": info.devices[0].name,
        "compute_units": info.devices[0].compute_units,
    }
    return info, record


def run_coexec_library(
    path: str | Path, inputs: Sequence, dev, number: int, repeat: int
) -> tuple[np.ndarray, float]:
    """Load a co-executed library into a Relax VM over ``[dev, cpu(0)]``, run ``main`` once on
    ``inputs`` (tensors on ``dev``) and time it with ``time_evaluator`` on ``dev``: returns its
    first output and the median latency in ms."""
    vm = VirtualMachine(tvm.runtime.load_module(str(path)), [dev, tvm.cpu(0)])
    out = vm["main"](*inputs)
    out = (out if hasattr(out, "numpy") else out[0]).numpy()
    res = vm.time_evaluator("main", dev, number=number, repeat=repeat)(*inputs)
    return out, float(np.median(res.results) * 1e3)
