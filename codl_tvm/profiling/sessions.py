"""Where parts run: in this process (:class:`LocalSession`) or on a TVM RPC server
(:class:`RPCSession`), through the same calls, and what a session's records were measured on
(:func:`device_description`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import tvm

from codl_tvm import runtime
from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.part_ir import target_str

__all__ = ["LocalSession", "RPCSession", "Session", "device_description", "local_cpu_threads"]


def local_cpu_threads() -> int:
    """The CPU thread-pool size of TVM here: ``TVM_NUM_THREADS``, else ``OMP_NUM_THREADS``, else
    the CPU count."""
    env = os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    return int(env) if env else (os.cpu_count() or 1)


class LocalSession:
    """Runs libraries in this process (OpenCL through the codl-tvm runtime plugin)."""

    remote = False

    def __init__(self) -> None:
        self._plugin = False

    def device(self, processor: str):
        """The TVM device of ``processor`` (``"gpu"``: OpenCL through the plugin, else the CPU)."""
        if processor == "gpu":
            self._load_plugin()
            return tvm.opencl(0)
        return tvm.cpu(0)

    def _load_plugin(self) -> None:
        if not self._plugin:
            runtime.load()
            self._plugin = True

    def load_module(self, path: str | Path):
        return tvm.runtime.load_module(str(path))

    def get_function(self, name: str):
        self._load_plugin()
        func = tvm.get_global_func(name, allow_missing=True)
        if func is None:
            raise ProfileError(f"the codl-tvm runtime plugin has no function {name!r}")
        return func


class RPCSession:
    """Runs libraries on a TVM RPC server (``tvm.rpc.connect``, or the ``.session`` of
    ``codl_tvm.rpc.client.request_remote``); the server must have loaded the codl-tvm runtime
    plugin for OpenCL."""

    remote = True

    def __init__(self, session) -> None:
        self.session = session

    def device(self, processor: str):
        return self.session.cl(0) if processor == "gpu" else self.session.cpu(0)

    def load_module(self, path: str | Path):
        path = Path(path)
        self.session.upload(str(path))
        return self.session.load_module(path.name)

    def get_function(self, name: str):
        try:
            return self.session.get_function(name)
        except Exception as exc:
            raise ProfileError(
                f"the RPC server has no function {name!r} (is the codl-tvm runtime plugin "
                f"loaded there?): {exc}"
            ) from None


#: Either kind of session: what the measuring functions take.
Session = LocalSession | RPCSession


def device_description(session: Session, gpu_target=None, cpu_target=None) -> dict:
    """What the records were measured on (stable across runs, so resuming matches keys)."""
    desc: dict = {
        "gpu_target": target_str("gpu", gpu_target),
        "cpu_target": target_str("cpu", cpu_target),
        "remote": bool(session.remote),
    }
    try:
        info = json.loads(session.get_function("codl.opencl.info")())
        dev0 = (info.get("devices") or [{}])[0]
        desc["gpu"] = dev0.get("name", "?")
        desc["platform"] = f"{info.get('platform', '?')} ({info.get('platform_version', '?')})"
        desc["compute_units"] = dev0.get("compute_units")
        desc["svm_mode"] = info.get("svm_mode", "?")
    except ProfileError:
        desc["gpu"] = "unavailable"
    if not session.remote:
        desc["cpu_threads"] = local_cpu_threads()
    return desc
