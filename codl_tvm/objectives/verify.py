"""``compile --verify`` (:attr:`~codl_tvm.options.CompileOptions.verify`): time the candidate
builds against each processor alone and keep the fastest, with candidates made from that timing
(plans re-made with calibrated predictions, plans refined from timelines of the fastest
co-executed build).

The cost model cannot see everything co-execution costs (contention, synchronisation, kernels
outside the plan); measuring is what guarantees that an artifact is never slower than the best
single processor. Timing runs here, or on a device through a TVM RPC tracker.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.cache import Libraries
from codl_tvm.build.parallel import vm_devices
from codl_tvm.build.targets import TargetPreset, cpu_record
from codl_tvm.core.errors import ArtifactError, RemoteFailure
from codl_tvm.frontend.importer import OnnxModel, random_inputs
from codl_tvm.objectives.gpu_data import IMAGE_CANDIDATE, record_coexec_gpu_data
from codl_tvm.objectives.measure import gpu_data_measurement
from codl_tvm.options import CompileOptions
from codl_tvm.planner.split.refine import RefineError, moves, refine_plan, split_times
from codl_tvm.profiling.trace import trace_inference
from codl_tvm.rpc.client import RPCError, check_remote_versions, request_remote
from codl_tvm.rpc.remote_vm import RemoteVM, remote_image_caps, vm_devices_for
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest
from codl_tvm.runtime.program_binaries import build_threads, opencl_modules
from codl_tvm.runtime.vm import time_vm
from codl_tvm.runtime.warm_up import warm_up

__all__ = [
    "build_candidate",
    "candidate_words",
    "drop",
    "error_summary",
    "gpu_data_auto",
    "image_candidate",
    "operator_named",
    "refine_from_timelines",
    "refined_candidates",
    "remote_gpu_data",
    "time_here",
    "time_remote",
    "verify",
]

logger = logging.getLogger(__name__)


def verify(
    model,
    candidates: dict[str, Path],
    libraries: Libraries,
    rounds: int,
    seed: int,
    manifest: Manifest,
    remote: tuple[str, str] | None,
    more: Callable[[dict[str, float]], dict[str, Path]] | None = None,
    dropped: dict[str, str] | None = None,
) -> Path:
    """Time the co-executed builds (``candidates``: ``"coexec"`` and ``"coexec:<mode>"`` to
    their exported libraries) against each processor alone (here, or on ``remote``, a
    ``(tracker, key)`` pair); return the library of the fastest and record the measurements
    (and a fallback) in ``manifest``.

    ``more``, given the medians of that first timing, returns more candidate libraries (plans
    re-made with the cost model calibrated to the measured single-processor latencies, plans
    refined from timelines of the fastest co-executed build); if it returns any, every build is
    timed again with them and the second timing decides.

    A measured ``auto``'s image build joins ``candidates`` (:func:`image_candidate`); the
    ``gpu`` record gets its timing (:mod:`codl_tvm.objectives.gpu_data`).

    A candidate that does not build or run is dropped with one warning (:func:`drop`) and
    recorded in ``manifest.verify["dropped"]`` with those the caller dropped already
    (``dropped``: name -> reason); the others decide. How each library came (built here, in a
    worker, from the cache) and how long that took is ``manifest.verify["builds"]``.

    Raises
    ------
    ArtifactError
        Every candidate was dropped.
    """
    dropped = {} if dropped is None else dropped
    libs = _with_more_builds(candidates, libraries, dropped)
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]

    def measure():
        failed: dict[str, Exception] = {}
        if not libs:
            samples, where = {}, "this machine" if remote is None else f"RPC key {remote[1]}"
        elif remote is None:
            warm_built_here(libs, libraries, model)
            samples, where = time_here(libs, inputs, rounds, failed), "this machine"
        else:
            samples, where = time_remote(libs, inputs, rounds, *remote, failed=failed)
        for name, exc in failed.items():
            drop(dropped, name, "run", exc, libraries.preset, where)
            libs.pop(name)
        if not samples:
            raise ArtifactError(
                "verify: every candidate build failed ("
                + "; ".join(f"{k}: {v}" for k, v in dropped.items())
                + ")"
            )
        return samples, where, {name: float(np.median(v)) for name, v in samples.items()}

    start = time.perf_counter()
    samples, where, ms = measure()
    first = None
    extra = more(ms) if more is not None else {}
    if extra:
        first = {"median_ms": ms, "samples_ms": samples}
        logger.info(
            "verify: first timing %s; timing again with %s",
            ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()),
            ", ".join(extra),
        )
        libs.update(extra)
        samples, where, ms = measure()
    chosen = min(ms, key=ms.get)
    record_coexec_gpu_data(manifest, libraries, samples, where, rounds, chosen, dropped)
    manifest.verify = {
        "rounds": rounds,
        "on": where,
        "median_ms": ms,
        "samples_ms": samples,
        "chosen": chosen,
        "dropped": dict(dropped),
        "builds": {k: libraries.builds[k] for k in (*libs, *dropped) if k in libraries.builds},
        # warm-ups of the builds made here (their warm_s), loading, first runs and the rounds
        "measure_s": round(time.perf_counter() - start, 3),
    }
    if first is not None:
        manifest.verify["first_timing"] = first
    logger.info(
        "measured on %s (median of %d rounds): %s; keeping %s",
        where,
        rounds,
        ", ".join(f"{_described(k)} {v:.3f} ms" for k, v in ms.items()),
        _described(chosen),
    )
    if chosen in ("cpu", "opencl"):
        manifest.device = chosen
        manifest.vm_devices = [chosen]
        coexec = [v for k, v in ms.items() if k.startswith("coexec")]
        failed = [k for k in dropped if k.startswith("coexec")]
        # "(--verify)": the manifest's words, which earlier artifacts have too
        if coexec:
            why = (
                f"measured {min(coexec):.3f} ms co-executed vs {ms[chosen]:.3f} ms on the "
                f"{PROCESSOR_NAMES[chosen]} alone (--verify)"
            )
        elif failed:
            why = (
                f"the co-executed build{'s' if len(failed) > 1 else ''} failed "
                f"({', '.join(failed)}: see verify.dropped); measured {ms[chosen]:.3f} ms on "
                f"the {PROCESSOR_NAMES[chosen]} alone"
            )
        else:
            why = (
                f"measured {ms[chosen]:.3f} ms on the {PROCESSOR_NAMES[chosen]} alone, faster "
                "than the other processor alone (the plan splits nothing)"
            )
        manifest.plan["fallback"] = why
        target = libraries.preset.target("cpu" if chosen == "cpu" else "gpu")
        manifest.targets = {chosen: str(target)}
    return libs[chosen]


def _with_more_builds(
    candidates: dict[str, Path], libraries: Libraries, dropped: dict[str, str]
) -> dict[str, Path]:
    """``candidates`` with the image build of a measured ``auto`` added (to ``candidates``
    too, :func:`image_candidate`), and every build that verify times: those and each processor
    alone (a build that fails is dropped, :func:`build_candidate`)."""
    candidates.update(image_candidate(libraries, dropped))
    libs = dict(candidates)
    for device in ("cpu", "opencl"):
        path = build_candidate(device, lambda d=device: libraries.single(d), dropped, libraries)
        if path is not None:
            libs[device] = path
    return libs


def gpu_data_auto(
    model: OnnxModel, libraries: Libraries, options: CompileOptions, manifest: Manifest
) -> Path:
    """The GPU-alone library of a compile that asks ``gpu_data_type="auto"``: where the target
    is reachable (:func:`~codl_tvm.objectives.measure.gpu_data_measurement`), the model built
    with buffers and, where the device can hold them, images, timed round-robin on this
    machine or on the device behind ``options.tracker`` as :func:`verify` times
    (:func:`time_here`, :func:`time_remote`; an image build's VM gets the OpenCL device once
    per VM slot) and the lower median kept; elsewhere the device's capability decides
    (:meth:`~codl_tvm.build.cache.Libraries.set_gpu_data`), recorded as unchecked. Through a
    tracker the remote device's own image support may rule images out first
    (:func:`remote_gpu_data`).

    ``manifest.extra["gpu"]`` gets the measured medians (``measured_ms``, by data type), their
    samples, where and how many rounds, or ``unchecked``; ``manifest.vm_devices`` the kept
    build's. The candidates are timed with their weights embedded (finalize builds the kept
    one again with its weights beside where asked). An image build that fails to build or
    run is dropped (``gpu["dropped"]``, one warning): buffers decide; the buffer build's
    failure raises, as a build for the GPU alone would.
    """
    if options.device != "opencl":  # a co-executed compile's fallback: its own record
        return libraries.single("opencl")
    rounds, unchecked = gpu_data_measurement(options, libraries.preset)
    if not rounds:
        # a co-executed compile that fell back to the GPU has no record (and nothing to choose)
        if unchecked is not None:
            manifest.extra["gpu"]["unchecked"] = unchecked
        return libraries.single("opencl")
    gpu = manifest.extra["gpu"]
    if options.remote is not None:
        remote_gpu_data(model, libraries, *options.remote)
    names = {t: f"opencl:{t}" for t in libraries.gpu_data_candidates()}
    libs: dict[str, Path] = {}
    dropped: dict[str, str] = {}
    placement, libraries.weights_placement = libraries.weights_placement, "embedded"
    try:
        for data_type, spec in libraries.gpu_data_candidates().items():
            try:
                libs[names[data_type]] = libraries.get(names[data_type], spec)
            except Exception as exc:  # a kernel that does not build on images: buffers can
                if data_type == "buffer":
                    raise
                dropped[data_type] = f"its build failed: {error_summary(str(exc))}"
    finally:
        libraries.weights_placement = placement
    values = random_inputs(model, options.seed)
    inputs = [values[s.name] for s in model.inputs]
    failed: dict[str, Exception] = {}
    devices = {n: libraries.gpu_vm_devices(t) for t, n in names.items()}
    if options.remote is None:
        warm_built_here(libs, libraries, model)
        samples, where = time_here(libs, inputs, rounds, failed, devices), "this machine"
    else:
        samples, where = time_remote(libs, inputs, rounds, *options.remote, failed, devices)
    for data_type, name in names.items():
        if name not in failed:
            continue
        reason = error_summary(str(failed[name])) or type(failed[name]).__name__
        if data_type == "buffer":
            raise ArtifactError(
                f"{model.path}: the build for the GPU alone on buffers failed to run on "
                f"{where}: {reason}"
            )
        dropped[data_type] = f"its run failed: {reason}"
    for data_type, reason in dropped.items():
        logger.warning("gpu_data_type auto: dropping the %s build: %s", data_type, reason)
    samples_ms = {t: samples[n] for t, n in names.items() if n in samples}
    ms = {t: float(np.median(v)) for t, v in samples_ms.items()}
    kept = min(ms, key=ms.get)
    libraries.keep_gpu_data(kept)
    gpu.update(data_type=kept, measured_ms=ms, samples_ms=samples_ms, measured_on=where)
    gpu["rounds"] = rounds
    if dropped:
        gpu["dropped"] = dropped
    manifest.vm_devices = libraries.gpu_vm_devices()
    # verify's line for co-execution, in the same words
    logger.info(
        "GPU data type measured on %s (median of %d rounds): %s; keeping %ss%s",
        where,
        rounds,
        ", ".join(f"{t}s {v:.3f} ms" for t, v in ms.items()),
        kept,
        "" if "image" in names else f" (images not timed: {gpu.get('why')})",
    )
    return libs[names[kept]]


def image_candidate(libraries: Libraries, dropped: dict[str, str]) -> dict[str, Path]:
    """The primary plan's build with its GPU parts on images, ``{"coexec:image": library}``,
    where a measured ``auto`` times it beside the buffer build ``"coexec"``
    (:attr:`~codl_tvm.build.cache.Libraries.measure_images`,
    :mod:`codl_tvm.objectives.gpu_data`); empty otherwise, or where it fails to build (then
    dropped, :func:`drop`: the buffer build decides)."""
    if not libraries.measure_images or "coexec" not in libraries.specs:
        return {}
    path = build_candidate(IMAGE_CANDIDATE, libraries.image_variant, dropped, libraries)
    return {} if path is None else {IMAGE_CANDIDATE: path}


def remote_gpu_data(model: OnnxModel, libraries: Libraries, tracker: str, key: str) -> None:
    """Check the image candidate of ``gpu_data_type="auto"`` against the image support of a
    device of ``key`` behind ``tracker``, the device that times it
    (:func:`~codl_tvm.rpc.remote_vm.remote_image_caps`): where the model's tensors cannot be
    its images, buffers are kept (``libraries.gpu_data["why"]`` names the remote device and the
    limit, as this machine's device's check does; :func:`~codl_tvm.build.texture.check_device`).

    The capability rule of :meth:`~codl_tvm.build.cache.Libraries.set_gpu_data` read this
    machine's device (or none, for a preset that cross-compiles); the remote device can only
    rule images out. A server that cannot report its image support leaves the rule as it was.

    Raises
    ------
    ArtifactError
        The tracker or the device cannot be reached.
    codl_tvm.core.errors.DeviceSupportError
        ``gpu_dtype`` is float16 and the remote device lacks ``cl_khr_fp16``.
    """
    # deferred: codl_tvm.build.texture imports TVM's Adreno backend (as build.cache defers it)
    from codl_tvm.build.texture import check_device

    if "image" not in libraries.gpu_data_candidates():
        return
    try:
        remote = request_remote(tracker, key)
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    try:
        caps = remote_image_caps(remote)
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    finally:
        remote.close()
    if caps is None:
        logger.info("%s does not report its image support: images stay a candidate", remote.name)
        return
    data_type, why = check_device(model.mod, caps, "auto", libraries.gpu_data["dtype"])
    if data_type == "buffer":
        libraries.keep_gpu_data("buffer")
        libraries.gpu_data["why"] = why
        logger.info("GPU tensors in buffers on %s: %s", remote.name, why)


def build_candidate(
    name: str, build: Callable[[], Path], dropped: dict[str, str], libraries: Libraries
) -> Path | None:
    """``build()``, the library of candidate ``name``; None where it fails: the candidate is
    then dropped (:func:`drop`) and the others decide."""
    try:
        return build()
    except Exception as exc:  # a kernel that does not build for its device, and any other
        logger.debug("the %s build failed", name, exc_info=True)
        drop(dropped, name, "build", exc, libraries.preset)
        return None


def drop(
    dropped: dict[str, str],
    name: str,
    stage: str,
    exc: BaseException,
    preset: TargetPreset,
    where: str | None = None,
) -> None:
    """Record candidate ``name`` as dropped (``dropped[name]``: the reason) and say so in one
    warning line naming the candidate, its processors and the operator the error names.

    ``stage`` is ``"build"`` or ``"run"``; ``where`` the machine that ran it (None: a build,
    or this machine)."""
    message = str(exc)
    operator = operator_named(message)
    reason = (
        f"its {'build' if stage == 'build' else 'run'} failed"
        + (f" in operator {operator}" if operator else "")
        + f": {error_summary(message) or type(exc).__name__}"
    )
    dropped[name] = reason
    logger.warning(
        "verify: dropping %s: %s", candidate_words(name, preset, where), reason.replace("\n", " ")
    )


#: Where an error message names the function (the operator) that failed, first match wins:
#: TVMScript of a PrimFunc (``def fused_conv2d_add(...)``), a named PrimFunc, function or
#: kernel, a global (``@fused_conv2d``), a fused operator's name.
_OPERATOR_PATTERNS = (
    re.compile(r"\bdef\s+([A-Za-z_]\w*)\s*\("),
    re.compile(r"(?:PrimFunc|[Ff]unction|[Kk]ernel)\s+[`'\"]?@?([A-Za-z_]\w*_\w*)"),
    re.compile(r"@([A-Za-z_]\w*)\b(?![.\w])"),
    re.compile(r"\b(fused_\w+)"),
)


def operator_named(message: str) -> str | None:
    """The operator (a PrimFunc or kernel name) a TVM error message names, else None."""
    for pattern in _OPERATOR_PATTERNS:
        found = pattern.search(message)
        if found:
            return found.group(1)
    return None


def error_summary(message: str, limit: int = 200) -> str:
    """One line of an error message: its first line that says something (TVM's messages start
    with a traceback or the IR only in some builds), at most ``limit`` characters."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if lines and lines[0].startswith("Traceback"):
        lines = lines[-1:]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        # a header ("Compilation error:"): the first line below it that names an error
        text += " " + next((ln for ln in lines[1:] if "error" in ln.lower()), lines[1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def candidate_words(name: str, preset: TargetPreset, where: str | None = None) -> str:
    """A candidate and the processors it runs on, in words: "the GPU alone (OpenCL: <device>)",
    "the CPU alone (LLVM: <cpu>)", "co-executed (h_only plan) (OpenCL: <device> + CPU)"."""
    device = name.split(":", 1)[0]
    cpu = cpu_record(preset.target("cpu"))
    cpu_words = f"LLVM: {cpu['name']}, {cpu['arch']}"
    if device == "cpu":
        return f"the CPU alone ({cpu_words})"
    gpu_words = f"OpenCL: {_gpu_name(preset, where)}"
    if device == "opencl":
        return f"the GPU alone ({gpu_words})"
    return f"{_described(name)} ({gpu_words} + CPU {cpu_words})"


def _gpu_name(preset: TargetPreset, where: str | None) -> str:
    """The OpenCL device a candidate ran on (``where``: the remote), or the one this machine
    has for a preset built for it, else the preset's GPU kind."""
    if where is not None and where != "this machine":
        return where
    if not preset.is_cross and runtime.is_available():
        with contextlib.suppress(Exception):  # only words for a message
            return runtime.info().devices[0].name
    return str((preset.gpu or {}).get("device") or f"preset {preset.name}")


def _described(build: str) -> str:
    """A timed build in words: ``cpu`` -> "the CPU alone", ``coexec:h_only`` -> "co-executed
    (h_only plan)"."""
    if build in PROCESSOR_NAMES:
        return f"the {PROCESSOR_NAMES[build]} alone"
    if build == IMAGE_CANDIDATE:
        return "co-executed, GPU parts on images"
    _, _, plan = build.partition(":")
    return "co-executed" + (f" ({plan} plan)" if plan else "")


def time_here(
    libs: dict[str, Path],
    inputs,
    rounds: int,
    failed: dict[str, Exception] | None = None,
    vm_devices: dict[str, list[str]] | None = None,
) -> dict[str, list[float]]:
    """Median of 2 runs per round, the builds round-robin, so drift does not favour one.

    With ``failed``, a build that does not load or run is left out from then on and its error
    recorded there (``failed[name]``); without, the error is raised. Each build's VM gets the
    devices its name's processor set needs (``coexec``: OpenCL and CPU), or those
    ``vm_devices[name]`` names (``"opencl"``, ``"cpu"``: an image build's VM needs one device
    per memory scope, :meth:`~codl_tvm.build.cache.Libraries.gpu_vm_devices`)."""
    runtime.load()
    vms = {}
    for name, path in libs.items():
        # coexec: an image build's texture scopes take the slots after the CPU's (a buffer
        # build leaves them unused)
        coexec = [tvm.opencl(0), tvm.cpu(0), tvm.opencl(0), tvm.opencl(0)]
        devices = {"coexec": coexec, "cpu": [tvm.cpu(0)]}.get(
            name.split(":", 1)[0], [tvm.opencl(0)]
        )
        if vm_devices is not None and name in vm_devices:
            devices = [tvm.device(d, 0) for d in vm_devices[name]]
        try:
            lib = tvm.runtime.load_module(str(path))
            # every candidate's OpenCL programs are created on threads from here on, all at
            # once, instead of one kernel at a time at its first launch (PoCL compiles each
            # with LLVM: a default compile's whole first round otherwise)
            for mod in opencl_modules(lib):
                runtime.build_programs(mod, 0, build_threads(), wait=False)
            vms[name] = (VirtualMachine(lib, devices), devices[0])
        except Exception as exc:
            if failed is None:
                raise
            failed[name] = exc
    samples: dict[str, list[float]] = {name: [] for name in vms}
    for _ in range(rounds):
        for name, (vm, dev) in list(vms.items()):
            try:
                samples[name].append(time_vm(vm, dev, inputs, number=2, repeat=1).median_ms)
            except Exception as exc:
                if failed is None:
                    raise
                failed[name] = exc
                del vms[name], samples[name]
    return samples


def warm_built_here(libs: dict[str, Path], libraries: Libraries, model: OnnxModel) -> None:
    """Where ``libraries.warm_up`` says so, warm up (:func:`~codl_tvm.runtime.warm_up.warm_up`)
    each OpenCL build of ``libs`` this process built, before its first timed run, on the VM
    devices its spec gives (:func:`~codl_tvm.build.parallel.vm_devices`, as a worker warms its
    build); worker builds were warmed by their worker, cached ones by the compile that built
    them. The seconds go to ``libraries.builds[name]``."""
    if not libraries.warm_up:
        return
    inputs = [(spec.shape, spec.dtype) for spec in model.inputs]
    ahead, libraries.warm_ahead = libraries.warm_ahead, None  # for the first, if started
    try:
        for name, path in libs.items():
            record, spec = libraries.builds.get(name, {}), libraries.specs[name]
            if record.get("source") != "here" or "warm_s" in record or spec.device == "cpu":
                continue  # CPU code needs no compiling at its run
            seconds = warm_up(path, vm_devices(spec), inputs, processes=ahead)
            record["warm_s"], ahead = round(seconds, 3), None
    finally:
        if ahead is not None:  # nothing built here needed them (a cached build)
            ahead.close()


def time_remote(
    libs: dict[str, Path],
    inputs,
    rounds: int,
    tracker: str,
    key: str,
    failed: dict[str, Exception] | None = None,
    vm_devices: dict[str, list[str]] | None = None,
):
    """Each build uploaded to one device of ``key`` and timed there as :func:`time_here` times
    here: all loaded in one session and run once, then ``rounds`` rounds, the builds
    round-robin, each round one sample (the mean of 2 runs).

    Each build's VM gets the remote's devices of its name's processor set, or those
    ``vm_devices[name]`` names (an image build's: the OpenCL device once per VM slot,
    :class:`~codl_tvm.rpc.remote_vm.RemoteVM`). With ``failed``, a build the device fails to
    load or run is left out from then on and its error recorded there (``failed[name]``);
    without, it raises :class:`ArtifactError`."""
    try:
        remote = request_remote(tracker, key)
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    try:
        info = check_remote_versions(remote)
        if (info or {}).get("opencl") != "1":
            raise ArtifactError(
                f"verify: remote device {remote.name} has no usable OpenCL runtime (start its "
                "server with `codl-tvm serve --opencl`)"
            )
        vms: dict[str, RemoteVM] = {}
        for name, path in libs.items():
            processors = name.split(":", 1)[0]
            # coexec: as time_here gives it, the OpenCL device again for an image build's
            # texture scopes after the CPU's slot (a buffer build leaves them unused)
            default = ["opencl", "cpu", "opencl", "opencl"] if processors == "coexec" else None
            devices = (vm_devices or {}).get(name) or default or vm_devices_for(processors)
            try:
                vm = RemoteVM(remote, path, devices)
                vm.set_inputs(inputs)
                vm.run()  # the first run creates the OpenCL programs
                vms[name] = vm
            except RemoteFailure as exc:  # this build failed there: the others may not
                if failed is None:
                    raise
                failed[name] = exc
        samples: dict[str, list[float]] = {name: [] for name in vms}
        for _ in range(rounds):
            for name, vm in list(vms.items()):
                try:
                    samples[name] += vm.time(number=2, repeat=1)
                except RemoteFailure as exc:
                    if failed is None:
                        raise
                    failed[name] = exc
                    del vms[name], samples[name]
        where = f"{remote.name} (RPC {tracker}, key {key})"
        if (info or {}).get("emulated"):  # e.g. qemu: the choice below follows no real latency
            where += f" [EMULATED ({info['emulated']}): not hardware latencies]"
        return samples, where
    except RPCError as exc:
        raise ArtifactError(f"verify: {exc}") from None
    finally:
        vms = {}  # the remote VMs go before the session
        remote.close()


def refine_from_timelines(traced, splits: dict, inputs, plan, traces: int, step: float = 1.0):
    """Take ``traces`` timelines of ``traced`` (anything with a ``vm``; its kernel record is
    ``splits``) and refine ``plan`` from them; returns ``(refined plan, record)`` (the record
    without its ``"from"``). Raises :class:`~codl_tvm.planner.split.refine.RefineError`."""
    timelines = [
        trace_inference(traced, inputs, warmup=1 if i == 0 else 0, kernel_splits=splits)
        for i in range(traces)
    ]
    refined, rows = refine_plan(plan, splits, split_times(timelines), step=step)
    return refined, {
        "from_plan": plan.to_dict(),
        "traces": traces,
        "step": step,
        "span_ms": [round(t.span_us() / 1e3, 4) for t in timelines],
        "splits": rows,
    }


def refined_candidates(
    model, source, plan, library, libraries, refine, seed, seen, refined, mode, dropped=None
) -> dict:
    """``refine = (rounds, traces)`` rounds of refinement for ``--verify``: timelines of the
    co-executed build ``source`` (its ``library``, built with ``plan``), each split balanced
    from them (:func:`codl_tvm.planner.split.refine.refine_plan`), the result built as
    ``coexec:refined`` (then ``coexec:refined2`` from that, ...). Returns ``{name: library}``
    and records ``refined[name] = (plan, record)``; stops early when a round changes nothing
    or cannot be refined. ``mode``: the planner mode the refined plans descend from. A refined
    plan that does not build is dropped (:func:`drop`, recorded in ``dropped``) and ends the
    rounds."""
    dropped = {} if dropped is None else dropped
    rounds, traces = refine
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]
    found = {}
    for r in range(1, rounds + 1):
        splits = libraries.kernel_splits.get(source)
        if not splits:
            logger.info("verify: %s has no kernel record; nothing to refine", source)
            break
        # the slots after the CPU's: an image build's texture scopes (see time_here)
        devices = [tvm.opencl(0), tvm.cpu(0), tvm.opencl(0), tvm.opencl(0)]
        vm = VirtualMachine(tvm.runtime.load_module(str(library)), devices)
        try:
            new, record = refine_from_timelines(
                SimpleNamespace(vm=vm), splits, inputs, plan, traces
            )
        except RefineError as exc:
            logger.info("verify: %s cannot be refined: %s", source, exc)
            break
        text = new.to_json()
        if text in seen:
            logger.info("verify: refining %s gives no new plan; no more rounds", source)
            break
        seen.add(text)
        name = "coexec:refined" if r == 1 else f"coexec:refined{r}"
        logger.info(
            "verify: %s from %d timelines of %s: %s",
            name,
            traces,
            source,
            ", ".join(moves(record["splits"])),
        )
        library = build_candidate(name, lambda: libraries.coexec(name, new), dropped, libraries)
        if library is None:
            break
        refined[name] = (new, {"from": source, "mode": mode, **record})
        found[name] = library
        source, plan = name, new
    return found
