"""The device a cost model was fitted on, and whether it is the device a compile targets.

A cost model predicts the processors it was measured on: its ``meta["device"]`` records them
as the profiler described them (:func:`codl_tvm.profiling.sessions.device_description`: the
OpenCL platform and device, compute units, SVM mode, the CPU target and thread count; on an
emulated SoC the compute units and threads are its core split). Applied to another device its
decisions are guesses, so a compile says so and checks them by measurement
(:mod:`codl_tvm.objectives.latency`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from codl_tvm import runtime

__all__ = [
    "describe_device",
    "device_mismatch",
    "fitted_device",
    "local_device",
    "merge_devices",
    "record_devices",
]

# What identifies a device pair; the targets JSON and the "remote" flag describe the session.
_KEYS = ("gpu", "platform", "compute_units", "svm_mode", "cpu_threads")


def record_devices(records: Iterable[Any]) -> list[dict[str, Any]]:
    """The distinct devices of dataset records (each record's ``device``), in order."""
    seen: dict[tuple, dict[str, Any]] = {}
    for r in records:
        device = {k: r.device[k] for k in _KEYS if k in (r.device or {})}
        seen.setdefault(tuple(sorted(device.items())), device)
    return [d for d in seen.values() if d]


def merge_devices(devices: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The one device of a fit's datasets (their ``device`` lines), or None when they name
    none; datasets of several devices give the first with ``"mixed": True``."""
    found = [{k: d[k] for k in _KEYS if k in d} for d in devices]
    if not found:
        return None
    first = dict(found[0])
    if any(d != found[0] for d in found[1:]):
        first["mixed"] = True
    return first


def fitted_device(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The device a cost model's ``meta`` records (None for a model fitted before it did)."""
    device = meta.get("device")
    return dict(device) if isinstance(device, Mapping) else None


def _platform_name(platform: str) -> str:
    """``"NVIDIA CUDA (OpenCL 3.0 CUDA 13.0.98)"`` -> ``"NVIDIA CUDA"``: the name without the
    driver version, which changes with every driver update."""
    return platform.split(" (")[0].strip()


def describe_device(device: Mapping[str, Any]) -> str:
    """One line: ``NVIDIA H100 80GB HBM3 (NVIDIA CUDA, 132 compute units) with 16 CPU threads``."""
    units = device.get("compute_units")
    what = _platform_name(str(device.get("platform", "?")))
    if units:
        what += f", {units} compute units"
    text = f"{device.get('gpu', '?')} ({what})"
    if device.get("cpu_threads"):
        text += f" with {device['cpu_threads']} CPU threads"
    return text


def local_device() -> dict[str, Any] | None:
    """This machine's OpenCL device and CPU threads as :func:`describe_device` reads them
    (None without a usable OpenCL device)."""
    if not runtime.is_available():
        return None
    info = runtime.info()
    dev = info.devices[0]
    threads = os.environ.get("TVM_NUM_THREADS")
    return {
        "gpu": dev.name,
        "platform": f"{info.platform} ({info.platform_version})",
        "compute_units": dev.compute_units,
        "cpu_threads": int(threads) if threads and threads.isdigit() else os.cpu_count(),
    }


def device_mismatch(fitted: Mapping[str, Any] | None, here: Mapping[str, Any]) -> str | None:
    """Why a cost model fitted on ``fitted`` does not describe ``here`` (None: it does).

    The OpenCL device, its platform (not the driver version), its compute units and the CPU's
    thread count must match: any of them moves the balance between the two processors.
    """
    if fitted is None:
        return "it does not record the device it was fitted on"
    diffs = []
    if fitted.get("gpu") != here.get("gpu"):
        diffs.append("device")
    if _platform_name(str(fitted.get("platform", ""))) != _platform_name(
        str(here.get("platform", ""))
    ):
        diffs.append("platform")
    for key, what in (("compute_units", "compute units"), ("cpu_threads", "CPU threads")):
        if fitted.get(key) and here.get(key) and fitted[key] != here[key]:
            diffs.append(what)
    if not diffs:
        return None
    return (
        f"it was fitted on {describe_device(fitted)}, not {describe_device(here)} "
        f"({', '.join(diffs)} differ)"
    )
