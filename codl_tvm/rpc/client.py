"""Talking to TVM's RPC tracker with bounded waits, and checking a remote's versions.

TVM's own ``TrackerSession.request`` waits forever for a free device and retries a refused
tracker for a minute; the functions here give up after a configurable number of seconds with an
error that names the tracker, the key and what the tracker reported.

- :func:`request_remote` asks the tracker for one device of a key and connects to it;
- :func:`wait_for_devices` / :func:`tracker_summary` read the tracker's queue;
- :func:`remote_versions` / :func:`check_remote_versions` read the TVM version a server runs
  (servers started by ``codl-tvm serve``, :mod:`codl_tvm.rpc.server`, expose
  ``codl_tvm.rpc.versions``) before anything is uploaded.

The names of the functions a codl-tvm server registers (:data:`VERSIONS_FUNC`,
:data:`PLUGIN_LOAD_FUNC`) and the plugin fields it reports (:data:`PLUGIN_FIELDS`) live here:
they are the protocol both sides speak. This module imports only the standard library, TVM's
runtime and :mod:`codl_tvm.core.errors`, so that the server of an emulated or runtime-only board
can import it.

Errors derive from :class:`~codl_tvm.core.errors.RPCError`; failures of a connected device
raise :class:`~codl_tvm.core.errors.RemoteFailure`, which names the device.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
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
    "PLUGIN_FIELDS",
    "PLUGIN_LOAD_FUNC",
    "VERSIONS_FUNC",
    "NoFreeDevice",
    "RPCError",
    "RemoteDevice",
    "RemoteFailure",
    "TrackerUnreachable",
    "VersionMismatch",
    "check_remote_versions",
    "local_versions",
    "parse_address",
    "remote_versions",
    "request_remote",
    "tracker_address",
    "tracker_summary",
    "version_mismatches",
    "wait_for_devices",
]

#: The function a codl-tvm server registers to report its versions (:func:`local_versions`).
VERSIONS_FUNC = "codl_tvm.rpc.versions"
#: The function a server started with ``--opencl`` registers to load an uploaded plugin.
PLUGIN_LOAD_FUNC = "codl_tvm.rpc.load_plugin"
#: Plugin description fields a server reports (prefixed ``plugin_``) and clients compare.
PLUGIN_FIELDS = ("machine", "tvm", "tvm_ffi", "sources_sha256", "target")

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


def tracker_address(tracker: str | tuple[str, int]) -> tuple[str, int]:
    """``(host, port)`` of ``"HOST:PORT"`` or of a ``(host, port)`` pair."""
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
    addr = tracker_address(tracker)
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
    host, port = tracker_address(tracker)
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
    addr = tracker_address(tracker)
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
                "server); start it with `codl-tvm serve` to check versions"
            )
        return None
    diffs = version_mismatches(remote_info, local_versions())
    if diffs:
        raise VersionMismatch(
            f"remote device {remote.name} runs a different TVM ({'; '.join(diffs)}); install "
            f"the same apache-tvm version on both sides before deploying"
        )
    return remote_info
