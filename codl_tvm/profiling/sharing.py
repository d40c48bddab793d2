"""Data-sharing costs between the processors as functions of bytes (:func:`measure_sharing`):
synchronisation, mapping and copying, measured through a session's device and the runtime
plugin's functions, as the cost model's ``SharingModel`` fits them.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import tvm

from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.dataset import SharingRecord
from codl_tvm.profiling.sessions import Session

__all__ = ["measure_sharing"]


def _host_median_ms(func, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        func()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        func()
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(samples))


def _copy_ms(session: Session, src, dst, repeats: int) -> float:
    """Host time of copying ``src`` (CPU) into ``dst`` (OpenCL) and waiting for it. Through RPC
    the copy runs on the server (its ``runtime.TVMTensorCopyFromTo``) and the round trips of the
    two calls, measured with sync-only calls, are subtracted (clipped at 0)."""
    gpu = dst.device
    if not session.remote:

        def copy():
            dst.copyfrom(src)
            gpu.sync()

        return _host_median_ms(copy, repeats)
    copy_fn = session.get_function("runtime.TVMTensorCopyFromTo")

    def remote_copy():
        copy_fn(src, dst)
        gpu.sync()

    def round_trips():
        gpu.sync()
        gpu.sync()

    return max(0.0, _host_median_ms(remote_copy, repeats) - _host_median_ms(round_trips, repeats))


def measure_sharing(
    session: Session,
    device: dict,
    sizes: tuple[int, ...] = (4096, 65536, 1 << 20),
    repeats: int = 10,
    sync_repeats: int = 200,
) -> list[SharingRecord]:
    """Data-sharing costs as functions of bytes.

    - ``presync`` / ``postsync``: one mark + wait with the device's sync mode (``"auto"``
      resolves it by measurement, so it is not part of the device description), from the
      plugin's ``measure_us`` (median of ``sync_repeats``); it does not depend on bytes, so it
      is measured once per size as independent samples.
    - ``map`` / ``unmap``: host time of mapping / unmapping an OpenCL tensor of ``nbytes`` when
      the SVM mode is ``coarse`` or ``buffer`` (no SVM: co-execution maps buffers for the CPU);
      with fine-grained SVM there is nothing to map and the cost is 0 (``device["svm_mode"]``
      says which).
    - ``transform``: host time of copying ``nbytes`` from a CPU tensor into an OpenCL tensor and
      waiting for it (through RPC: on the server, round trips subtracted).
    """
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 4 or n % 4:
            raise ProfileError(f"sharing size {n!r} must be a positive multiple of 4 bytes")
    records: list[SharingRecord] = []
    gpu = session.device("gpu")
    cpu = session.device("cpu")
    mode = str(session.get_function("codl.coexec.sync_mode")(0))
    measure_us = session.get_function("codl.coexec.measure_us")
    coarse = device.get("svm_mode") in ("coarse", "buffer")  # modes that map for the host
    smap = session.get_function("codl.opencl.svm_map") if coarse else None
    sunmap = session.get_function("codl.opencl.svm_unmap") if coarse else None
    for n in sizes:
        # Sync has no pattern in bytes (CoDL Fig. 14b): measured once per size, after a copy of
        # that size, so the model's upper bound sees several samples.
        for kind in ("presync", "postsync"):
            sync_ms = max(float(measure_us(0, mode, sync_repeats)), 0.0) / 1e3
            records.append(SharingRecord(kind, n, sync_ms, sync_repeats, device))
        host = np.zeros(n // 4, dtype="float32")
        src = tvm.runtime.tensor(host, cpu)
        dst = tvm.runtime.empty((n // 4,), "float32", gpu)

        records.append(
            SharingRecord("transform", n, _copy_ms(session, src, dst, repeats), repeats, device)
        )
        if coarse:
            map_ms = []
            unmap_ms = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                smap(dst, True)
                t1 = time.perf_counter()
                sunmap(dst)
                t2 = time.perf_counter()
                map_ms.append((t1 - t0) * 1e3)
                unmap_ms.append((t2 - t1) * 1e3)
            records.append(
                SharingRecord("map", n, float(statistics.median(map_ms)), repeats, device)
            )
            records.append(
                SharingRecord("unmap", n, float(statistics.median(unmap_ms)), repeats, device)
            )
        else:
            records.append(SharingRecord("map", n, 0.0, 1, device))
            records.append(SharingRecord("unmap", n, 0.0, 1, device))
    return records
