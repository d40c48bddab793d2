"""The OpenCL plugin on a remote device: checking that it fits, and uploading one that does.

co-execution on a board needs codl-tvm's OpenCL plugin loaded in its RPC server (``codl-tvm serve
--opencl``). :func:`ensure_remote_opencl` checks the plugin a server loaded against this
codl-tvm (its ELF machine, the TVM versions it was built against and the hash of its sources),
or, for a server that has none, uploads one after the same checks (:func:`upload_plugin`; the
plugin is cross-built for the device's preset by :func:`plugin_for`). A plugin that does not fit
is refused before anything is uploaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from codl_tvm import runtime
from codl_tvm.build.targets import TargetPreset
from codl_tvm.core.errors import DeployError, RemoteFailure, RPCError, VersionMismatch
from codl_tvm.rpc.client import PLUGIN_FIELDS, PLUGIN_LOAD_FUNC, RemoteDevice
from codl_tvm.runtime import plugin_build

__all__ = [
    "ensure_remote_opencl",
    "plugin_for",
    "plugin_mismatches",
    "remote_plugin",
    "upload_plugin",
]

logger = logging.getLogger(__name__)


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
                f"the server has no {PLUGIN_LOAD_FUNC}; start it with `codl-tvm serve --opencl`"
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


def plugin_for(preset: TargetPreset, ndk: str | Path | None = None) -> Path:
    """The OpenCL plugin for ``preset``'s device: this machine's build for a host preset, else a
    cross build (:func:`codl_tvm.runtime.plugin_build.cross_build_plugin`) cached under codl-tvm's
    cache by target and source hash.

    Raises
    ------
    DeployError
        An Android preset without an NDK (``ndk``, ``ANDROID_NDK_HOME`` or ``ANDROID_NDK_ROOT``).
    codl_tvm.core.errors.ToolchainError
        The cross compiler is missing or the build failed.
    """
    if not preset.is_cross:
        return Path(runtime.load())
    target = "android-arm64" if preset.os == "android" else "linux-arm64"
    if target == "android-arm64":
        ndk = ndk or os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
        if not ndk:
            raise DeployError(
                "the device has no OpenCL plugin and building one for Android needs the NDK: "
                "pass --ndk NDK_DIR (or set ANDROID_NDK_HOME), or --plugin PATH with a plugin "
                "from `codl-tvm build-runtime --target android-arm64`"
            )
    sha = plugin_build.sources_sha256()
    out = runtime.default_cache_dir() / "plugins" / f"{target}-{sha[:16]}"
    lib = out / plugin_build.PLUGIN_NAME
    if lib.is_file() and plugin_build.plugin_description(lib).get("sources_sha256") == sha:
        return lib
    logger.info("cross-building the OpenCL plugin for %s into %s", target, out)
    return plugin_build.cross_build_plugin(target, out, ndk=ndk)


def _stock_server_opencl(remote: RemoteDevice) -> dict:
    """A server that cannot report (TVM's C++ ``tvm_rpc``, e.g. on Android): usable when the
    plugin was preloaded into it, found by its ``codl.opencl.info`` function."""
    box = {}

    def _probe():
        func = remote.session.get_function("codl.opencl.info")
        box["info"] = json.loads(str(func()))

    try:
        remote.call("asking for codl-tvm's OpenCL plugin", _probe)
    except Exception as exc:
        raise DeployError(
            f"remote device {remote.name} is a stock TVM RPC server without codl-tvm's OpenCL "
            "plugin: start `codl-tvm serve --opencl` there, or TVM's "
            "tvm_rpc with LD_PRELOAD=libcodl_tvm_opencl.so (README: Phones and boards); "
            f"({str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})"
        ) from None
    cl = box["info"]
    devices = ", ".join(d.get("name", "?") for d in cl.get("devices", []))
    logger.warning(
        "%s cannot report its TVM and plugin versions (stock RPC server); its plugin drives "
        "%s: %s, SVM %s",
        remote.name,
        cl.get("platform"),
        devices,
        cl.get("svm_mode"),
    )
    return {"opencl": "1", "svm": str(cl.get("svm_mode")), "opencl_device": devices}


def ensure_remote_opencl(
    remote: RemoteDevice,
    info: dict | None,
    preset: TargetPreset,
    plugin: str | Path | None = None,
    ndk: str | Path | None = None,
    device: str = "coexec",
) -> dict:
    """Make sure the remote runs a codl-tvm OpenCL plugin that fits this codl-tvm; return its
    (possibly updated) report.

    A plugin already loaded there is checked (machine, TVM versions, source hash); a missing one
    is uploaded (``plugin``, else :func:`plugin_for`) after the same checks against the device,
    so a mismatch is refused before anything is uploaded.

    Raises
    ------
    codl_tvm.core.errors.VersionMismatch
        The remote's plugin, or the one to upload, does not fit (the message names the device,
        the plugin and each difference).
    DeployError
        The server was not started with ``--opencl`` or has no usable OpenCL platform (with
        the server's reason).
    """
    if info is None:
        info = _stock_server_opencl(remote)
    if "opencl" not in info:
        raise DeployError(
            f"remote device {remote.name} did not load codl-tvm's OpenCL plugin (its server "
            "was started without --opencl: `codl-tvm serve --opencl`)"
        )
    sha = plugin_build.sources_sha256()
    if info.get("plugin_state") == "loaded":
        problems = plugin_mismatches(remote_plugin(info), info, sha)
        if problems:
            raise VersionMismatch(
                f"the OpenCL plugin loaded on remote device {remote.name} does not fit this "
                f"codl-tvm: {'; '.join(problems)}; rebuild it (`codl-tvm build-runtime`) or "
                "restart the server without it so that deploy uploads a matching one"
            )
    elif info.get("plugin_state") == "missing":
        path = Path(plugin) if plugin else plugin_for(preset, ndk)
        desc = plugin_build.plugin_description(path)
        problems = plugin_mismatches(desc, info, sha)
        if problems:
            raise VersionMismatch(
                f"OpenCL plugin {path} cannot be uploaded to remote device {remote.name}: "
                f"{'; '.join(problems)}"
            )
        logger.info(
            "%s has no OpenCL plugin: uploading %s (%s)", remote.name, path.name, desc["machine"]
        )
        info = upload_plugin(remote, str(path))
    if info.get("opencl") != "1":
        why = info.get("opencl_error", "the server reports no usable OpenCL device")
        raise DeployError(f"remote device {remote.name} has no usable OpenCL runtime: {why}")
    svm = info.get("svm", "unknown")
    # Without SVM the plugin falls back to host-mapped buffers: the CPU part of a co-executed
    # operator works on the buffer's mapping, the GPU part on sub-buffers (README: Phones and
    # boards), so co-execution still runs; the line says which memory it runs on.
    logger.info(
        "OpenCL on %s: %s, SVM %s: %s%s",
        remote.name,
        info.get("opencl_device", "?"),
        svm,
        runtime.describe_svm_mode(svm),
        " (co-execution maps buffers for the CPU; views at unaligned offsets are copied)"
        if svm == "buffer" and device == "coexec"
        else "",
    )
    return info
