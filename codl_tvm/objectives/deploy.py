"""Deploy an ONNX model to a device behind a TVM RPC tracker and check it against the host.

``codl-tvm deploy MODEL.onnx --tracker HOST:PORT --key KEY [--target PRESET] [--device cpu]``
(:mod:`codl_tvm.cli.deploy`) calls :func:`deploy` with a :class:`DeployOptions`: it imports the
model, asks the tracker for a device of ``key`` (bounded wait), checks the device's TVM version
before anything is uploaded, cross-compiles for the target preset (:mod:`codl_tvm.build.targets`),
uploads the library, runs it in the Relax VM on the remote device, compares the outputs with a
build for this machine's CPU, and measures the remote latency with ``time_evaluator`` on the
device. Progress goes to this module's logger.

Without a ``target`` the preset follows what the remote reports (x86-64 -> ``host``, aarch64
Android -> ``android-arm64``, other aarch64 -> ``linux-arm64``; servers started with
``codl-tvm serve`` report it).

``device="opencl"`` and ``device="coexec"`` need a remote whose RPC server loaded codl-tvm's
OpenCL plugin. The plugin is not linked into the model library: it is a separate shared library
that the server loads at start-up (``codl-tvm serve --opencl``), so one plugin serves every
uploaded model and a model library stays a plain TVM library. The plugin registers
``device_api.opencl`` and the OpenCL module loader with ``override``: in a TVM runtime built with
its own OpenCL support, loading the plugin replaces TVM's OpenCL device API in that process
(co-execution needs the plugin's SVM allocation and sync builtins); a server that does not load it
keeps TVM's OpenCL and can run ``opencl`` models but not co-executed ones. ``coexec`` builds the
model with :func:`codl_tvm.build.pipeline.coexec_pipeline` for the preset's OpenCL and CPU targets
and runs it in the Relax VM over the remote's ``[opencl(0), cpu(0)]``; the plan comes from
``plan`` (a plan or plan JSON), ``dim`` and ``ratio`` (the GPU share of every partitionable
operator) or ``plan="auto"`` (the planner with the preset's cost model, or ``cost_model``).

:func:`run_artifact` runs a compiled artifact (``codl-tvm run ARTIFACT --tracker HOST:PORT
--key KEY``) on such a device: the VM gets the remote's devices as the manifest lists them, so a
build whose GPU tensors are images gets the OpenCL device once per VM slot (one per memory
scope; :mod:`codl_tvm.rpc.remote_vm`), and the server's plugin makes those slots' storages
images.

A server started with ``--opencl`` but without a plugin reports it missing;
:func:`codl_tvm.rpc.plugin.ensure_remote_opencl` then uploads one after checking that it fits.

Errors about options name the :class:`DeployOptions` field in backquotes (`` `plan` ``); the CLI
shows them as its flags.
"""

from __future__ import annotations

import logging
import platform
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

from codl_tvm import runtime
from codl_tvm.build.pipeline import coexec_pipeline, single_device_pipeline
from codl_tvm.build.runner import build, remove_with
from codl_tvm.build.targets import TargetPreset, export_library, get_preset
from codl_tvm.core.errors import DeployError
from codl_tvm.core.plan import PartitionPlan, uniform_plan
from codl_tvm.frontend.importer import OnnxModel, check_inputs, load_onnx, random_inputs
from codl_tvm.planner.policy import resolve_plan as plan_with_planner
from codl_tvm.rpc.client import RemoteDevice, check_remote_versions, parse_address, request_remote
from codl_tvm.rpc.plugin import ensure_remote_opencl
from codl_tvm.rpc.remote_vm import RemoteVM, vm_devices_for
from codl_tvm.runtime.artifact import LIBRARY, load_artifact

__all__ = [
    "DEVICES",
    "DeployError",
    "DeployOptions",
    "DeployResult",
    "RemoteRun",
    "compare_outputs",
    "compile_for",
    "deploy",
    "resolve_plan",
    "run_artifact",
    "run_remote",
    "select_preset",
]

logger = logging.getLogger(__name__)

DEVICES = ("cpu", "opencl", "coexec")


@dataclass(frozen=True)
class DeployOptions:
    """How :func:`deploy` reaches the device, builds, runs and compares.

    Attributes
    ----------
    tracker, key
        ``HOST:PORT`` of the TVM RPC tracker and the device key.
    target
        A preset name (:func:`codl_tvm.build.targets.preset_names`) or preset; default: from the
        remote's report.
    device
        ``"cpu"``, ``"opencl"`` or ``"coexec"`` (GPU + CPU co-execution).
    plan, dim, ratio
        For ``"coexec"``: a :class:`~codl_tvm.core.plan.PartitionPlan`, a plan JSON path or
        ``"auto"`` (the planner), or a uniform plan's dimension (``"H"``/``"OC"``) and GPU share
        (:func:`resolve_plan`).
    cost_model
        The cost model for ``plan="auto"`` (default: the preset's shipped model).
    number, repeat
        ``time_evaluator`` runs per repeat and repeats (``repeat=0``: no timing).
    seed
        Seed of the random inputs when :func:`deploy` is given none.
    request_timeout_s
        Bound on reaching the tracker and getting a free device.
    session_timeout_s
        The server ends the session after this long (0: never).
    atol, rtol
        Tolerance of the comparison with the host: ``atol + rtol * max|reference|``.
    work_dir
        Where the model library is written. By default a temporary directory, removed when the
        result of :func:`deploy` is garbage collected.
    plugin, ndk
        The OpenCL plugin to upload to a server that lacks one (default: cross-built for the
        preset, with ``ndk`` for Android); see :func:`codl_tvm.rpc.plugin.ensure_remote_opencl`.

    Raises
    ------
    DeployError
        On construction, for a value no deploy can use (the message names the field).
    """

    tracker: str
    key: str
    target: str | TargetPreset | None = None
    device: str = "cpu"
    plan: PartitionPlan | str | Path | None = None
    dim: str | None = None
    ratio: float | None = None
    cost_model: str | Path | None = None
    number: int = 5
    repeat: int = 3
    seed: int = 0
    request_timeout_s: float = 10.0
    session_timeout_s: float = 600.0
    atol: float = 1e-4
    rtol: float = 1e-3
    work_dir: str | Path | None = None
    plugin: str | Path | None = None
    ndk: str | Path | None = None

    def __post_init__(self) -> None:
        try:
            parse_address(self.tracker)
        except ValueError as exc:
            raise DeployError(f"`tracker`: {exc}") from None
        if not self.key:
            raise DeployError("`key` is empty: give the device key the servers registered with")
        if self.device not in DEVICES:
            raise DeployError(f"`device` {self.device!r} is not one of {', '.join(DEVICES)}")
        plan_given = self.plan is not None or self.dim is not None or self.ratio is not None
        if self.device != "coexec" and plan_given:
            raise DeployError("`plan`/`dim`/`ratio` apply to `device` coexec only")
        if self.device == "coexec":
            _check_plan_fields(self.plan, self.dim, self.ratio)
        if self.number < 1 or self.repeat < 0:
            raise DeployError(
                f"`number` must be at least 1 and `repeat` at least 0 (got {self.number}, "
                f"{self.repeat})"
            )
        if self.request_timeout_s <= 0 or self.session_timeout_s < 0:
            raise DeployError(
                f"`request_timeout_s` must be positive and `session_timeout_s` at least 0 (got "
                f"{self.request_timeout_s:g}, {self.session_timeout_s:g})"
            )
        if self.atol < 0 or self.rtol < 0:
            raise DeployError(f"`atol` and `rtol` must be at least 0 ({self.atol}, {self.rtol})")


def _check_plan_fields(plan, dim: str | None, ratio: float | None) -> None:
    """A co-executed deploy has a plan, or a uniform plan's ``dim`` and ``ratio``, not both."""
    if plan is not None and (dim is not None or ratio is not None):
        raise DeployError("give either a `plan` or `dim`/`ratio` for `device` coexec, not both")
    if plan is None and (dim is None or ratio is None):
        raise DeployError(
            "`device` coexec needs a partition plan: a `plan` (PLAN.json or 'auto'), or `dim` "
            "H|OC with `ratio` R (the GPU share, 0..1)"
        )
    if plan is None and dim not in ("H", "OC"):
        raise DeployError(f"`dim` {dim!r} is not H or OC")
    if plan is None and not 0.0 <= float(ratio) <= 1.0:
        raise DeployError(f"`ratio` {ratio} is not a GPU share in 0..1")


@dataclass(frozen=True)
class RemoteRun:
    """Outputs of one remote run and the remote latency statistics (ms): one sample per
    timing repeat (``samples_ms``), each the mean of its runs."""

    outputs: list[np.ndarray]
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    repeats: int
    samples_ms: tuple[float, ...] = ()


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
                f"remote device {remote_name} does not report its machine; give a `target` "
                "preset (codl_tvm.build.targets.preset_names())"
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
                "matches it; give a `target` preset"
            )
        return get_preset(name)
    preset = get_preset(target)
    if machine is not None:
        want = preset.triple.split("-")[0] if preset.triple else platform.machine()
        have = "aarch64" if machine == "arm64" else machine
        if want != have:
            raise DeployError(
                f"target preset '{preset.name}' builds for {want} but remote device "
                f"{remote_name} reports a {have} machine; choose a matching `target`"
            )
    if device in ("opencl", "coexec") and not preset.has_gpu:
        raise DeployError(
            f"`device` {device} needs a preset with an OpenCL GPU; '{preset.name}' has none"
        )
    return preset


def resolve_plan(mod, plan=None, dim: str | None = None, ratio: float | None = None):
    """The :class:`~codl_tvm.core.plan.PartitionPlan` for ``device="coexec"``, validated against
    ``mod`` (``"auto"`` stays ``"auto"``: :func:`deploy` plans once the preset is known).

    ``plan`` is a plan object or the path of a plan JSON; otherwise ``dim`` (``"H"`` or ``"OC"``)
    and ``ratio`` (the GPU share) give a uniform plan.

    Raises
    ------
    DeployError
        Neither or both given, or the plan file is missing.
    codl_tvm.core.plan.PlanError
        The plan does not fit the model (names the operator and the problem).
    """
    _check_plan_fields(plan, dim, ratio)
    if isinstance(plan, str) and plan == "auto":
        return "auto"  # planned once the target is known (see deploy)
    if plan is None:
        return uniform_plan(mod, dim, float(ratio))
    if not isinstance(plan, PartitionPlan):
        path = Path(plan)
        if not path.is_file():
            raise DeployError(f"`plan` {path}: no such file")
        plan = PartitionPlan.load(path)
    plan.validate(mod)
    return plan


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
                f"`device` coexec needs a preset with an OpenCL GPU; '{preset.name}' has none"
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
    vm_devices: Sequence[str] | None = None,
) -> RemoteRun:
    """Upload ``library``, run ``main`` once on the remote device, then time it.

    The VM gets the remote's devices that ``vm_devices`` names, one per VM slot, as an
    artifact's manifest lists them (:class:`~codl_tvm.rpc.remote_vm.RemoteVM`; a build whose
    GPU tensors are images: the OpenCL device once per slot); by default those of a buffer
    build for ``device``. ``repeat=0`` skips timing. Any failure of the remote raises
    :class:`codl_tvm.core.errors.RemoteFailure` naming the device and the stage.
    """
    loaded = RemoteVM(remote, library, vm_devices or vm_devices_for(device))
    loaded.set_inputs(inputs)
    outputs = loaded.run()
    if repeat <= 0:
        return RemoteRun(outputs, None, None, None, 0)
    ms = loaded.time(number, repeat)
    return RemoteRun(
        outputs, float(np.median(ms)), float(np.min(ms)), float(np.max(ms)), len(ms), tuple(ms)
    )


def run_artifact(
    path: str | Path,
    tracker: str,
    key: str,
    inputs: Sequence[np.ndarray],
    number: int = 5,
    repeat: int = 3,
    request_timeout_s: float = 10.0,
    plugin: str | Path | None = None,
) -> RemoteRun:
    """Run the artifact at ``path`` (``codl-tvm compile``) on a device of ``key`` behind
    ``tracker``: its library uploaded and run in a VM over the remote's devices as the manifest
    lists them (``vm_devices``: an image build's OpenCL device once per VM slot).

    The remote's TVM version is checked first, its OpenCL plugin where the artifact runs on
    OpenCL (:func:`codl_tvm.rpc.plugin.ensure_remote_opencl`, uploading ``plugin`` or one
    built for the artifact's preset to a server that has none), and its machine against the
    one the artifact's CPU code was built for.

    Raises
    ------
    codl_tvm.core.errors.ArtifactError
        Not an artifact, or a file altered.
    DeployError
        The artifact's weights are stored beside its library (loaded by codl-tvm's runtime on
        the device itself), or the remote is another machine or has no usable OpenCL.
    codl_tvm.core.errors.RPCError
        TrackerUnreachable, NoFreeDevice, VersionMismatch, RemoteFailure.
    """
    # the remote's CPU runs the library, not this machine's
    art = load_artifact(path, check_cpu=False)
    manifest = art.manifest
    if (manifest.weights or {}).get("placement") == "beside":
        raise DeployError(
            f"{art.path}: its weights are stored beside the library (weights.bin), which "
            "codl-tvm's runtime loads on the device itself; run it there, or compile it with "
            "embedded weights to run it through the tracker"
        )
    remote = request_remote(tracker, key, timeout_s=request_timeout_s)
    try:
        logger.info("connected to %s", remote.name)
        info = check_remote_versions(remote)
        machine = (info or {}).get("machine", "").replace("arm64", "aarch64")
        arch = (manifest.cpu or {}).get("arch")
        if machine and arch and machine != arch:
            raise DeployError(
                f"{art.path} is built for {arch} CPUs, remote device {remote.name} is a "
                f"{machine} machine"
            )
        if "opencl" in manifest.vm_devices:
            preset = get_preset(manifest.preset or "opencl")
            ensure_remote_opencl(remote, info, preset, plugin, device=manifest.device)
        logger.info("running %s on %s (VM devices %s)", art.path, remote.name, manifest.vm_devices)
        return run_remote(
            remote, art.path / LIBRARY, inputs, manifest.device, number, repeat,
            vm_devices=manifest.vm_devices,
        )  # fmt: skip
    finally:
        remote.close()


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


def deploy(
    model, options: DeployOptions, inputs: dict[str, np.ndarray] | None = None
) -> DeployResult:
    """Compile ``model`` for a device of ``options.key``, run it there and compare with the host.

    Parameters
    ----------
    model
        ONNX file path, ``onnx.ModelProto`` or a :class:`codl_tvm.frontend.importer.OnnxModel`.
    options
        Where and how (:class:`DeployOptions`).
    inputs
        Inputs keyed by graph input name (default: random, seeded with ``options.seed``).

    Raises
    ------
    codl_tvm.frontend.importer.ModelError, DeployError, codl_tvm.build.targets.ToolchainError,
    codl_tvm.core.errors.RPCError (TrackerUnreachable, NoFreeDevice, VersionMismatch, RemoteFailure)
    """
    onnx_model = model if isinstance(model, OnnxModel) else load_onnx(model)
    partition = None
    if options.device == "coexec":
        partition = resolve_plan(onnx_model.mod, options.plan, options.dim, options.ratio)
    values = inputs if inputs is not None else random_inputs(onnx_model, options.seed)
    ordered = check_inputs(onnx_model, values, "inputs" if inputs is not None else "random inputs")
    if options.target is not None:
        get_preset(options.target)  # fail on a bad name before touching the network
    remote = request_remote(
        options.tracker,
        options.key,
        timeout_s=options.request_timeout_s,
        session_timeout_s=options.session_timeout_s,
    )
    # The library goes to work_dir, or to a temporary directory that lives as long as the result.
    own_dir = None if options.work_dir else Path(tempfile.mkdtemp(prefix="codl-tvm-deploy-"))
    try:
        try:
            info, preset = _prepare_remote(remote, options)
            lib, run = _build_and_run(
                remote, onnx_model, ordered, preset, partition, options, options.work_dir or own_dir
            )
        finally:
            remote.close()
        logger.info("running the host reference (llvm)")
        reference = build(onnx_model.mod, "cpu")(ordered)
        err, ok = compare_outputs(run.outputs, reference, options.atol, options.rtol)
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


def _prepare_remote(
    remote: RemoteDevice, options: DeployOptions
) -> tuple[dict | None, TargetPreset]:
    """Check the remote's versions (and its OpenCL plugin, for the GPU devices) and choose the
    preset; returns the remote's report (``None`` for a stock server) and the preset."""
    logger.info("connected to %s", remote.name)
    info = check_remote_versions(remote)
    if info is None:
        logger.warning(
            "%s does not report its TVM version (stock RPC server); cannot check it before upload",
            remote.name,
        )
    else:
        system = "Android" if info.get("android") == "1" else info.get("system")
        logger.info("remote: TVM %s, %s %s", info.get("tvm"), info.get("machine"), system)
    if options.device in ("opencl", "coexec"):
        preset = select_preset(options.target, options.device, info, remote.name)
        opencl = ensure_remote_opencl(
            remote, info, preset, options.plugin, options.ndk, options.device
        )
        info = opencl if info is not None else None
    return info, select_preset(options.target, options.device, info, remote.name)


def _build_and_run(
    remote: RemoteDevice,
    onnx_model: OnnxModel,
    ordered: list[np.ndarray],
    preset: TargetPreset,
    partition,
    options: DeployOptions,
    work_dir: str | Path,
) -> tuple[Path, RemoteRun]:
    """Plan (for ``plan="auto"``), compile for ``preset``, upload and run on ``remote``."""
    if partition == "auto":
        choice = plan_with_planner(
            onnx_model.mod, mode="codl", cost_model=options.cost_model, preset=preset.name
        )
        partition = choice.plan
        logger.info("planned with the cost model (%s)", choice.cost_model)
    logger.info("compiling for '%s' (%s)", preset.name, options.device)
    if options.device == "coexec":
        runtime.load()  # as compile_coexec does: the plugin must be loaded to build
    lib = compile_for(onnx_model.mod, preset, options.device, work_dir, plan=partition)
    logger.info(
        "uploading %s (%d bytes) and running on %s", lib.name, lib.stat().st_size, remote.name
    )
    run = run_remote(
        remote, lib, ordered, options.device, number=options.number, repeat=options.repeat
    )
    return lib, run
