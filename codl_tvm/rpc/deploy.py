"""Deploy an ONNX model to a device behind a TVM RPC tracker and check it against the host.

``codl-tvm deploy MODEL.onnx --tracker HOST:PORT --key KEY [--target PRESET] [--device cpu]``
imports the model, asks the tracker for a device of ``KEY`` (bounded wait), checks the device's
TVM version before anything is uploaded, cross-compiles for the target preset
(:mod:`codl_tvm.build.targets`), uploads the library, runs it in the Relax VM on the remote device,
compares the outputs with a build for this machine's CPU, and prints the remote latency measured
by ``time_evaluator`` on the device.

Without ``--target`` the preset follows what the remote reports (x86-64 -> ``host``, aarch64
Android -> ``android-arm64``, other aarch64 -> ``linux-arm64``; servers started with
``python -m codl_tvm.rpc.client serve`` report it).

``--device opencl`` and ``--device coexec`` need a remote whose RPC server loaded codl-tvm's OpenCL
plugin. The plugin is not linked into the model library: it is a separate shared library that the
server loads at start-up (``python -m codl_tvm.rpc.client serve --opencl``), so one plugin serves
every uploaded model and a model library stays a plain TVM library. The plugin registers
``device_api.opencl`` and the OpenCL module loader with ``override``: in a TVM runtime built with
its own OpenCL support, loading the plugin replaces TVM's OpenCL device API in that process
(co-execution needs the plugin's SVM allocation and sync builtins); a server that does not load it
keeps TVM's OpenCL and can run ``--device opencl`` models but not co-executed ones. ``--device
coexec`` builds the model with :func:`codl_tvm.build.pipeline.coexec_pipeline` for the preset's
OpenCL and
CPU targets and runs it in the Relax VM over the remote's ``[opencl(0), cpu(0)]``; the plan comes
from ``--plan PLAN.json``, ``--dim H|OC --ratio R`` (the GPU share of every partitionable
operator) or ``--plan auto`` (the planner with the preset's cost model, or ``--cost-model``).

A server started with ``--opencl`` but without a plugin (none built for it, no compiler there)
reports it missing; :func:`ensure_remote_opencl` then uploads one (``plugin=`` or cross-built
for the preset with :func:`codl_tvm.runtime.plugin_build.cross_build_plugin`, cached), after
checking
that it fits the device: its ELF machine, the TVM versions it was built against and the hash of
its sources. A server whose loaded plugin does not fit is refused before anything is uploaded.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.pipeline import coexec_pipeline, single_device_pipeline
from codl_tvm.build.runner import _flatten, build, remove_with
from codl_tvm.build.targets import TargetPreset, export_library, get_preset
from codl_tvm.core.errors import DeployError, VersionMismatch
from codl_tvm.core.plan import PartitionPlan, uniform_plan
from codl_tvm.frontend.importer import OnnxModel, check_inputs, load_onnx, random_inputs
from codl_tvm.planner.policy import resolve_plan as plan_with_planner
from codl_tvm.rpc.client import (
    RemoteDevice,
    check_remote_versions,
    plugin_mismatches,
    remote_plugin,
    request_remote,
    upload_plugin,
)
from codl_tvm.runtime import plugin_build as _build

__all__ = [
    "DeployError",
    "DeployResult",
    "RemoteRun",
    "compare_outputs",
    "compile_for",
    "deploy",
    "ensure_remote_opencl",
    "plugin_for",
    "resolve_plan",
    "run_remote",
    "select_preset",
]

DEVICES = ("cpu", "opencl", "coexec")


@dataclass(frozen=True)
class RemoteRun:
    """Outputs of one remote run and the remote latency statistics (ms)."""

    outputs: list[np.ndarray]
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    repeats: int


@dataclass(frozen=True)
class DeployResult:
    """What :func:`deploy` did and measured.

    Attributes
    ----------
    device
        The remote device (``key@host:port``).
    preset
        The target preset the model was compiled for.
    library
        The exported model library.
    outputs, reference
        Remote outputs and the host CPU build's outputs, in graph output order.
    max_abs_error
        Largest absolute difference between the two.
    matches
        Whether every output is within ``atol + rtol * max|reference|``.
    run
        The remote run, with latency.
    remote_versions
        What the remote reported about itself (``None`` for a stock server).
    """

    device: str
    preset: str
    library: Path
    outputs: list[np.ndarray]
    reference: list[np.ndarray]
    max_abs_error: float
    matches: bool
    run: RemoteRun
    remote_versions: dict | None


def select_preset(
    target: str | TargetPreset | None, device: str, remote_info: dict | None, remote_name: str
) -> TargetPreset:
    """The preset to compile for: ``target`` if given (checked against what the remote reports),
    else derived from the remote's machine and OS.

    Raises
    ------
    DeployError
        No target and the remote cannot report its machine, or the preset's CPU differs from it.
    KeyError
        Unknown preset name (the message lists the valid ones).
    """
    machine = (remote_info or {}).get("machine")
    if target is None:
        if machine is None:
            raise DeployError(
                f"remote device {remote_name} does not report its machine; pass "
                "--target PRESET (see `codl-tvm deploy --list-targets`)"
            )
        android = (remote_info or {}).get("android") == "1"
        pocl = "Portable Computing Language" in (remote_info or {}).get("opencl_device", "")
        if machine in ("aarch64", "arm64"):
            name = (
                (
                    "android-adreno"
                    if android
                    else "linux-arm64-pocl"
                    if pocl
                    else "linux-arm64-mali"
                )
                if device in ("opencl", "coexec")
                else ("android-arm64" if android else "linux-arm64")
            )
        elif machine == platform.machine():
            name = "opencl" if device in ("opencl", "coexec") else "host"
        else:
            raise DeployError(
                f"remote device {remote_name} is a {machine} machine and no preset "
                "matches it; pass --target PRESET"
            )
        return get_preset(name)
    preset = get_preset(target)
    if machine is not None:
        want = preset.triple.split("-")[0] if preset.triple else platform.machine()
        have = "aarch64" if machine == "arm64" else machine
        if want != have:
            raise DeployError(
                f"target preset '{preset.name}' builds for {want} but remote device "
                f"{remote_name} reports a {have} machine; choose a matching "
                "--target"
            )
    if device in ("opencl", "coexec") and not preset.has_gpu:
        raise DeployError(
            f"--device {device} needs a preset with an OpenCL GPU; '{preset.name}' has none"
        )
    return preset


def resolve_plan(mod, plan=None, dim: str | None = None, ratio: float | None = None):
    """The :class:`~codl_tvm.core.plan.PartitionPlan` for ``--device coexec``, validated against
    ``mod``.

    ``plan`` is a plan object or the path of a plan JSON; otherwise ``dim`` (``"H"`` or ``"OC"``)
    and ``ratio`` (the GPU share) give a uniform plan.

    Raises
    ------
    DeployError
        Neither or both given, or the plan file is missing.
    codl_tvm.core.plan.PlanError
        The plan does not fit the model (names the operator and the problem).
    """
    if plan is not None and (dim is not None or ratio is not None):
        raise DeployError("give either a plan or --dim/--ratio for --device coexec, not both")
    if isinstance(plan, str) and plan == "auto":
        return "auto"  # planned once the target is known (see deploy)
    if plan is None:
        if dim is None or ratio is None:
            raise DeployError(
                "--device coexec needs a partition plan: --plan PLAN.json, or --dim H|OC with "
                "--ratio R (the GPU share, 0..1)"
            )
        return uniform_plan(mod, dim, float(ratio))
    if not isinstance(plan, PartitionPlan):
        path = Path(plan)
        if not path.is_file():
            raise DeployError(f"--plan {path}: no such file")
        plan = PartitionPlan.load(path)
    plan.validate(mod)
    return plan


def plugin_for(
    preset: TargetPreset, ndk: str | Path | None = None, log: Callable[[str], None] | None = None
) -> Path:
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
    sha = _build.sources_sha256()
    out = runtime.default_cache_dir() / "plugins" / f"{target}-{sha[:16]}"
    lib = out / _build.PLUGIN_NAME
    if lib.is_file() and _build.plugin_description(lib).get("sources_sha256") == sha:
        return lib
    if log:
        log(f"cross-building the OpenCL plugin for {target} into {out}")
    return _build.cross_build_plugin(target, out, ndk=ndk)


def _stock_server_opencl(remote: RemoteDevice, say: Callable[[str], None]) -> dict:
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
            "plugin: start `python -m codl_tvm.rpc.client serve --opencl` there, or TVM's "
            "tvm_rpc with LD_PRELOAD=libcodl_tvm_opencl.so (README: Phones and boards); "
            f"({str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})"
        ) from None
    cl = box["info"]
    devices = ", ".join(d.get("name", "?") for d in cl.get("devices", []))
    say(
        f"warning: {remote.name} cannot report its TVM and plugin versions (stock RPC server); "
        f"its plugin drives {cl.get('platform')}: {devices}, SVM {cl.get('svm_mode')}"
    )
    return {"opencl": "1", "svm": str(cl.get("svm_mode")), "opencl_device": devices}


def ensure_remote_opencl(
    remote: RemoteDevice,
    info: dict | None,
    preset: TargetPreset,
    plugin: str | Path | None = None,
    ndk: str | Path | None = None,
    log: Callable[[str], None] | None = None,
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
    say = log or (lambda _msg: None)
    if info is None:
        info = _stock_server_opencl(remote, say)
    if "opencl" not in info:
        raise DeployError(
            f"remote device {remote.name} did not load codl-tvm's OpenCL plugin (its server "
            "was started without --opencl: `python -m codl_tvm.rpc.client serve --opencl`)"
        )
    sha = _build.sources_sha256()
    if info.get("plugin_state") == "loaded":
        problems = plugin_mismatches(remote_plugin(info), info, sha)
        if problems:
            raise VersionMismatch(
                f"the OpenCL plugin loaded on remote device {remote.name} does not fit this "
                f"codl-tvm: {'; '.join(problems)}; rebuild it (`codl-tvm build-runtime`) or "
                "restart the server without it so that deploy uploads a matching one"
            )
    elif info.get("plugin_state") == "missing":
        path = Path(plugin) if plugin else plugin_for(preset, ndk, say)
        desc = _build.plugin_description(path)
        problems = plugin_mismatches(desc, info, sha)
        if problems:
            raise VersionMismatch(
                f"OpenCL plugin {path} cannot be uploaded to remote device {remote.name}: "
                f"{'; '.join(problems)}"
            )
        say(f"{remote.name} has no OpenCL plugin: uploading {path.name} ({desc['machine']})")
        info = upload_plugin(remote, str(path))
    if info.get("opencl") != "1":
        why = info.get("opencl_error", "the server reports no usable OpenCL device")
        raise DeployError(f"remote device {remote.name} has no usable OpenCL runtime: {why}")
    svm = info.get("svm", "unknown")
    # Without SVM the plugin falls back to host-mapped buffers: the CPU part of a co-executed
    # operator works on the buffer's mapping, the GPU part on sub-buffers (README: Phones and
    # boards), so co-execution still runs; the line says which memory it runs on.
    say(
        f"OpenCL on {remote.name}: {info.get('opencl_device', '?')}, SVM {svm}: "
        + runtime.describe_svm_mode(svm)
        + (
            " (co-execution maps buffers for the CPU; views at unaligned offsets are copied)"
            if svm == "buffer" and device == "coexec"
            else ""
        )
    )
    return info


def compile_for(
    mod,
    preset: str | TargetPreset,
    device: str = "cpu",
    work_dir: str | Path | None = None,
    mcpu: str | None = None,
    plan=None,
) -> Path:
    """Compile a Relax module for ``preset``'s ``device`` and export it as a shared library.

    ``device="coexec"`` builds the co-executed model of ``plan`` (a
    :class:`~codl_tvm.core.plan.PartitionPlan`) for the preset's OpenCL and CPU targets. Cross
    presets
    link with the NDK or clang + lld (:func:`codl_tvm.build.targets.export_library`). Without
    ``work_dir`` the library goes to a new temporary directory that the caller owns.
    """
    preset = get_preset(preset)
    if device == "coexec":
        if plan is None:
            raise DeployError("compile_for(device='coexec') needs a plan")
        if not preset.has_gpu:
            raise DeployError(
                f"--device coexec needs a preset with an OpenCL GPU; '{preset.name}' has none"
            )
        gpu, cpu = preset.gpu_target(mcpu), preset.cpu_target(mcpu)
        plan.validate(mod)
        ex = tvm.compile(mod, target=gpu, relax_pipeline=coexec_pipeline(plan, gpu, cpu))
    else:
        target = preset.target("opencl" if device == "opencl" else "cpu", mcpu)
        ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="codl-tvm-deploy-"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"model_{preset.name}_{device}.so"
    export_library(ex, path, preset)
    return path


def run_remote(
    remote: RemoteDevice,
    library: str | Path,
    inputs: Sequence[np.ndarray],
    device: str = "cpu",
    number: int = 5,
    repeat: int = 3,
) -> RemoteRun:
    """Upload ``library``, run ``main`` once on the remote device, then time it.

    ``repeat=0`` skips timing. Any failure of the remote raises
    :class:`codl_tvm.rpc.client.RemoteFailure` naming the device and the stage.
    """
    library = Path(library)
    sess = remote.session
    # A fresh remote name per upload: overwriting a library the server has loaded crashes it.
    name = f"{library.stem}-{uuid.uuid4().hex[:12]}{library.suffix}"
    remote.call("uploading the model", lambda: sess.upload(str(library), name))
    rlib = remote.call("loading the model", lambda: sess.load_module(name))
    dev = sess.cl(0) if device in ("opencl", "coexec") else sess.cpu(0)
    # A co-executed model runs over both processors: OpenCL first (inputs live there), CPU second.
    vm_devs = [dev, sess.cpu(0)] if device == "coexec" else dev
    vm = remote.call("creating the VM", lambda: VirtualMachine(rlib, vm_devs))
    args = remote.call(
        "copying inputs",
        lambda: [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in inputs],
    )
    if device == "coexec":
        # Over RPC the VM receives its arguments as borrowed DLTensor* handles, which the
        # plugin's typed builtins (codl.coexec.cpu_view takes an ffi.Tensor) reject; set_input
        # copies them into VM-owned tensors on the server first.
        def _run():
            vm.set_input("main", *args)
            vm.invoke_stateful("main")
            return vm.get_outputs("main")

        out = remote.call("running main", _run)
    else:
        out = remote.call("running main", lambda: vm["main"](*args))
    outputs = remote.call("copying outputs back", lambda: _flatten(out))
    if repeat <= 0:
        return RemoteRun(outputs, None, None, None, 0)

    def _time():
        vm.set_input("main", *args)
        return vm.time_evaluator("invoke_stateful", dev, number=number, repeat=repeat)("main")

    res = remote.call("timing main", _time)
    ms = [r * 1e3 for r in res.results]
    return RemoteRun(outputs, float(np.median(ms)), float(np.min(ms)), float(np.max(ms)), len(ms))


def compare_outputs(
    outputs: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    atol: float = 1e-4,
    rtol: float = 1e-3,
) -> tuple[float, bool]:
    """Max absolute error over all outputs, and whether each is within
    ``atol + rtol * max|reference|``."""
    if len(outputs) != len(reference):
        return float("inf"), False
    worst, ok = 0.0, True
    for out, ref in zip(outputs, reference):
        if out.shape != ref.shape:
            return float("inf"), False
        if out.size == 0:
            continue
        err = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
        worst = max(worst, err)
        ok = ok and err <= atol + rtol * float(np.max(np.abs(ref)))
    return worst, ok


def _check_device(device: str, plan, dim, ratio) -> None:
    if device not in DEVICES:
        raise DeployError(f"unknown device {device!r}; expected one of {DEVICES}")
    if device != "coexec" and (plan is not None or dim is not None or ratio is not None):
        raise DeployError("--plan/--dim/--ratio apply to --device coexec only")


def deploy(
    model,
    tracker: str,
    key: str,
    target: str | TargetPreset | None = None,
    device: str = "cpu",
    inputs: dict[str, np.ndarray] | None = None,
    plan=None,
    dim: str | None = None,
    ratio: float | None = None,
    number: int = 5,
    repeat: int = 3,
    seed: int = 0,
    request_timeout_s: float = 10.0,
    session_timeout_s: float = 600.0,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    work_dir: str | Path | None = None,
    log: Callable[[str], None] | None = print,
    plugin: str | Path | None = None,
    ndk: str | Path | None = None,
    cost_model: str | Path | None = None,
) -> DeployResult:
    """Compile ``model`` for a device of ``key``, run it there and compare with the host.

    Parameters
    ----------
    model
        ONNX file path, ``onnx.ModelProto`` or a :class:`codl_tvm.frontend.importer.OnnxModel`.
    tracker, key
        ``HOST:PORT`` of the TVM RPC tracker and the device key.
    target
        A preset name (:func:`codl_tvm.build.targets.preset_names`); default: from the remote's
        report.
    device
        ``"cpu"``, ``"opencl"`` or ``"coexec"`` (GPU + CPU co-execution).
    plan, dim, ratio
        For ``"coexec"``: a :class:`~codl_tvm.core.plan.PartitionPlan` or plan JSON path, or a
        uniform plan's dimension (``"H"``/``"OC"``) and GPU ratio (:func:`resolve_plan`).
    inputs
        Inputs keyed by graph input name (default: seeded random).
    number, repeat
        ``time_evaluator`` runs per repeat and repeats (``repeat=0``: no timing).
    request_timeout_s
        Bound on reaching the tracker and getting a free device.
    session_timeout_s
        The server ends the session after this long (0: never).
    atol, rtol
        Tolerance of the comparison with the host.
    work_dir
        Where the model library is written. By default a temporary directory, removed when the
        returned result is garbage collected.
    log
        Receives progress lines (``None``: quiet).
    plugin, ndk
        The OpenCL plugin to upload to a server that lacks one (default: cross-built for the
        preset, with ``ndk`` for Android); see :func:`ensure_remote_opencl`.
    cost_model
        The cost model for ``plan="auto"`` (default: the preset's shipped model).

    Raises
    ------
    codl_tvm.frontend.importer.ModelError, DeployError, codl_tvm.build.targets.ToolchainError,
    codl_tvm.rpc.client.RPCError (TrackerUnreachable, NoFreeDevice, VersionMismatch, RemoteFailure)
    """
    say = log or (lambda _msg: None)
    _check_device(device, plan, dim, ratio)
    onnx_model = model if isinstance(model, OnnxModel) else load_onnx(model)
    partition = resolve_plan(onnx_model.mod, plan, dim, ratio) if device == "coexec" else None
    values = inputs if inputs is not None else random_inputs(onnx_model, seed)
    ordered = check_inputs(onnx_model, values, "inputs" if inputs is not None else "random inputs")
    if target is not None:
        get_preset(target)  # fail on a bad name before touching the network
    remote = request_remote(
        tracker, key, timeout_s=request_timeout_s, session_timeout_s=session_timeout_s
    )
    # The library goes to work_dir, or to a temporary directory that lives as long as the result.
    own_dir = None if work_dir else Path(tempfile.mkdtemp(prefix="codl-tvm-deploy-"))
    try:
        try:
            say(f"connected to {remote.name}")
            info = check_remote_versions(remote)
            if info is None:
                say(
                    f"warning: {remote.name} does not report its TVM version (stock RPC server); "
                    "cannot check it before upload"
                )
            else:
                say(
                    f"remote: TVM {info.get('tvm')}, {info.get('machine')} "
                    f"{'Android' if info.get('android') == '1' else info.get('system')}"
                )
            if device in ("opencl", "coexec"):
                preset = select_preset(target, device, info, remote.name)
                opencl = ensure_remote_opencl(remote, info, preset, plugin, ndk, say, device)
                info = opencl if info is not None else None
            preset = select_preset(target, device, info, remote.name)
            if partition == "auto":
                choice = plan_with_planner(
                    onnx_model.mod, mode="codl", cost_model=cost_model, preset=preset.name
                )
                partition = choice.plan
                say(f"planned with the cost model ({choice.cost_model})")
            say(f"compiling for '{preset.name}' ({device})")
            if device == "coexec":
                runtime.load()  # as compile_coexec does: the plugin must be loaded to build
            lib = compile_for(onnx_model.mod, preset, device, work_dir or own_dir, plan=partition)
            say(f"uploading {lib.name} ({lib.stat().st_size} bytes) and running on {remote.name}")
            run = run_remote(remote, lib, ordered, device, number=number, repeat=repeat)
        finally:
            remote.close()
        say("running the host reference (llvm)")
        reference = build(onnx_model.mod, "cpu")(ordered)
        err, ok = compare_outputs(run.outputs, reference, atol, rtol)
        result = DeployResult(
            remote.name, preset.name, lib, run.outputs, reference, err, ok, run, info
        )
    except BaseException:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        raise
    if own_dir is not None:
        remove_with(result, own_dir)
    return result
