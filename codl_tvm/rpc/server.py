"""The RPC server a board runs: TVM's RPC server that reports its versions and loads codl-tvm's
OpenCL plugin.

``codl-tvm serve --tracker HOST:PORT --key KEY [--opencl]`` (:mod:`codl_tvm.cli.serve`) runs
:func:`serve`. The server registers ``codl_tvm.rpc.versions`` (TVM, tvm-ffi, Python, machine;
with ``--opencl`` also the plugin's description and the OpenCL device) so that clients check
versions before anything is uploaded, and with ``--opencl`` ``codl_tvm.rpc.load_plugin``, which
loads a plugin a client uploaded (:func:`codl_tvm.rpc.plugin.upload_plugin`).

This module imports only the standard library, TVM's runtime, :mod:`codl_tvm.core.errors`,
:mod:`codl_tvm.runtime` and :mod:`codl_tvm.rpc.client`: a board with a runtime-only TVM (or the
emulated aarch64 device of ``scripts/emulated_aarch64.py``, which copies just these packages)
can run it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from pathlib import Path

import tvm
import tvm.rpc
import tvm_ffi

from codl_tvm import runtime
from codl_tvm.rpc.client import (
    PLUGIN_FIELDS,
    PLUGIN_LOAD_FUNC,
    VERSIONS_FUNC,
    local_versions,
    parse_address,
)
from codl_tvm.runtime import plugin_build

__all__ = ["serve", "start_server"]

logger = logging.getLogger(__name__)


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
        desc = plugin_build.plugin_description(loaded)
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


def _let_workers_import_this_package() -> None:
    """TVM's server runs each session in a fresh Python process (``tvm.exec.popen_worker``)
    that unpickles the init callback by module name, so it must find ``codl_tvm`` where this
    process found it: on a board it is often a copied folder beside ``serve.py``, not an
    installed package."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


def start_server(
    tracker: str,
    key: str,
    host: str = "127.0.0.1",
    port: int = 9090,
    port_end: int | None = None,
    opencl: bool = False,
    silent: bool = False,
    plugin_dir: str | None = None,
) -> tvm.rpc.Server:
    """Start TVM's RPC server registered with ``tracker`` under ``key``; return it (its
    ``port`` is the one it bound, in ``port``..``port_end``, default ``port + 100``).

    The server answers ``codl_tvm.rpc.versions`` (TVM, tvm-ffi, Python, machine), so clients can
    check versions before uploading. ``opencl=True`` loads codl-tvm's OpenCL plugin in the server:
    ``CODL_TVM_PLUGIN_LIB``, else the newest one uploaded earlier (kept in ``plugin_dir``,
    default ``plugins`` under codl-tvm's cache), else built on first use where a C++ compiler
    exists; without any it reports the plugin missing, and clients upload one
    (:func:`codl_tvm.rpc.plugin.upload_plugin`).

    Raises
    ------
    ValueError
        ``tracker`` is not ``HOST:PORT``.
    """
    url, tport = parse_address(tracker)
    init = functools.partial(_register_versions, opencl, plugin_dir)
    _let_workers_import_this_package()
    return tvm.rpc.Server(
        host,
        port,
        port_end or port + 100,
        key=key,
        tracker_addr=(url, tport),
        silent=silent,
        server_init_callback=init,
    )


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
    """Run the server of :func:`start_server` until it is killed."""
    server = start_server(tracker, key, host, port, port_end, opencl, silent, plugin_dir)
    logger.info(
        "codl-tvm RPC server on %s:%s, key '%s', tracker %s", host, server.port, key, tracker
    )
    server.proc.join()
