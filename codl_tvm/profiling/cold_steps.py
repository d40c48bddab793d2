"""The steps of an artifact's first inference, as :func:`codl_tvm.profiling.cold_start.measure`
times them.

``measure`` imports this module after its first mark: importing it (TVM, NumPy and codl-tvm's
runtime) is the ``library_load`` phase, so it must never be imported by
:mod:`codl_tvm.profiling.cold_start` at its top. Each step calls ``marks(phase)`` when it ends;
the phases are described in :mod:`codl_tvm.profiling.cold_start`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.runner import max_abs_difference
from codl_tvm.runtime import program_binaries
from codl_tvm.runtime.artifact import LIBRARY, Artifact, load_artifact, start_weights
from codl_tvm.runtime.vm import flatten_outputs

__all__ = ["first_inference"]


def first_inference(
    artifact: str | os.PathLike,
    marks: Callable[[str], None],
    prefetched: Callable[[], int],
    modes: dict[str, str],
    warm: int = 0,
    save: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Load and run ``artifact`` once, calling ``marks`` at the end of each phase; then ``warm``
    more runs. ``prefetched()`` waits for the prefetch started before the import and returns its
    bytes; ``modes`` holds ``programs``, ``weights``, ``context`` and ``pool``
    (:func:`codl_tvm.profiling.cold_start.measure`). Returns what the run reports beside the
    marks."""
    art = load_artifact(artifact, verify=False)
    opencl = "opencl" in art.manifest["vm_devices"]
    if opencl:
        runtime.load()
    fetched = prefetched()  # long done: the advice only starts the reads
    marks("library_load")
    ordered, ref = _read_input(art)
    marks("input_read")
    lib, devices, loader = _load_library(art, marks, opencl, modes)
    stats0 = runtime.cache_stats() if opencl else {}
    state = _create_programs(art, lib, opencl, modes["programs"])
    marks("program_creation")
    vm = VirtualMachine(lib, devices)
    marks("weight_transform")
    args = [tvm.runtime.tensor(x, devices[0]) for x in ordered]
    outs = flatten_outputs(vm["main"](*args))
    marks("first_run")
    warm_ms = []
    for _ in range(warm):
        t0 = time.monotonic_ns()
        flatten_outputs(vm["main"](*args))
        warm_ms.append((time.monotonic_ns() - t0) / 1e6)
    stats = runtime.cache_stats() if opencl else {}
    if save is not None:
        np.savez(save, *outs)
    return {
        "device": art.manifest["device"],
        "runtime_only": bool(getattr(tvm.base, "_RUNTIME_ONLY", False)),
        "prefetched_bytes": fetched,
        "weights": (art.manifest.get("weights") or {}).get("placement", "embedded"),
        "weights_error": None if loader is None or loader.error is None else str(loader.error),
        "program_ms": (stats.get("build_ns", 0) - stats0.get("build_ns", 0)) / 1e6,
        "cache_stats": stats,
        "load": state,
        "warm_ms": warm_ms,
        "max_abs_err": None if ref is None else max_abs_difference(outs, ref[1]),
    }


def _read_input(art: Artifact) -> tuple[list[np.ndarray], Any]:
    """The artifact's stored reference input (the app's data), and the reference."""
    ref = art.reference()
    if ref is not None:
        ordered = [np.asarray(ref[0][s.name], order="C") for s in art.model.inputs]
    else:  # no reference stored: any input times the same
        ordered = [np.ones(s.shape, s.dtype) for s in art.model.inputs]
    return ordered, ref


def _load_library(
    art: Artifact, marks: Callable[[str], None], opencl: bool, modes: dict[str, str]
) -> tuple[Any, list, Any]:
    """The OpenCL context, the library and the weights beside it (phases ``opencl_context``
    and ``weight_read``, in the order the modes give); returns the library, the VM's devices
    and the weight loader (``None`` for embedded weights)."""
    # the context on a thread while this one loads the library (runtime.start_context)
    ctx = runtime.start_context() if opencl and modes["context"] == "overlap" else None
    if opencl and ctx is None:
        runtime.info()  # creates the context and queues
    if ctx is None:
        marks("opencl_context")
    library = str(Path(art.path) / LIBRARY)
    if modes["pool"] == "overlap" and art.manifest["device"] in ("cpu", "coexec"):
        # TVM's thread pool belongs to the thread that first launches a parallel kernel (this
        # one, which runs the VM): start it here while a spare thread loads the library,
        # instead of inside the first run
        with ThreadPoolExecutor(1, thread_name_prefix="codl-load") as spare:
            load = spare.submit(tvm.runtime.load_module, library)
            tvm.runtime.num_threads()
            lib = load.result()
    else:
        lib = tvm.runtime.load_module(library)
    names = art.manifest["vm_devices"]
    devices = [tvm.opencl(0) if n == "opencl" else tvm.cpu(0) for n in names]
    loader = start_weights(art.path, art.manifest, devices[0])  # kept while the VM runs
    if loader is not None and modes["weights"] == "sequential":
        loader.join()
    marks("weight_read")
    if ctx is not None:
        ctx.join()
        runtime.info()  # raises what the thread met, if anything
        marks("opencl_context")
    return lib, devices, loader


def _create_programs(art: Artifact, lib: Any, opencl: bool, programs: str) -> Any:
    """Offer the artifact's program binaries to the plugin and, for ``programs="sequential"``,
    create every OpenCL program now; returns what the load did with the binaries."""
    if not opencl:
        return None
    os.environ["CODL_OPENCL_OVERLAP"] = "1" if programs == "overlap" else "0"
    state = program_binaries.prepare(art.path, art.manifest, lib)
    if programs == "sequential":
        for mod in program_binaries.opencl_modules(lib):
            runtime.build_programs(mod, 0, 1, wait=True)
    return state
