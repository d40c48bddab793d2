"""Pinning TVM's CPU thread pool to a range of cores.

The emulated SoC's CPU: TVM's CPU kernels on cores of their own, while PoCL's workers (the
emulated GPU) run on the others (``POCL_AFFINITY=1``, ``POCL_CPU_MAX_CU_COUNT``). ``codl-tvm
profile --tvm-cpus LO-HI`` and the benchmark scripts use it.
"""

from __future__ import annotations

import os

import tvm

__all__ = ["parse_cores", "pin_tvm_threads"]


def parse_cores(cores: str) -> list[int]:
    """The cores of the range ``"LO-HI"`` (both included).

    Raises
    ------
    ValueError
        ``cores`` is not ``LO-HI`` with ``LO <= HI`` among this machine's cores.
    """
    lo_hi = cores.split("-")
    n = os.cpu_count() or 1
    if not (len(lo_hi) == 2 and all(v.isdigit() for v in lo_hi)) or not (
        int(lo_hi[0]) <= int(lo_hi[1]) < n
    ):
        raise ValueError(f"{cores!r}: expected LO-HI, cores of this machine (0-{n - 1})")
    lo, hi = (int(v) for v in lo_hi)
    return list(range(lo, hi + 1))


def pin_tvm_threads(cores: str, pin_main_thread: bool = True) -> list[int]:
    """Pin TVM's CPU thread pool to the cores ``"LO-HI"``, one worker per core, and with
    ``pin_main_thread`` the calling thread too; return the cores.

    Raises
    ------
    ValueError
        ``cores`` is not a range of this machine's cores (:func:`parse_cores`).
    """
    cpus = parse_cores(cores)
    # -2: one worker per listed core (TVM's kSpecifyOneCorePerThread)
    tvm.get_global_func("runtime.config_threadpool")(-2, len(cpus), [str(c) for c in cpus])
    if pin_main_thread:
        os.sched_setaffinity(0, set(cpus))
    return cpus
