"""What the RPC tests share: a free local port and the command of TVM's tracker on it."""

from __future__ import annotations

import socket
import sys


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
