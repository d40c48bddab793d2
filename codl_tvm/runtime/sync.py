"""Co-execution synchronisation between the OpenCL device and the host CPU.

A co-executed chain enqueues its GPU part, runs its CPU part on the host, and synchronises only
where the CPU needs GPU results: :func:`gpu_mark` records "everything enqueued so far" on the
device queue and :func:`cpu_wait` blocks the host until that is done. The mechanism is chosen per
device (``auto``: measured on first use) and visible through :func:`sync_mode`:

- ``"flag"``: fine-grained SVM flag set by a tiny kernel, host polls it (the SVM paper);
- ``"event"``: a marker event, host polls its status;
- ``"finish"``: ``clFinish`` (exact only when nothing else is queued).

Polling backs off (pause, yield, short sleeps) and every wait times out with an error
(:func:`set_timeout_ms`, default 10 s) instead of hanging.

The other direction is carried on the device: :func:`gpu_gate` enqueues a barrier on a user
event, so the GPU work enqueued after it waits on the device, not on the host, until
:func:`cpu_signal` completes the event (after the CPU kernel producing its input). This lets
:class:`~codl_tvm.passes.issue_ahead.IssueGpuAhead` issue GPU kernels before the CPU kernels they
read. :func:`gates_supported` says whether a device can (user events, barriers with a wait
list, fine-grained SVM, a sync mode that waits for a mark); checked once per device.
"""

from __future__ import annotations

import json

from codl_tvm.runtime import load, plugin_function

__all__ = [
    "calibration",
    "cpu_signal",
    "cpu_view",
    "cpu_wait",
    "drain",
    "flag_supported",
    "gates_supported",
    "gates_unsupported_reason",
    "gpu_gate",
    "gpu_mark",
    "measure_sync_us",
    "set_sync_mode",
    "set_timeout_ms",
    "sync_mode",
]

MODES = ("auto", "flag", "event", "finish")


def set_sync_mode(mode: str) -> None:
    """Choose the mechanism for every device: "auto", "flag", "event" or "finish"."""
    if mode not in MODES:
        raise ValueError(f"sync mode must be one of {MODES}, not {mode!r}")
    load()
    plugin_function("codl.coexec.set_sync_mode")(mode)


def sync_mode(device_id: int = 0) -> str:
    """The mechanism used on ``opencl(device_id)`` (resolving "auto" by measurement)."""
    load()
    return str(plugin_function("codl.coexec.sync_mode")(device_id))


def calibration(device_id: int = 0) -> dict[str, float]:
    """The measurements behind an "auto" choice (``flag_us``, ``event_us``), if one was made."""
    load()
    return json.loads(plugin_function("codl.coexec.calibration")(device_id))


def flag_supported() -> bool:
    """Whether SVM flags can be used (fine-grained SVM with atomics)."""
    load()
    return bool(plugin_function("codl.coexec.flag_supported")())


def set_timeout_ms(ms: float) -> None:
    """Timeout of every co-execution wait, in milliseconds."""
    if ms <= 0:
        raise ValueError(f"timeout must be positive, not {ms}")
    load()
    plugin_function("codl.coexec.set_timeout_ms")(float(ms))


def gpu_mark(device_id: int = 0) -> int:
    """Mark everything enqueued so far on ``opencl(device_id)``; returns a handle for cpu_wait."""
    load()
    return int(plugin_function("codl.coexec.gpu_mark")(device_id))


def cpu_wait(handle: int) -> None:
    """Block until the work before mark ``handle`` is done (raises after the timeout)."""
    plugin_function("codl.coexec.cpu_wait")(handle)


def gates_supported(device_id: int = 0) -> bool:
    """Whether GPU work on ``opencl(device_id)`` can wait on the device for a CPU signal.

    Checked once per device and sync mode (a user event and a barrier are tried on the
    device); when it cannot, the runtime says why once on stderr
    (:func:`gates_unsupported_reason`).
    """
    load()
    return bool(plugin_function("codl.coexec.gates_supported")(device_id))


def gates_unsupported_reason(device_id: int = 0) -> str:
    """Why :func:`gates_supported` is False on ``opencl(device_id)``; empty when it is True."""
    load()
    return str(plugin_function("codl.coexec.gates_unsupported_reason")(device_id))


def gpu_gate(device_id: int = 0) -> int:
    """Hold the GPU work enqueued from now on until :func:`cpu_signal` of the returned handle.

    Raises a RuntimeError where :func:`gates_supported` is False.
    """
    load()
    return int(plugin_function("codl.coexec.gpu_gate")(device_id))


def cpu_signal(handle: int) -> None:
    """Release the GPU work held by gate ``handle`` (each gate is signalled once)."""
    plugin_function("codl.coexec.cpu_signal")(handle)


def drain(device_id: int = 0) -> None:
    """Wait until ``opencl(device_id)`` has run all the GPU work it can: all of it, or with a gate
    pending all that was enqueued before the oldest pending gate (a full ``clFinish`` would
    wait for a signal only this thread can give)."""
    load()
    plugin_function("codl.coexec.drain")(device_id)


def cpu_view(tensor):
    """A CPU tensor over an OpenCL tensor's SVM bytes (CPU tensors are returned as they are)."""
    load()
    return plugin_function("codl.coexec.cpu_view")(tensor)


def measure_sync_us(mode: str, device_id: int = 0, repeat: int = 200) -> float:
    """Median cost in microseconds of one mark + wait with ``mode`` after the queue drained."""
    load()
    return float(plugin_function("codl.coexec.measure_us")(device_id, mode, repeat))


def _block_queue(device_id: int = 0) -> int:
    """Stall the device queue behind a user event (for tests of the timeout path)."""
    return int(plugin_function("codl.coexec.block_queue")(device_id))


def _unblock_queue(handle: int) -> None:
    plugin_function("codl.coexec.unblock_queue")(handle)
