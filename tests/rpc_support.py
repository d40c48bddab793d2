"""What the RPC tests share: a free local port, the command of TVM's tracker on it, the command
of codl-tvm's RPC server, the processes a test module starts (the tracker among them), and the
lines the library logs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from codl_tvm.rpc import client as rpc_client


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tracker_command(port: int) -> list[str]:
    """``python -m tvm.exec.rpc_tracker`` on 127.0.0.1:``port`` (and only that port)."""
    return [
        *(sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1"),
        *("--port", str(port), "--port-end", str(port + 1), "--silent"),
    ]


def server_command(tracker: str, key: str, port: int, *extra: str) -> list[str]:
    """``codl-tvm serve`` (as ``python -m codl_tvm.cli serve``) registered with ``tracker``
    under ``key``, on 127.0.0.1:``port`` (and only that port)."""
    return [
        *(sys.executable, "-m", "codl_tvm.cli", "serve", "--tracker", tracker, "--key", key),
        *("--port", str(port), "--port-end", str(port + 1), "--silent", *extra),
    ]


class Processes:
    """Processes started by the tests, each in its own process group, killed by :meth:`close`."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(
            cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            self.kill(proc)


def start_tracker(procs: Processes, seconds: float = 60.0) -> str:
    """TVM's tracker started among ``procs`` on a free port: its ``host:port`` once it answers."""
    port = free_port()
    procs.start(tracker_command(port))
    addr = f"127.0.0.1:{port}"
    deadline = time.monotonic() + seconds
    while True:
        try:
            rpc_client.tracker_summary(addr, timeout_s=2)
            return addr
        except rpc_client.TrackerUnreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def logged_lines(on_line: Callable[[str], None] | None = None) -> Iterator[list[str]]:
    """The messages the library logs (``codl_tvm`` loggers, INFO and up) while the block runs,
    each also handed to ``on_line``. The handler sits on the ``codl_tvm`` logger itself, so it
    sees the records whether or not the CLI's console setup stopped their propagation."""
    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            if on_line is not None:
                on_line(lines[-1])

    logger = logging.getLogger("codl_tvm")
    handler, level = _Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
