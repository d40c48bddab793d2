"""What the RPC tests share: a free local port, the command of TVM's tracker on it, the command
of codl-tvm's RPC server, and the lines the library logs."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Iterator


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
