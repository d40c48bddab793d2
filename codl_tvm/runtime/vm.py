"""Running a Relax VM: its outputs as numpy arrays, and its latency.

Shared by everything that runs a loaded library (artifacts, staged artifacts, the builds of a
compile, profiling); nothing here needs TVM's compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm

__all__ = ["Latency", "flatten_outputs", "time_vm"]


@dataclass
class Latency:
    """Latency statistics of repeated runs, in milliseconds."""

    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    repeats: int

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latency:
        """The statistics of ``samples_ms`` (one per repeat)."""
        ms = np.asarray(samples_ms, dtype=float)
        return cls(
            median_ms=float(np.median(ms)),
            mean_ms=float(np.mean(ms)),
            min_ms=float(np.min(ms)),
            max_ms=float(np.max(ms)),
            repeats=len(ms),
        )


def time_vm(vm, dev, inputs: Sequence[np.ndarray], number: int = 5, repeat: int = 3) -> Latency:
    """Latency of ``vm["main"]`` on ``inputs`` placed on ``dev``, with ``time_evaluator`` on
    ``dev``'s timer after one warm-up run (shared by every built-model wrapper)."""
    # asarray keeps a 0-d input 0-d (ascontiguousarray returns at least 1-d)
    args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in inputs]
    vm["main"](*args)
    res = vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args)
    return Latency.of([r * 1e3 for r in res.results])


def flatten_outputs(out) -> list[np.ndarray]:
    """A VM result (one tensor, or nested tuples of them) as a flat list of numpy arrays, in
    order."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    result = []
    for item in out:
        result.extend(flatten_outputs(item))
    return result
