"""TVM RPC helpers with bounded waits: tracker requests, version checks, device farms, a server.

TVM's own ``TrackerSession.request`` waits forever for a free device and retries a refused
tracker for a minute; the functions here give up after a configurable number of seconds with an
error that names the tracker, the key and what the tracker reported.

- :func:`request_remote` asks the tracker for one device of a key and connects to it;
- :func:`remote_versions` / :func:`check_remote_versions` read the TVM version a server runs
  (servers started by :func:`serve` expose ``codl_tvm.rpc.versions``) before anything is
  uploaded;
- :class:`DeviceFarm` takes every free device of a key and spreads jobs over them in threads,
  with a per-job timeout and retries (used by the profiler);
- ``python -m codl_tvm.rpc.client serve --tracker HOST:PORT --key KEY`` starts TVM's RPC server
  with the version function registered. The file also runs as a plain script beside a minimal
  ``codl_tvm`` package (``__init__.py`` and ``errors.py``: it imports only those, the standard
  library and TVM), which is how the emulated aarch64 device uses it.

Errors derive from :class:`RPCError`; failures of a connected device raise
:class:`RemoteFailure`, which names the device.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import os
import platform
import queue
import shutil
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm.rpc
import tvm_ffi

from codl_tvm.core.errors import (
    NoFreeDevice,
    RemoteFailure,
    RPCError,
    TrackerUnreachable,
    VersionMismatch,
)

__all__ = [
    "DeviceFarm",
    "JobResult",
    "NoFreeDevice",
    "RPCError",
    "RemoteDevice",
    "RemoteFailure",
    "TrackerUnreachable",
    "VersionMismatch",
    "check_remote_versions",
    "local_versions",
    "parse_address",
    "plugin_mismatches",
    "remote_plugin",
    "remote_versions",
    "request_remote",
    "serve",
    "tracker_summary",
    "upload_plugin",
    "version_mismatches",
    "wait_for_devices",
]

VERSIONS_FUNC = "codl_tvm.rpc.versions"

# TVM's tracker protocol (tvm.rpc.base): magic word, then length-prefixed JSON messages.
_TRACKER_MAGIC = 0x2F271
_CODE_SUCCESS, _CODE_REQUEST, _CODE_SUMMARY = 0, 4, 6


def parse_address(text: str, what: str = "tracker") -> tuple[str, int]:
    """Parse ``HOST:PORT``.

    Raises
    ------
    ValueError
        Not of the form ``HOST:PORT`` with a port in 1..65535.
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} address {text!r} is not HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


def _address(tracker: str | tuple[str, int]) -> tuple[str, int]:
    return parse_address(tracker) if isinstance(tracker, str) else (tracker[0], int(tracker[1]))


def _recvall(sock: socket.socket, nbytes: int) -> bytes:
    chunks, left = [], nbytes
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("connection closed by the peer")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _send_json(sock: socket.socket, value: Any) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack("<i", len(data)) + data)


def _recv_json(sock: socket.socket) -> Any:
    (size,) = struct.unpack("<i", _recvall(sock, 4))
    return json.loads(_recvall(sock, size).decode())


def _open_tracker(addr: tuple[str, int], timeout_s: float) -> socket.socket:
    where = f"{addr[0]}:{addr[1]}"
    try:
        sock = socket.create_connection(addr, timeout=timeout_s)
    except OSError as exc:
        raise TrackerUnreachable(
            f"cannot reach the RPC tracker at {where} within {timeout_s:g} s: {exc}; start one "
            f"with `python -m tvm.exec.rpc_tracker --host {addr[0]} --port {addr[1]}`"
        ) from None
    try:
        sock.sendall(struct.pack("<i", _TRACKER_MAGIC))
        (magic,) = struct.unpack("<i", _recvall(sock, 4))
    except OSError as exc:
        sock.close()
        raise TrackerUnreachable(
            f"{where} accepted a connection but did not answer as a TVM "
            f"RPC tracker within {timeout_s:g} s: {exc}"
        ) from None
    if magic != _TRACKER_MAGIC:
        sock.close()
        raise TrackerUnreachable(f"{where} is not a TVM RPC tracker (wrong magic {magic:#x})")
    return sock


def tracker_summary(tracker: str | tuple[str, int], timeout_s: float = 5.0) -> dict:
    """The tracker's summary: ``{"queue_info": {key: {"free", "pending"}}, "server_info": [...]}``.

    Raises
    ------
    TrackerUnreachable
        No tracker answers at ``tracker`` within ``timeout_s``.
    """
    addr = _address(tracker)
    sock = _open_tracker(addr, timeout_s)
    try:
        _send_json(sock, [_CODE_SUMMARY])
        code, summary = _recv_json(sock)
    except OSError as exc:
        raise TrackerUnreachable(
            f"tracker {addr[0]}:{addr[1]} did not send its summary within {timeout_s:g} s: {exc}"
        ) from None
    finally:
        sock.close()
    if code != _CODE_SUCCESS:
        raise RPCError(f"tracker {addr[0]}:{addr[1]} refused the summary request ({code})")
    return summary


def _key_status(summary: dict, key: str) -> tuple[int, int, int]:
    """(registered servers, free, pending requests) of ``key``."""
    servers = sum(1 for s in summary.get("server_info", []) if s.get("key") == f"server:{key}")
    q = summary.get("queue_info", {}).get(key, {})
    return servers, int(q.get("free", 0)), int(q.get("pending", 0))


def _describe_keys(summary: dict) -> str:
    keys = sorted({s["key"].split(":", 1)[-1] for s in summary.get("server_info", [])})
    return ", ".join(keys) if keys else "none"


def wait_for_devices(
    tracker: str | tuple[str, int], key: str, count: int = 1, timeout_s: float = 30.0
) -> int:
    """Wait until at least ``count`` devices of ``key`` are free; return how many are.

    A tracker that is not up yet is retried until the deadline too.

    Raises
    ------
    TrackerUnreachable
        No tracker answered within ``timeout_s``.
    NoFreeDevice
        Fewer than ``count`` are free after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            summary = tracker_summary(tracker, timeout_s=max(1.0, min(5.0, timeout_s)))
        except TrackerUnreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
            continue
        _, free, _ = _key_status(summary, key)
        if free >= count:
            return free
        if time.monotonic() >= deadline:
            raise NoFreeDevice(_no_device_message(tracker, key, summary, timeout_s, count))
        time.sleep(0.2)


def _no_device_message(tracker, key: str, summary: dict, timeout_s: float, count: int = 1) -> str:
    host, port = _address(tracker)
    servers, free, _pending = _key_status(summary, key)
    if servers == 0:
        return (
            f"no device registered under key '{key}' at tracker {host}:{port} (waited "
            f"{timeout_s:g} s); keys registered there: {_describe_keys(summary)}"
        )
    return (
        f"no free device under key '{key}' at tracker {host}:{port} after {timeout_s:g} s: "
        f"{servers} registered, {free} free, {count} wanted (the others are in use)"
    )


@dataclass
class RemoteDevice:
    """A connected remote device.

    Attributes
    ----------
    session
        The ``tvm.rpc.RPCSession``.
    key
        The tracker key it was requested under.
    host, port
        The RPC server's address.
    """

    session: Any
    key: str
    host: str
    port: int
    _closed: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        """``key@host:port``, used in every error about this device."""
        return f"{self.key}@{self.host}:{self.port}"

    def call(self, stage: str, func: Callable[[], Any]) -> Any:
        """Run ``func()``; re-raise any failure as :class:`RemoteFailure` naming this device."""
        try:
            return func()
        except RemoteFailure:
            raise
        except Exception as exc:  # TVMError, ConnectionError, RPC errors alike
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            raise RemoteFailure(self.name, stage, lines[-1] if lines else repr(exc)) from exc

    def close(self) -> None:
        """Drop the session (the server then serves the next client)."""
        if not self._closed:
            self._closed = True
            self.session = None
            # TVM's RPCSession has no close(): the connection ends when the last reference to it
            # goes. Remote tensors/VMs caught in reference cycles (closures, tracebacks) would keep
            # the device busy until the next garbage collection, so collect now.
            gc.collect()


def request_remote(
    tracker: str | tuple[str, int],
    key: str,
    timeout_s: float = 10.0,
    session_timeout_s: float = 0.0,
    priority: int = 1,
) -> RemoteDevice:
    """Ask the tracker for a device of ``key`` and connect to it, waiting at most ``timeout_s``.

    Parameters
    ----------
    tracker
        ``"HOST:PORT"`` or ``(host, port)`` of the TVM RPC tracker.
    key
        The device key the servers registered with.
    timeout_s
        Bound on reaching the tracker, waiting for a free device, and connecting to it.
    session_timeout_s
        The server ends the session after this many seconds (0: no limit).
    priority
        The tracker's request priority.

    Raises
    ------
    TrackerUnreachable, NoFreeDevice, RemoteFailure
    """
    addr = _address(tracker)
    deadline = time.monotonic() + timeout_s
    sock = _open_tracker(addr, timeout_s)
    try:
        _send_json(sock, [_CODE_REQUEST, key, "", priority])
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            code, value = _recv_json(sock)
        except TimeoutError:
            summary = tracker_summary(addr, timeout_s=5.0)
            raise NoFreeDevice(_no_device_message(addr, key, summary, timeout_s)) from None
        except OSError as exc:
            raise TrackerUnreachable(
                f"tracker {addr[0]}:{addr[1]} dropped the request for '{key}': {exc}"
            ) from None
    finally:
        sock.close()  # the tracker forgets a request whose connection closed
    if code != _CODE_SUCCESS:
        raise RPCError(f"tracker {addr[0]}:{addr[1]} refused the request for '{key}' ({code})")
    host, port, matchkey = value
    device_name = f"{key}@{host}:{port}"
    left = max(1.0, deadline - time.monotonic())
    box: dict[str, Any] = {}

    def _connect() -> None:
        try:
            box["sess"] = tvm.rpc.connect(host, port, matchkey, session_timeout=session_timeout_s)
        except Exception as exc:
            box["err"] = exc

    worker = threading.Thread(target=_connect, daemon=True, name=f"rpc-connect-{device_name}")
    worker.start()
    worker.join(left)
    if worker.is_alive():
        raise RemoteFailure(device_name, "connecting", f"no answer within {left:.1f} s")
    if "err" in box:
        lines = str(box["err"]).strip().splitlines()
        raise RemoteFailure(device_name, "connecting", lines[-1] if lines else repr(box["err"]))
    return RemoteDevice(box["sess"], key, host, int(port))


def local_versions(opencl: bool | None = None) -> dict[str, str]:
    """Versions and platform of this process: what a server reports through ``VERSIONS_FUNC``."""
    ffi_version = getattr(tvm_ffi, "__version__", "unknown")
    info = {
        "tvm": tvm.__version__,
        "tvm_ffi": ffi_version,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "system": platform.system(),
        "android": "1"
        if hasattr(sys, "getandroidapilevel") or "ANDROID_ROOT" in os.environ
        else "0",
    }
    if opencl is not None:
        info["opencl"] = "1" if opencl else "0"
    return info


def remote_versions(remote: RemoteDevice, timeout_s: float = 10.0) -> dict[str, str] | None:
    """What the remote reports through ``codl_tvm.rpc.versions``, or ``None`` if it has no such
    function (a stock TVM RPC server, e.g. TVM's Android RPC app).

    Raises
    ------
    RemoteFailure
        The remote did not answer within ``timeout_s``.
    """
    box: dict[str, Any] = {}

    def _query() -> None:
        try:
            func = remote.session.get_function(VERSIONS_FUNC)
            box["value"] = None if func is None else json.loads(str(func()))
        except Exception as exc:
            box["err"] = exc

    worker = threading.Thread(target=_query, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RemoteFailure(remote.name, "reading its versions", f"no answer in {timeout_s:g} s")
    err = box.get("err")
    if err is not None:
        text = str(err)
        if isinstance(err, AttributeError) or "has no function" in text:
            return None
        raise RemoteFailure(remote.name, "reading its versions", text.strip().splitlines()[-1])
    return box.get("value")


def version_mismatches(remote_info: dict[str, str], local_info: dict[str, str]) -> list[str]:
    """Human-readable differences in the ``tvm`` and ``tvm_ffi`` versions (empty: compatible)."""
    return [
        f"{name} {remote_info.get(name, 'unknown')} there, {local_info.get(name)} here"
        for name in ("tvm", "tvm_ffi")
        if remote_info.get(name) != local_info.get(name)
    ]


def check_remote_versions(remote: RemoteDevice, strict: bool = False) -> dict[str, str] | None:
    """Compare the remote's TVM and tvm-ffi versions with this machine's, before any upload.

    Returns the remote's report (``None`` for a server that cannot report; with ``strict`` that
    raises instead).

    Raises
    ------
    VersionMismatch
        The remote's ``tvm`` or ``tvm_ffi`` version differs from the local one.
    """
    remote_info = remote_versions(remote)
    if remote_info is None:
        if strict:
            raise VersionMismatch(
                f"remote device {remote.name} does not report its TVM version (a stock TVM RPC "
                "server); start it with `python -m codl_tvm.rpc.client serve` to check versions"
            )
        return None
    diffs = version_mismatches(remote_info, local_versions())
    if diffs:
        raise VersionMismatch(
            f"remote device {remote.name} runs a different TVM ({'; '.join(diffs)}); install "
            f"the same apache-tvm version on both sides before deploying"
        )
    return remote_info


@dataclass(frozen=True)
class JobResult:
    """The outcome of one farm job.

    Attributes
    ----------
    index
        The job's position in the list given to :meth:`DeviceFarm.run`.
    value
        What the job returned (``None`` on failure).
    error
        Why the last attempt failed, or ``None``.
    device
        The device of the last attempt.
    attempts
        How many times the job ran.
    """

    index: int
    value: Any
    error: str | None
    device: str | None
    attempts: int

    @property
    def ok(self) -> bool:
        return self.error is None


class DeviceFarm:
    """Every free device of one key, running jobs in parallel threads.

    Use as a context manager::

        with DeviceFarm("127.0.0.1:9190", "android", request_timeout_s=10) as farm:
            results = farm.run([job1, job2, ...], job_timeout_s=60, retries=1)

    A job is a callable ``job(remote: RemoteDevice) -> value``. Each device runs one job at a time.
    A job that raises or exceeds ``job_timeout_s`` is retried (on any device) up to ``retries``
    more times; a device whose session no longer answers is dropped from the farm; jobs left
    when every device is gone fail with the reason.

    Parameters
    ----------
    tracker, key
        The tracker address and device key.
    max_devices
        Use at most this many devices (default: all free ones).
    request_timeout_s
        Bound on getting the devices (at least one must be free).
    session_timeout_s
        Server-side session limit (0: none); it also frees a device stuck in a job.
    """

    def __init__(
        self,
        tracker: str | tuple[str, int],
        key: str,
        max_devices: int | None = None,
        request_timeout_s: float = 10.0,
        session_timeout_s: float = 0.0,
    ) -> None:
        self.tracker = _address(tracker)
        self.key = key
        self.max_devices = max_devices
        self.request_timeout_s = request_timeout_s
        self.session_timeout_s = session_timeout_s
        self.devices: list[RemoteDevice] = []

    def __enter__(self) -> DeviceFarm:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> list[RemoteDevice]:
        """Request every free device of the key (at least one, within the request timeout)."""
        free = wait_for_devices(self.tracker, self.key, 1, self.request_timeout_s)
        want = free if self.max_devices is None else min(free, self.max_devices)
        for _ in range(want):
            try:
                self.devices.append(
                    request_remote(
                        self.tracker,
                        self.key,
                        timeout_s=2.0,
                        session_timeout_s=self.session_timeout_s,
                    )
                )
            except (NoFreeDevice, RemoteFailure):
                break  # taken by someone else in the meantime, or broken
        if not self.devices:
            self.devices.append(
                request_remote(
                    self.tracker, self.key, self.request_timeout_s, self.session_timeout_s
                )
            )
        return self.devices

    def close(self) -> None:
        for dev in self.devices:
            dev.close()
        self.devices = []

    @staticmethod
    def _alive(dev: RemoteDevice, timeout_s: float = 5.0) -> bool:
        box: dict[str, bool] = {}

        def _probe() -> None:
            try:
                dev.session.get_function("tvm.rpc.server.workpath")("probe")
                box["ok"] = True
            except Exception:
                box["ok"] = False

        worker = threading.Thread(target=_probe, daemon=True)
        worker.start()
        worker.join(timeout_s)
        return box.get("ok", False)

    def run(
        self,
        jobs: Sequence[Callable[[RemoteDevice], Any]],
        job_timeout_s: float = 60.0,
        retries: int = 1,
        on_failure: Callable[[int, str, str, bool], None] | None = None,
    ) -> list[JobResult]:
        """Run ``jobs`` over the farm's devices; results come back in job order.

        ``on_failure(job_index, device_name, error, retried)`` is called (from a worker thread)
        for every failed attempt, so callers can log which device failed.
        """
        if not self.devices:
            self.open()
        pending: queue.Queue[tuple[int, int]] = queue.Queue()
        for i in range(len(jobs)):
            pending.put((i, 0))
        results: dict[int, JobResult] = {}
        lock = threading.Lock()
        live = [len(self.devices)]

        def _finish(i: int, result: JobResult) -> None:
            with lock:
                results[i] = result

        def _worker(dev: RemoteDevice) -> None:
            while True:
                with lock:
                    if len(results) == len(jobs):
                        return
                try:
                    i, done = pending.get(timeout=0.1)
                except queue.Empty:
                    continue
                box: dict[str, Any] = {}

                def _job(i: int = i) -> None:
                    try:
                        box["value"] = dev.call(f"running job {i}", lambda: jobs[i](dev))
                    except Exception as exc:
                        box["err"] = str(exc)

                runner = threading.Thread(target=_job, daemon=True)
                runner.start()
                runner.join(job_timeout_s)
                attempts = done + 1
                if runner.is_alive():
                    err = f"job {i} timed out after {job_timeout_s:g} s on {dev.name}"
                elif "err" in box:
                    err = box["err"]
                else:
                    _finish(i, JobResult(i, box.get("value"), None, dev.name, attempts))
                    continue
                healthy = not runner.is_alive() and self._alive(dev)
                if on_failure is not None:
                    try:
                        on_failure(i, dev.name, err, attempts <= retries)
                    except Exception:  # a logging callback must not stop the farm
                        pass
                if attempts <= retries:
                    pending.put((i, attempts))
                else:
                    _finish(i, JobResult(i, None, err, dev.name, attempts))
                if not healthy:
                    with lock:
                        live[0] -= 1
                        last = live[0] == 0
                        if dev in self.devices:
                            self.devices.remove(dev)  # dropped from the farm for good
                    if last:  # nobody is left to run the queue: fail what remains
                        while True:
                            try:
                                j, n = pending.get_nowait()
                            except queue.Empty:
                                break
                            _finish(
                                j,
                                JobResult(
                                    j,
                                    None,
                                    f"no live device left under key "
                                    f"'{self.key}' (last error: {err})",
                                    None,
                                    n,
                                ),
                            )
                    return

        threads = [
            threading.Thread(target=_worker, args=(d,), daemon=True, name=f"farm-{d.name}")
            for d in self.devices
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[i] for i in range(len(jobs))]


PLUGIN_LOAD_FUNC = "codl_tvm.rpc.load_plugin"
#: Plugin description fields a server reports (prefixed ``plugin_``) and clients compare.
PLUGIN_FIELDS = ("machine", "tvm", "tvm_ffi", "sources_sha256", "target")


def _plugin_store(plugin_dir: str | None) -> str:
    """Where a server keeps uploaded plugins (they outlive the session that uploaded them)."""
    if plugin_dir:
        return plugin_dir
    root = os.environ.get("CODL_TVM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "codl-tvm"
    )
    return os.path.join(root, "plugins")


def _stored_plugin(plugin_dir: str) -> str | None:
    """The newest plugin uploaded to this server earlier, if any."""
    try:
        libs = [
            os.path.join(plugin_dir, n)
            for n in os.listdir(plugin_dir)
            if n.startswith("libcodl_tvm_opencl") and n.endswith(".so")
        ]
    except OSError:
        return None
    return max(libs, key=os.path.getmtime) if libs else None


def _load_plugin(info: dict[str, str], path: str | None) -> None:
    """Load the OpenCL plugin (``path``, else ``CODL_TVM_PLUGIN_LIB``, else built here on first
    use) and record in ``info`` what it is, or why it is missing or failed.

    OpenCL itself is not initialised here: TVM's server forks a process per session from the one
    that ran this, and a driver's threads (PoCL's workers) do not survive a fork; each session
    initialises OpenCL in its own process (:func:`_probe_opencl`).
    """
    # deferred: the emulated aarch64 device runs this file as a script beside a minimal package
    # (codl_tvm/__init__.py, errors.py, runtime/); the runtime is needed only with --opencl
    from codl_tvm import runtime
    from codl_tvm.runtime import plugin_build as _build

    if path:
        os.environ["CODL_TVM_PLUGIN_LIB"] = path
    path = os.environ.get("CODL_TVM_PLUGIN_LIB")
    compilers = (os.environ.get("CXX"), "c++", "g++", "clang++")  # tvm_ffi's build honours CXX
    if not path and not any(c and shutil.which(c) for c in compilers):
        info.update(
            opencl="0",
            plugin_state="missing",
            opencl_error="no OpenCL plugin on this server and no C++ compiler to build it",
        )
        return
    try:
        loaded = runtime.load()
        desc = _build.plugin_description(loaded)
    except Exception as exc:  # reported to clients instead of failing the server
        info.update(opencl="0", plugin_state="failed")
        info["opencl_error"] = (
            f"loading the OpenCL plugin {path or ''} failed: "
            + (str(exc).strip().splitlines()[-1][:300])
        )
        return
    info.update({f"plugin_{k}": desc[k] for k in PLUGIN_FIELDS if k in desc})
    info.update(opencl="0", plugin_state="loaded")
    info.pop("opencl_error", None)


def _probe_opencl(info: dict[str, str]) -> None:
    """Initialise OpenCL through the loaded plugin and record the device and SVM mode, or why
    there is none (no platform, no device)."""
    from codl_tvm import runtime  # deferred: see _load_plugin

    try:
        cl = runtime.info()
    except Exception as exc:
        info["opencl_error"] = "OpenCL: " + str(exc).strip().splitlines()[-1][:300]
        return
    info.update(opencl="1", svm=cl.svm_mode)
    info["opencl_device"] = f"{cl.platform}: {', '.join(d.name for d in cl.devices)}"


def _register_versions(opencl: bool = False, plugin_dir: str | None = None) -> None:
    """Server init callback: register ``codl_tvm.rpc.versions`` (runs in the server process)
    and, with ``opencl``, load the OpenCL plugin and register ``codl_tvm.rpc.load_plugin``."""
    info = local_versions(opencl=opencl)
    emulated = os.environ.get("CODL_TVM_EMULATED")
    if emulated:
        info["emulated"] = emulated
    store = _plugin_store(plugin_dir)
    if opencl:
        _load_plugin(info, None if os.environ.get("CODL_TVM_PLUGIN_LIB") else _stored_plugin(store))

        @tvm_ffi.register_global_func(PLUGIN_LOAD_FUNC, override=True)
        def _load_uploaded(path: str, name: str) -> str:
            # kept beside earlier uploads: later sessions load it when first asked (_versions)
            os.makedirs(store, exist_ok=True)
            kept = os.path.join(store, name)
            shutil.copyfile(path, kept)
            if os.path.isfile(path + ".json"):
                shutil.copyfile(path + ".json", kept + ".json")
            return _versions()

    @tvm_ffi.register_global_func(VERSIONS_FUNC, override=True)
    def _versions() -> str:
        # runs in the session's process: OpenCL is initialised here, once per session
        if opencl:
            if info.get("plugin_state") == "missing":
                stored = _stored_plugin(store)
                if stored:
                    _load_plugin(info, stored)
            if info.get("plugin_state") == "loaded" and info.get("opencl") != "1":
                if "opencl_error" not in info:
                    _probe_opencl(info)
        return json.dumps(info)


def plugin_mismatches(
    plugin: dict[str, str], remote_info: dict[str, str], sources_sha256: str | None = None
) -> list[str]:
    """Why a plugin described by ``plugin`` (``codl_tvm.runtime.plugin_build.plugin_description``)
    cannot serve a remote that reported ``remote_info`` (empty: it can).

    ``sources_sha256`` is the hash of this codl-tvm's plugin sources: a plugin built from other
    sources may lack builtins that models compiled here call, or call them differently.
    """
    problems = []
    machine = remote_info.get("machine", "").replace("arm64", "aarch64")
    if plugin.get("machine") and machine and plugin["machine"] != machine:
        problems.append(f"it is built for {plugin['machine']}, the device is {machine}")
    for name in ("tvm", "tvm_ffi"):
        theirs = remote_info.get(name)
        if plugin.get(name) and theirs and plugin[name] != theirs:
            problems.append(f"it is built for {name} {plugin[name]}, the device runs {theirs}")
    ours = plugin.get("sources_sha256")
    if ours and sources_sha256 and ours != sources_sha256:
        problems.append(
            f"it is built from other codl-tvm runtime sources ({ours[:12]} there, "
            f"{sources_sha256[:12]} here)"
        )
    return problems


def remote_plugin(remote_info: dict[str, str]) -> dict[str, str]:
    """The description of the plugin a server loaded, from its ``plugin_*`` fields."""
    return {k: remote_info[f"plugin_{k}"] for k in PLUGIN_FIELDS if f"plugin_{k}" in remote_info}


def upload_plugin(remote: RemoteDevice, path: str, timeout_s: float = 300.0) -> dict[str, str]:
    """Upload the plugin at ``path`` (and its ``.json`` description) and have the server load
    it; return the server's new report.

    Raises
    ------
    RemoteFailure
        The server has no ``codl_tvm.rpc.load_plugin`` (not started with ``--opencl``), or the
        upload or load failed or took longer than ``timeout_s``.
    """
    sess = remote.session
    base = os.path.basename(path)
    stem, ext = os.path.splitext(base)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()[:16]
    name = f"{stem}-{digest}{ext}"

    def _upload() -> str:
        sess.upload(path, name)
        if os.path.isfile(path + ".json"):
            sess.upload(path + ".json", name + ".json")
        func = sess.get_function(PLUGIN_LOAD_FUNC)
        if func is None:
            raise RPCError(
                f"the server has no {PLUGIN_LOAD_FUNC}; start it with "
                "`python -m codl_tvm.rpc.client serve --opencl`"
            )
        remote_dir = sess.get_function("tvm.rpc.server.workpath")(name)
        return str(func(remote_dir, name))

    box: dict[str, Any] = {}

    def _run() -> None:
        try:
            box["value"] = remote.call("loading the uploaded OpenCL plugin", _upload)
        except Exception as exc:
            box["err"] = exc

    worker = threading.Thread(target=_run, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise RemoteFailure(
            remote.name, "loading the uploaded OpenCL plugin", f"no answer in {timeout_s:g} s"
        )
    if "err" in box:
        raise box["err"]
    return json.loads(box["value"])


def serve(
    tracker: str,
    key: str,
    host: str = "127.0.0.1",
    port: int = 9090,
    port_end: int | None = None,
    opencl: bool = False,
    silent: bool = False,
    plugin_dir: str | None = None,
) -> None:
    """Run TVM's RPC server registered with ``tracker`` under ``key`` until killed.

    The server answers ``codl_tvm.rpc.versions`` (TVM, tvm-ffi, Python, machine), so clients can
    check versions before uploading. ``opencl=True`` loads codl-tvm's OpenCL plugin in the server:
    ``CODL_TVM_PLUGIN_LIB``, else the newest one uploaded earlier (kept in ``plugin_dir``,
    default ``plugins`` under codl-tvm's cache), else built on first use where a C++ compiler
    exists; without any it reports the plugin missing, and clients upload one
    (:func:`upload_plugin`).
    """
    url, tport = parse_address(tracker)
    init = functools.partial(_register_versions, opencl, plugin_dir)
    server = tvm.rpc.Server(
        host,
        port,
        port_end or port + 100,
        key=key,
        tracker_addr=(url, tport),
        silent=silent,
        server_init_callback=init,
    )
    print(
        f"codl-tvm RPC server on {host}:{server.port}, key '{key}', tracker {tracker}", flush=True
    )
    server.proc.join()


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codl_tvm.rpc.client", description="codl-tvm RPC helpers"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="start a TVM RPC server that reports its versions")
    p.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    p.add_argument("--key", required=True, help="device key to register under")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--port-end", type=int, default=None)
    p.add_argument("--opencl", action="store_true", help="load codl-tvm's OpenCL plugin")
    p.add_argument("--silent", action="store_true")
    p.add_argument("--plugin-dir", help="where uploaded OpenCL plugins are kept")
    p.add_argument(
        "--python",
        help="interpreter for the server's worker processes (sets "
        "sys.executable; used by the emulated device, whose workers run under qemu)",
    )
    q = sub.add_parser("summary", help="print the tracker's queue")
    q.add_argument("--tracker", required=True)
    q.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "summary":
        print(json.dumps(tracker_summary(args.tracker, args.timeout), indent=2))
        return 0
    if args.python:
        sys.executable = args.python
    serve(
        args.tracker,
        args.key,
        args.host,
        args.port,
        args.port_end,
        args.opencl,
        args.silent,
        args.plugin_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
