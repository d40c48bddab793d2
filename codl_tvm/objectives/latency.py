"""``compile_artifact``: plan an ONNX model, build it and write the artifact directory.

The steps, each in its own module: the plan comes from the planning policy
(:func:`codl_tvm.planner.policy.resolve_plan`, shared with ``run --plan auto``); the libraries
from :class:`~codl_tvm.build.cache.Libraries` (keyed by a
:class:`~codl_tvm.build.cache.BuildSpec`); ``--verify`` timing from
:mod:`codl_tvm.objectives.verify`; the directory is written through
:mod:`codl_tvm.runtime.artifact`, which swaps it in only when complete.

Compiling needs TVM's compiler, which a runtime-only TVM (a device running artifacts) lacks:
the planning policy and the schedules, which need it, are imported inside the functions that
compile, so ``codl_tvm.artifact`` still imports there to load and run artifacts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from codl_tvm import runtime
from codl_tvm.build.cache import Libraries
from codl_tvm.build.coexec import placement_report
from codl_tvm.build.runner import build
from codl_tvm.build.targets import cpu_record, get_preset
from codl_tvm.core.errors import (
    ArtifactError,
    ModelFileError,
    NoDefaultModelError,
    PlanError,
    PlannerError,
)
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives.verify import refined_candidates
from codl_tvm.objectives.verify import verify as verify_builds
from codl_tvm.planner import ALL_MODES, PlannerConfig
from codl_tvm.runtime import program_binaries
from codl_tvm.runtime.artifact import (
    _OWN_FILES,
    _PROCESSOR,
    ARTIFACT_FORMAT,
    ARTIFACT_VERSION,
    DEVICES,
    LIBRARY,
    MANIFEST,
    REFERENCE,
    _sha256,
    _spec,
    _staged,
    _version,
    _write_plan,
)
from codl_tvm.runtime.weights import PLACEMENTS, WEIGHTS

__all__ = ["compile_artifact", "default_cost_model_for"]


def default_cost_model_for(preset: str | None) -> Path:
    """The shipped cost model for a target preset (see ``codl_tvm.cost_model.defaults``)."""
    return default_model_path(preset)


def compile_artifact(
    model_path: str | Path,
    out_dir: str | Path,
    *,
    device: str = "coexec",
    mode: str = "codl",
    cost_model: str | Path | None = None,
    plan=None,
    preset: str | None = None,
    reference: bool = True,
    seed: int = 0,
    force: bool = False,
    winograd: bool | None = None,
    packed: bool | None = None,
    verify: int = 0,
    verify_modes: Sequence[str] = (),
    tracker: str | None = None,
    key: str | None = None,
    build_cache: str | Path | None = None,
    log: Callable[[str], None] = print,
    coexec_cpu_alone: bool | None = None,
    verify_calibrate: bool = True,
    split_channel_blocks: bool = True,
    split_row_blocks: bool = False,
    refine: int = 0,
    refine_traces: int = 5,
    weight_gbps: tuple[float, float] | None = None,
    processor_scale: tuple[float, float] = (1.0, 1.0),
    weights: str = "embedded",
) -> Path:
    """Plan and build an ONNX model into an artifact directory.

    Parameters
    ----------
    model_path
        The ONNX model.
    out_dir
        The artifact directory (created; must be new, empty, or an earlier artifact with
        ``force``).
    device
        ``coexec`` (GPU + CPU), ``cpu`` or ``opencl``.
    mode
        Planner mode (``codl_tvm.planner.ALL_MODES``: CoDL's, a placement mode such as
        ``hope``, or ``auto``) when ``plan`` is not given.
    cost_model
        Cost-model file for the planner; default: the shipped model for ``preset``.
    plan
        A :class:`~codl_tvm.core.plan.PartitionPlan` to use instead of planning.
    preset
        Target preset (``codl_tvm.build.targets``); default ``opencl`` (this machine's OpenCL device
        and CPU).
    reference
        Store seeded inputs and the unpartitioned host-CPU outputs for ``run`` to check.
    seed
        Seed of the reference inputs.
    force
        Replace an earlier artifact in ``out_dir``.
    winograd
        True: build qualifying 3x3 stride-1 convs as Winograd convs on both processors
        (:func:`codl_tvm.schedules.winograd_enabled` for every preset). False: never.
        None (default): only builds for the CPU alone (``device="cpu"``, a planner fallback to
        the CPU, ``verify``'s CPU candidate) on the CPU presets where Winograd measured faster
        on whole models (:data:`codl_tvm.schedules.config.WINOGRAD_CPU_ALONE`).
    packed
        True: build qualifying CPU convs as channel-packed convs
        (:mod:`codl_tvm.schedules.packed`), co-executed CPU parts included. False: never.
        None (default): only builds for the CPU alone, on the CPU presets of
        :data:`codl_tvm.schedules.config.PACKED_CPU_ALONE` (co-executed parts keep the kernels
        the cost model was fitted on).
    verify
        When > 0 (``device="coexec"``): build the plan co-executed and the model for each
        processor alone, time the three builds on this machine round-robin (``verify`` rounds)
        and keep the fastest, whatever the cost model predicted.
        The cost model cannot see everything that co-execution costs (contention for memory
        bandwidth, synchronisation, kernels outside the plan), so this is what guarantees
        that an artifact is never slower than the best single processor, at the price of two
        more builds and a few seconds of runs. Where the two processors' measured latencies
        missed their predictions by different factors (more than
        :data:`CALIBRATION_MIN_SHIFT` apart), the plan of ``mode`` is re-made with each
        processor's predictions scaled by its ``measured / predicted`` ratio and, if it
        differs from the plans timed, joins a second timing of every build
        (``manifest["plan"]["calibration"]``; off with ``verify_calibrate=False``).
    verify_modes
        With ``verify``: more planner modes (``codl_tvm.planner.ALL_MODES``, e.g. ``codl_no_chain``,
        ``h_only``) whose plans join the timed candidates when they differ from ``mode``'s.
        The cost model cannot rank plans whose predicted latencies are within its error, so the
        measurement picks among them; the artifact's plan files are the chosen plan's.
    tracker, key
        With ``verify``: time the three builds on a device of ``key`` behind this TVM RPC
        tracker (``HOST:PORT``) instead of this machine (each build ``verify`` repeats in turn);
        the way to verify for a phone or board (presets that cross-compile need it).
    build_cache
        A directory of exported libraries to reuse: a library whose model file, processor set,
        plan, targets, Winograd setting and codl-tvm/TVM code match one built before is copied
        from it instead of built again, and every library built is stored there. ``--verify``
        then builds only what no earlier compile built (e.g. after compiling each planner mode
        and each processor alone, in parallel processes, a later ``--verify`` only times).
    log
        Where progress lines go.
    coexec_cpu_alone
        With ``device="coexec"``: every CPU function of the co-executed build (the CPU parts
        of split operators and the operators the plan keeps whole on the CPU) gets the kernels
        of the builds for the CPU alone: their Winograd and packed convs and
        :data:`~codl_tvm.schedules.config.CPU_ALONE_SETTINGS`. None (default): on when the
        planner's cost model was fitted with a dataset of those kernels (``codl-tvm profile
        --winograd --packed --cpu-alone``; its ``meta["cpu_alone_settings"]``), so the planner
        predicts the kernels the build makes; off with a given plan. True/False decide alone.
    split_channel_blocks
        With ``device="coexec"``: an InstanceNorm-like block (statistics over the spatial axes,
        then per-channel elementwise ops) that reads a split's output is split along channels
        at the plan's ``block_ratio`` (the planner's whole-model balance), so both processors
        normalise instead of one while the other waits (FST on the emulated SoC: 0.86-0.96x
        the latency). False keeps such
        blocks whole on one processor.
    split_row_blocks
        With ``device="coexec"``: a row-local block that reads an H split's output (LRN:
        channel pads and slices and elementwise ops) is split along rows at that split's ratio,
        so both processors compute it instead of one while the other waits. False (the
        default) keeps such blocks whole on one processor: AlexNet at k = 12 measured
        1.04-1.07x slower split (see docs/benchmarks.md).
    refine
        With ``verify`` (on this machine): after the first timing, take ``refine_traces``
        timelines of the fastest co-executed build, balance each split from them
        (:func:`refined_plan`'s rule, :func:`codl_tvm.planner.split.refine.refine_plan`) and build
        the result as candidate ``coexec:refined``; ``refine`` > 1 refines that one again
        (``coexec:refined2``, ...). Every build is then timed again and the fastest kept, so
        a refinement that does not pay is never chosen (``manifest["plan"]["refine"]``).
    refine_traces
        Timelines per refinement round.
    weight_gbps
        ``(cpu, gpu)`` in-model weight-streaming rates, GB/s: the planner predicts every part
        (and whole operator) no faster than its weights' bytes over its processor's rate
        (:attr:`~codl_tvm.planner.PlannerConfig.weight_gbps`; recorded in
        ``manifest["plan"]["weight_gbps"]``). None: off.
    processor_scale
        ``(cpu, gpu)`` factors on the cost model's predicted compute latencies
        (:attr:`~codl_tvm.planner.PlannerConfig.processor_scale`): planning for a device whose
        processors have other core counts than the profiled pair (recorded in
        ``manifest["plan"]["processor_scale"]``). ``--verify``'s calibration applies on top.
    weights
        ``"embedded"``: every weight is a constant of ``model.so`` (read and placed on the
        device before the first operator runs). ``"beside"``: the large ones are in
        ``weights.bin`` beside it, read on a thread while the first inference runs, each
        awaited before its first use (:mod:`codl_tvm.runtime.weights`;
        ``manifest["weights"]``). ``--verify`` times embedded builds; the chosen one is built
        again with its weights beside.

    Returns
    -------
    Path
        ``out_dir``.
    """
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.planner.policy import cost_model_cpu_alone

    if device not in DEVICES:
        raise ArtifactError(f"device {device!r} is not one of {DEVICES}")
    if weight_gbps is not None:
        try:  # the planner's own check, before anything is built
            weight_gbps = PlannerConfig(weight_gbps=weight_gbps).weight_gbps
        except PlannerError as exc:
            raise ArtifactError(str(exc).removeprefix("planner: ")) from None
    processor_scale = tuple(float(x) for x in processor_scale)
    if len(processor_scale) != 2 or not all(math.isfinite(x) and x > 0 for x in processor_scale):
        raise ArtifactError(
            f"processor_scale must be two positive factors (cpu, gpu), got {processor_scale!r}"
        )
    if weights not in PLACEMENTS:
        raise ArtifactError(f"weights {weights!r} is not one of {', '.join(PLACEMENTS)}")
    if not isinstance(verify, int) or verify < 0:
        raise ArtifactError(f"verify must be a number of rounds >= 0, got {verify!r}")
    if (tracker is None) != (key is None):
        raise ArtifactError("give both the RPC tracker (HOST:PORT) and the device key, or neither")
    if tracker is not None and not verify:
        raise ArtifactError("an RPC tracker is only used to --verify; give --verify N too")
    for name, value, least in (("refine", refine, 0), ("refine_traces", refine_traces, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ArtifactError(f"{name} must be a whole number >= {least}, got {value!r}")
    if refine and not verify:
        raise ArtifactError(
            "--refine makes candidates for --verify to time against the plan; give --verify N too"
        )
    if refine and tracker is not None:
        raise ArtifactError(
            "--refine takes timelines on this machine; it cannot be combined with --tracker"
        )
    if refine and device != "coexec":
        raise ArtifactError(f"--refine balances co-executed splits; --device is {device!r}")
    if coexec_cpu_alone is None:
        coexec_cpu_alone = (
            device == "coexec" and plan is None and cost_model_cpu_alone(cost_model, preset)
        )
    elif coexec_cpu_alone and device != "coexec":
        raise ArtifactError(
            f"--coexec-cpu-alone-kernels applies to --device coexec, not {device!r} (builds for "
            "the CPU alone use those kernels already)"
        )
    verify_modes = tuple(verify_modes)
    if verify_modes:
        bad = [m for m in verify_modes if m not in ALL_MODES]
        if bad:
            raise ArtifactError(
                f"--verify-modes: {', '.join(map(repr, bad))} not among the planner modes "
                f"{', '.join(ALL_MODES)}"
            )
        if not verify:
            raise ArtifactError("--verify-modes names plans to time; give --verify N too")
        if plan is not None:
            raise ArtifactError(
                "--verify-modes plans with the cost model; it cannot be combined with a given plan"
            )
    remote = None if tracker is None else (tracker, key)
    model_path = Path(model_path)
    out = Path(out_dir)
    if not model_path.is_file():
        raise ArtifactError(f"{model_path}: no such model file")
    with _staged(out, force) as stage:
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.schedules import packed_enabled, winograd_enabled

        with (
            winograd_enabled("all") if winograd else contextlib.nullcontext(),
            packed_enabled("all") if packed else contextlib.nullcontext(),
        ):
            _compile_into(
                _Request(
                    model_path=model_path,
                    out=stage,
                    device=device,
                    mode=mode,
                    cost_model=cost_model,
                    plan=plan,
                    preset=preset,
                    reference=reference,
                    seed=seed,
                    winograd=winograd,
                    packed=packed,
                    verify=verify,
                    verify_modes=verify_modes,
                    remote=remote,
                    build_cache=None if build_cache is None else Path(build_cache),
                    coexec_cpu_alone=bool(coexec_cpu_alone),
                    verify_calibrate=verify_calibrate,
                    split_channel_blocks=split_channel_blocks,
                    split_row_blocks=split_row_blocks,
                    refine=(refine, refine_traces),
                    weight_gbps=weight_gbps,
                    processor_scale=processor_scale,
                    weights=weights,
                ),
                log,
            )
    log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return out


@dataclass(frozen=True)
class _Request:
    """One compile's arguments, checked and normalised by :func:`compile_artifact` (see its
    parameters); ``out`` is the staging directory, ``remote`` the ``(tracker, key)`` pair or
    None, ``refine`` the ``(rounds, traces)`` pair."""

    model_path: Path
    out: Path
    device: str
    mode: str
    cost_model: str | Path | None
    plan: PartitionPlan | None
    preset: str | None
    reference: bool
    seed: int
    winograd: bool | None
    packed: bool | None
    verify: int
    verify_modes: tuple[str, ...]
    remote: tuple[str, str] | None
    build_cache: Path | None
    coexec_cpu_alone: bool
    verify_calibrate: bool
    split_channel_blocks: bool
    split_row_blocks: bool
    refine: tuple[int, int]
    weight_gbps: tuple[float, float] | None
    processor_scale: tuple[float, float]
    weights: str


def _compile_into(request: _Request, log: Callable[[str], None]) -> Path:
    """Plan, build and write the artifact of ``request`` into ``request.out``."""
    r = request
    model_path, out, device, mode, plan = r.model_path, r.out, r.device, r.mode, r.plan
    cost_model, preset, reference, seed = r.cost_model, r.preset, r.reference, r.seed
    winograd, packed, verify, verify_modes = r.winograd, r.packed, r.verify, r.verify_modes
    remote, build_cache, coexec_cpu_alone = r.remote, r.build_cache, r.coexec_cpu_alone
    verify_calibrate, refine, weight_gbps = r.verify_calibrate, r.refine, r.weight_gbps
    split_channel_blocks, split_row_blocks = r.split_channel_blocks, r.split_row_blocks
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.planner.policy import (
        coexec_cpu_algorithms,
        cost_model_cpu_alone,
        cpu_alone_algorithms,
        cpu_alone_packed,
        cpu_alone_winograd,
        planner_config,
        switch_on,
    )

    preset_obj = get_preset(preset or "opencl")
    model = load_onnx(model_path)
    manifest: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "version": ARTIFACT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "codl_tvm_version": _version("codl-tvm"),
        "tvm_version": tvm.__version__,
        "model": {
            # resolved: the manifest is read from other directories (refine, run)
            "file": str(model_path.resolve()),
            "sha256": _sha256(model_path),
            "inputs": [_spec(s) for s in model.inputs],
            "outputs": [_spec(s) for s in model.outputs],
        },
        "device": device,
        "vm_devices": {"coexec": ["opencl", "cpu"], "cpu": ["cpu"], "opencl": ["opencl"]}[device],
        "preset": preset_obj.name,
        "winograd": _winograd_on(),
        "winograd_cpu_alone": winograd is None and cpu_alone_winograd(preset_obj),
        "packed": _packed_on(),
        "packed_cpu_alone": packed is None and cpu_alone_packed(preset_obj),
    }
    cpu_target = preset_obj.target("cpu")
    # the instruction set the library's CPU code needs (also the OpenCL build's host code):
    # load_artifact refuses a machine without it instead of dying of an illegal instruction
    manifest["cpu"] = cpu_record(cpu_target)
    if verify and preset_obj.is_cross and remote is None:
        raise ArtifactError(
            f"--verify times the builds on this machine, but preset {preset_obj.name!r} "
            f"cross-compiles for {preset_obj.triple}; give --tracker HOST:PORT --key KEY to "
            "time them on the device through RPC"
        )
    work = Path(tempfile.mkdtemp(prefix="codl-artifact-"))
    libraries = Libraries(work, build_cache, model, manifest, preset_obj, log)
    # --verify times embedded builds (as every earlier compile cached them); the chosen one is
    # built again with its weights beside below
    libraries.weights_placement = "embedded" if verify else r.weights
    built = None  # the exported library
    switches = contextlib.ExitStack()  # algorithms switched on for co-executed CPU parts
    try:
        if device == "coexec":
            if preset_obj.gpu is None:
                raise ArtifactError(f"preset {preset_obj.name!r} has no GPU; use --device cpu")
            if coexec_cpu_alone:
                # the CPU-alone kernels everywhere on the CPU, whatever the cost model knows
                algos = cpu_alone_algorithms(preset_obj, winograd is not False, packed is not False)
                # deferred: needs TVM's compiler (see the module docstring)
                from codl_tvm.schedules import cpu_alone_settings

                switches.enter_context(cpu_alone_settings(True))
                manifest["coexec_cpu_alone_kernels"] = True
                libraries.coexec_cpu_alone = True
                if plan is None and cost_model_cpu_alone(cost_model, preset_obj.name):
                    log(
                        "co-executed CPU functions use the kernels of the build for the CPU "
                        "alone (CPU_ALONE_SETTINGS), which the cost model was profiled with"
                    )
                else:
                    log(
                        "co-executed CPU functions use the kernels of the build for the CPU "
                        "alone (CPU_ALONE_SETTINGS); the cost model was profiled with the "
                        "preset's, so the planner's CPU predictions describe those"
                    )
            else:
                algos = (
                    ()
                    if plan is not None
                    else coexec_cpu_algorithms(cost_model, preset_obj, winograd, packed)
                )
            switch_on(switches, algos, preset_obj)
            manifest["coexec_cpu_algorithms"] = list(algos)
            libraries.coexec_cpu_algorithms = algos
            if algos:
                log(
                    f"co-executed CPU parts use {' and '.join(algos)} kernels (the cost model has "
                    "data for them)"
                )
            alone = [
                name
                for name in cpu_alone_algorithms(preset_obj, winograd is None, packed is None)
                if name not in algos
            ]
            if alone and plan is None:
                # The planner predicts the CPU alone with the kernels the cost model knows.
                manifest["cpu_alone_unmodelled"] = alone
                log(
                    f"note: the build for the CPU alone uses {' and '.join(alone)} kernels, which "
                    "the cost model has no data for: the planner predicts the CPU alone (and CPU "
                    "parts) with direct kernels, so it may co-execute where the CPU alone is "
                    "faster; --verify measures instead (or profile them: codl-tvm profile "
                    f"--{' --'.join(alone)})"
                )
            planner_config = dataclasses.replace(
                planner_config(preset_obj),
                weight_gbps=weight_gbps,
                processor_scale=r.processor_scale,
            )
            choice = _make_plan(
                model, out, mode, cost_model, plan, preset_obj.name, manifest, log, planner_config
            )
            plan, report = choice.plan, choice.report
            single = None if choice.device == "coexec" else (choice.device, choice.reason)
            if single is not None and verify:
                # The measurement decides (the prediction may pick the wrong processor too).
                manifest["plan"]["predicted_fallback"] = single[1]
                single = None
            if single is not None:
                device, why = single
                manifest["device"] = device
                manifest["vm_devices"] = [device]
                manifest["plan"]["fallback"] = why
                log(f"not co-executing: {why}; building for the {_PROCESSOR[device]} alone")
        if device == "coexec":
            gpu_target = preset_obj.target("gpu")
            manifest["split_channel_blocks"] = bool(split_channel_blocks)
            manifest["split_row_blocks"] = bool(split_row_blocks)
            libraries.channel_blocks = bool(split_channel_blocks)
            libraries.row_blocks = bool(split_row_blocks)
            runtime.load()
            built = libraries.coexec("coexec", plan)
            manifest["kernel_splits"] = libraries.kernel_splits.get("coexec")
            placement = placement_report(model.mod, plan, split_channel_blocks, split_row_blocks)
            (out / "placement.json").write_text(json.dumps(placement, indent=2) + "\n")
            manifest["targets"] = {"gpu": str(gpu_target), "cpu": str(cpu_target)}
            if verify:
                candidates = {"coexec": built}
                plans = {}
                if verify_modes and report is not None:
                    plans = _candidate_plans(
                        model, plan, mode, verify_modes, manifest, log, planner_config
                    )
                    for name, (cand, _) in plans.items():
                        candidates[name] = libraries.coexec(name, cand)
                seen = {plan.to_json(), *(c.to_json() for c, _ in plans.values())}
                refined: dict[str, tuple] = {}  # name -> (plan, record)

                def more(ms):
                    """Candidates made from the first timing: calibrated, refined."""
                    found = {}
                    if report is not None and verify_calibrate:
                        found.update(
                            _calibrated_plans(
                                model, mode, report, ms, seen, manifest, log, planner_config
                            )
                        )
                    plans.update(found)
                    libs = {name: libraries.coexec(name, c) for name, (c, _) in found.items()}
                    if refine[0]:
                        source = min((k for k in ms if k.startswith("coexec")), key=ms.get)
                        libs.update(
                            refined_candidates(
                                model,
                                source,
                                plans[source][0] if source in plans else plan,
                                candidates[source],
                                libraries,
                                refine,
                                seed,
                                seen,
                                refined,
                                log,
                                source.split(":")[1]
                                if source in plans
                                else manifest["plan"].get("mode"),
                            )
                        )
                        manifest["plan"]["refine"] = {
                            "rounds": refine[0],
                            "traces": refine[1],
                            "candidates": {name: rec for name, (_, rec) in refined.items()},
                        }
                    return libs

                built = verify_builds(
                    model, candidates, libraries, verify, seed, manifest, remote, log, more
                )
                chosen = manifest["verify"]["chosen"]
                manifest["kernel_splits"] = libraries.kernel_splits.get(chosen)
                if chosen in plans:
                    _adopt_plan(out, model, *plans[chosen], chosen.split(":")[1], manifest)
                    if chosen.endswith(":calibrated"):
                        manifest["plan"]["calibrated"] = True
                elif chosen in refined:
                    new_plan, record = refined[chosen]
                    _adopt_plan(out, model, new_plan, None, record["mode"], manifest)
                    manifest["plan"]["source"] = "refined"
                    manifest["plan"]["refined"] = record
        else:
            target = cpu_target if device == "cpu" else preset_obj.target("gpu")
            if target is None:
                raise ArtifactError(f"preset {preset_obj.name!r} has no GPU; use --device cpu")
            built = libraries.single(device)
            manifest["targets"] = {device: str(target)}
        if r.weights == "beside":
            built = _weights_beside(libraries, built, out, manifest, log)
        else:
            manifest["weights"] = {"placement": "embedded"}
        shutil.move(str(built), out / LIBRARY)
        if "opencl" in manifest["vm_devices"]:
            # where this machine's OpenCL device is the preset's, ship its program binaries
            binaries = program_binaries.embed_for_preset(preset_obj, out / LIBRARY, out, log)
            manifest["program_binaries"] = binaries
        if manifest["device"] == "cpu" and manifest["winograd_cpu_alone"]:
            manifest["winograd"] = True  # the library is a build for the CPU alone
        if manifest["device"] == "cpu" and manifest["packed_cpu_alone"]:
            manifest["packed"] = True
        if reference:
            log("computing the reference outputs (unpartitioned model, host CPU)")
            values = random_inputs(model, seed)
            ordered = [values[s.name] for s in model.inputs]
            # deferred: needs TVM's compiler (see the module docstring)
            from codl_tvm.schedules import packed_enabled, winograd_enabled

            # the reference is the plain direct model
            with winograd_enabled(()), packed_enabled(()):
                outs = build(model.mod, "cpu", work_dir=work)(ordered)
            np.savez(
                out / REFERENCE,
                **{f"input:{k}": v for k, v in values.items()},
                **{f"output:{s.name}": o for s, o in zip(model.outputs, outs)},
            )
            manifest["reference"] = {"file": REFERENCE, "seed": seed, "target": "host llvm"}
    finally:
        switches.close()
        shutil.rmtree(work, ignore_errors=True)
    manifest["files"] = {
        p.name: _sha256(p) for p in sorted(out.iterdir()) if p.name in _OWN_FILES and p.is_file()
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if manifest.get("program_binaries") and program_binaries.is_pocl(runtime.info()):
        # PoCL compiles each kernel's work-group function at its first launch: binaries taken
        # after one run of the finished artifact carry them; where that run fails, the
        # binaries of the build stay (PoCL then compiles those functions at first launch)
        try:
            manifest["program_binaries"] = program_binaries.embed_after_warm_up(
                out, out / LIBRARY, log, manifest["program_binaries"]
            )
        except ArtifactError as exc:
            log(f"note: {exc}; the program binaries are kept as built")
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def _weights_beside(libraries: Libraries, built: Path, out: Path, manifest: dict, log) -> Path:
    """The library ``built`` with its weights beside it (built again if it has them embedded):
    its weights file moved to ``out`` and recorded in ``manifest["weights"]``."""
    name = libraries.name_of(built)
    if libraries.specs[name].weights != "beside":
        log(f"building the {name} library again with its weights beside it")
        built = libraries.rebuild(name, "beside")
        name = libraries.name_of(built)
    record = libraries.weights[name]
    shutil.move(str(built.with_suffix(".weights")), out / WEIGHTS)
    manifest["weights"] = {"placement": "beside", **record, "file": WEIGHTS}
    log(
        f"{len(record['tensors'])} weights ({record['bytes'] / 1e6:.1f} MB) beside the library in "
        f"{WEIGHTS}, loaded while the first inference runs"
    )
    return built


def _packed_on() -> bool:
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.schedules.config import packed_presets

    return bool(packed_presets())


def _winograd_on() -> bool:
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.schedules.config import winograd_presets

    return bool(winograd_presets())


def _make_plan(model, out: Path, mode, cost_model, plan, preset_name, manifest, log, config=None):
    """The plan of a co-executed compile (:func:`~codl_tvm.planner.policy.resolve_plan`, the
    plan resolution ``run --plan auto`` uses too), recorded in ``manifest["plan"]`` and
    written to ``out``."""
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.planner.policy import resolve_plan

    try:
        choice = resolve_plan(
            model.mod,
            plan=plan,
            mode=mode,
            cost_model=cost_model,
            preset=preset_name,
            config=config,
            model_name=Path(model.path).name,
        )
    except PlanError as exc:
        raise ArtifactError(f"plan: {exc}") from None
    except (PlannerError, ModelFileError, NoDefaultModelError) as exc:
        raise ArtifactError(str(exc)) from None
    if choice.source != "planner":
        manifest["plan"] = {"source": "given"}
    else:
        path, report = choice.cost_model, choice.report
        manifest["plan"] = {
            "source": "planner",
            "mode": report.mode,  # auto: the mode it chose
            "cost_model": {
                "file": str(path),
                "sha256": _sha256(path),
                "kind": choice.cost_model_kind,
            },
            "planning_s": round(choice.planning_s or 0.0, 4),
            "summary": report.summary.to_dict() if report.summary else None,
        }
        if report.candidates is not None:
            manifest["plan"]["auto"] = {"candidates_ms": dict(report.candidates)}
        if config is not None and config.weight_gbps is not None:
            manifest["plan"]["weight_gbps"] = list(config.weight_gbps)
        if config is not None and tuple(config.processor_scale) != (1.0, 1.0):
            manifest["plan"]["processor_scale"] = list(config.processor_scale)
        log(report.table())
    _write_plan(out, choice.plan, choice.report)
    return choice


def _candidate_plans(model, plan, mode, modes, manifest, log, config=None) -> dict[str, tuple]:
    """:func:`~codl_tvm.planner.policy.candidate_plans` with the cost model ``plan`` was made
    with; the modes that add a candidate are recorded in ``manifest["plan"]``."""
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.planner.policy import candidate_plans

    cost_model = manifest["plan"]["cost_model"]["file"]
    name = Path(model.path).name
    found = candidate_plans(model.mod, cost_model, plan, mode, modes, config, name, log)
    manifest["plan"]["verify_candidates"] = [mode, *(k.split(":", 1)[1] for k in found)]
    return found


def _calibrated_plans(model, mode, report, ms, seen: set, manifest, log, config) -> dict:
    """:func:`~codl_tvm.planner.policy.calibrated_plans` for ``--verify``'s first timing
    ``ms``; the calibration factors are recorded in ``manifest["plan"]["calibration"]``."""
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.planner.policy import calibrated_plans

    cost_model = manifest["plan"]["cost_model"]["file"]
    name = Path(model.path).name
    found, record = calibrated_plans(
        model.mod, cost_model, mode, report, ms, seen, config, name, log
    )
    if record is not None:
        manifest["plan"]["calibration"] = record
    return found


def _adopt_plan(out: Path, model, plan, report, mode: str, manifest) -> None:
    """Make the plan that ``--verify`` measured fastest the artifact's plan (its files and
    manifest entry); the primary plan's prediction stays on record."""
    record = manifest["plan"]
    record["planned_mode"] = record.get("mode")
    # an auto candidate's report names the mode it chose
    record["mode"] = report.mode if report is not None else mode
    record["summary"] = report.summary.to_dict() if report is not None and report.summary else None
    record.pop("auto", None)  # the primary plan's candidates
    if report is not None and report.candidates is not None:
        record["auto"] = {"candidates_ms": dict(report.candidates)}
    record["chosen_by_verify"] = True
    if report is None:  # a refined plan: the planner's report describes another plan
        for name in ("plan_report.json", "plan_report.txt"):
            (out / name).unlink(missing_ok=True)
    _write_plan(out, plan, report)
    # the blocks this build split with the plan, as the primary plan's report had them
    placement = placement_report(
        model.mod,
        plan,
        manifest.get("split_channel_blocks", True),
        manifest.get("split_row_blocks", False),
    )
    (out / "placement.json").write_text(json.dumps(placement, indent=2) + "\n")
