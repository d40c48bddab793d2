"""Deployable build artifacts: ``codl-tvm compile MODEL.onnx -o OUT/`` and ``codl-tvm run OUT/``.

An artifact directory holds everything needed to run a planned model on its device, and nothing
that needs TVM's compiler (it runs with a runtime-only TVM, e.g. on a phone or the device
machine):

``model.so``
    The library: OpenCL kernels for the GPU parts and LLVM kernels for the CPU parts
    (co-execution), or one processor's build.
``manifest.json``
    Format and version, the model (file, SHA-256, inputs, outputs), the processor set and VM
    device order, the targets, how the plan was made (planner mode, cost model file and its
    SHA-256), codl-tvm and TVM versions, and the SHA-256 of every file in the directory.
``plan.json``, ``plan_report.json``, ``plan_report.txt``, ``placement.json``
    The partition plan, the planner's report (one row per operator or chain with its reason)
    and where each part runs (co-execution only).
``reference.npz``
    Seeded inputs (``input:<name>``) and the unpartitioned model's outputs on the host CPU
    (``output:<name>``), so ``run OUT/`` checks the numerics on the device with no compiler.

``compile_artifact`` never overwrites a directory it did not write; ``force=True`` replaces an
earlier artifact's files only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.errors import (
    ArtifactError,
    ModelFileError,
    NoDefaultModelError,
    PlanError,
    PlannerError,
)
from codl_tvm.targets import cpu_record, missing_cpu_features

__all__ = [
    "ARTIFACT_FORMAT",
    "ARTIFACT_VERSION",
    "Artifact",
    "ArtifactError",
    "compile_artifact",
    "compile_refined",
    "is_artifact",
    "load_artifact",
    "refine_artifact",
    "refined_plan",
]

# The planning policy (codl_tvm.planner.policy) needs TVM's compiler, which a runtime-only TVM
# (a device running artifacts) lacks: it is imported where compiling starts, and its names that
# callers import from here resolve on first use.
_POLICY_NAMES = ("MIN_PREDICTED_SPEEDUP", "cost_model_cpu_alone", "planning_context")


def __getattr__(name: str) -> Any:
    if name in _POLICY_NAMES:
        from codl_tvm.planner import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ARTIFACT_FORMAT = "codl-tvm-artifact"
ARTIFACT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
REFERENCE = "reference.npz"
DEVICES = ("coexec", "cpu", "opencl")
_PROCESSOR = {"cpu": "CPU", "opencl": "GPU"}  # for log lines
_OWN_FILES = (
    MANIFEST,
    LIBRARY,
    REFERENCE,
    "plan.json",
    "plan_report.json",
    "plan_report.txt",
    "placement.json",
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_artifact(path: str | Path) -> bool:
    """Whether ``path`` is a directory with a codl-tvm artifact manifest."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("format") == ARTIFACT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _check_out(out: Path, force: bool) -> None:
    """Refuse an output directory that ``compile_artifact`` may not replace (touches nothing)."""
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not is_artifact(out):
            raise ArtifactError(
                f"{out}: directory is not empty and holds no codl-tvm artifact; "
                "choose an empty or new directory (nothing in it was touched)"
            )
        if not force:
            raise ArtifactError(f"{out}: holds an artifact already; pass --force to replace it")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _OWN_FILES)
        if foreign:
            raise ArtifactError(
                f"{out}: holds files codl-tvm did not write ({', '.join(foreign[:5])}); "
                "refusing to replace the artifact there"
            )


@contextlib.contextmanager
def _staged(out: Path, force: bool) -> Iterator[Path]:
    """A new directory beside ``out`` to write the artifact into; on success it replaces
    ``out``, on any failure it is removed and ``out`` is as it was.

    Writing in place would destroy an earlier artifact before the new one exists (a
    ``--force`` compile that fails would leave nothing) and leave an empty ``out`` behind a
    failed compile. The staging directory sits in ``out``'s parent, so the swap is two renames
    on one file system: the old artifact is renamed aside, the new one in, then the old one is
    deleted. Parent directories created for ``out`` are removed again on failure.
    """
    _check_out(out, force)
    # a link to the directory: replace the directory it names, and keep the link
    out = out.resolve() if out.is_symlink() else out.absolute()
    created = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # mkdir, not mkdtemp: the directory gets the user's umask, as `out` would
        stage = out.parent / f".{out.name}.codl-new-{os.getpid()}-{secrets.token_hex(4)}"
        stage.mkdir()
    except OSError as exc:
        raise ArtifactError(f"{out}: cannot create the artifact directory ({exc})") from None
    try:
        yield stage
        _check_out(out, force)  # another process may have written there meanwhile
        if out.is_dir():
            os.chmod(stage, out.stat().st_mode & 0o7777)
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.codl-old-", dir=out.parent))
            os.replace(out, aside / "old")
            try:
                os.replace(stage, out)
            except OSError:
                os.replace(aside / "old", out)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        for d in created:  # innermost first; only what this compile made and left empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


# ---------------------------------------------------------------------------------------------
# Compiling (needs TVM's compiler).


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
        Planner mode (``codl_tvm.planner.MODES``) when ``plan`` is not given.
    cost_model
        Cost-model file for the planner; default: the shipped model for ``preset``.
    plan
        A :class:`~codl_tvm.plan.PartitionPlan` to use instead of planning.
    preset
        Target preset (``codl_tvm.targets``); default ``opencl`` (this machine's OpenCL device
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
        With ``verify``: more planner modes (``codl_tvm.planner.MODES``, e.g. ``codl_no_chain``,
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
        (:func:`refined_plan`'s rule, :func:`codl_tvm.planner.refine.refine_plan`) and build
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

    Returns
    -------
    Path
        ``out_dir``.
    """
    from codl_tvm.planner.policy import cost_model_cpu_alone

    if device not in DEVICES:
        raise ArtifactError(f"device {device!r} is not one of {DEVICES}")
    if weight_gbps is not None:
        from codl_tvm.planner import PlannerConfig, PlannerError

        try:  # the planner's own check, before anything is built
            weight_gbps = PlannerConfig(weight_gbps=weight_gbps).weight_gbps
        except PlannerError as exc:
            raise ArtifactError(str(exc).removeprefix("planner: ")) from None
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
        from codl_tvm.planner import MODES

        bad = [m for m in verify_modes if m not in MODES]
        if bad:
            raise ArtifactError(
                f"--verify-modes: {', '.join(map(repr, bad))} not among the planner modes "
                f"{', '.join(MODES)}"
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
        from codl_tvm.schedules import packed_enabled, winograd_enabled

        with (
            winograd_enabled("all") if winograd else contextlib.nullcontext(),
            packed_enabled("all") if packed else contextlib.nullcontext(),
        ):
            _compile_into(
                winograd,
                packed,
                model_path,
                stage,
                device,
                mode,
                cost_model,
                plan,
                preset,
                reference,
                seed,
                verify,
                verify_modes,
                remote,
                None if build_cache is None else Path(build_cache),
                log,
                coexec_cpu_alone,
                verify_calibrate,
                split_channel_blocks,
                (refine, refine_traces),
                weight_gbps,
                split_row_blocks,
            )
    log(f"wrote {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return out


def _compile_into(
    winograd,
    packed,
    model_path,
    out,
    device,
    mode,
    cost_model,
    plan,
    preset,
    reference,
    seed,
    verify,
    verify_modes,
    remote,
    build_cache,
    log,
    coexec_cpu_alone=False,
    verify_calibrate=True,
    split_channel_blocks=True,
    refine=(0, 5),
    weight_gbps=None,
    split_row_blocks=False,
):
    import tvm

    from codl_tvm.frontend import load_onnx, random_inputs
    from codl_tvm.planner.policy import (
        coexec_cpu_algorithms,
        cost_model_cpu_alone,
        cpu_alone_algorithms,
        cpu_alone_packed,
        cpu_alone_winograd,
        planner_config,
        switch_on,
    )
    from codl_tvm.targets import get_preset

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
    libraries = _Libraries(work, build_cache, model, manifest, preset_obj, log)
    built = None  # the exported library
    switches = contextlib.ExitStack()  # algorithms switched on for co-executed CPU parts
    try:
        if device == "coexec":
            if preset_obj.gpu is None:
                raise ArtifactError(f"preset {preset_obj.name!r} has no GPU; use --device cpu")
            if coexec_cpu_alone:
                # the CPU-alone kernels everywhere on the CPU, whatever the cost model knows
                algos = cpu_alone_algorithms(preset_obj, winograd is not False, packed is not False)
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
                planner_config(preset_obj), weight_gbps=weight_gbps
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
            from codl_tvm import runtime
            from codl_tvm.coexec import placement_report
            from codl_tvm.pipeline import coexec_pipeline

            runtime.load()

            def build_coexec(p):
                log(f"building {model_path.name} for co-execution (preset {preset_obj.name})")
                sink = libraries.new_kernel_splits()
                return tvm.compile(
                    model.mod,
                    target=gpu_target,
                    relax_pipeline=coexec_pipeline(
                        p,
                        gpu_target,
                        cpu_target,
                        channel_blocks=split_channel_blocks,
                        row_blocks=split_row_blocks,
                        kernel_splits=sink,
                    ),
                )

            built = libraries.get("coexec", "coexec", plan, lambda: build_coexec(plan))
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
                        candidates[name] = libraries.get(
                            name, "coexec", cand, lambda c=cand: build_coexec(c)
                        )
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
                    libs = {
                        name: libraries.get(name, "coexec", c, lambda c=c: build_coexec(c))
                        for name, (c, _) in found.items()
                    }
                    if refine[0]:
                        source = min((k for k in ms if k.startswith("coexec")), key=ms.get)
                        libs.update(
                            _refined_candidates(
                                model,
                                source,
                                plans[source][0] if source in plans else plan,
                                candidates[source],
                                libraries,
                                build_coexec,
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

                built = _verify(
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
        shutil.move(str(built), out / LIBRARY)
        if manifest["device"] == "cpu" and manifest["winograd_cpu_alone"]:
            manifest["winograd"] = True  # the library is a build for the CPU alone
        if manifest["device"] == "cpu" and manifest["packed_cpu_alone"]:
            manifest["packed"] = True
        if reference:
            from codl_tvm.runner import build

            log("computing the reference outputs (unpartitioned model, host CPU)")
            values = random_inputs(model, seed)
            ordered = [values[s.name] for s in model.inputs]
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
    manifest["files"] = {p.name: _sha256(p) for p in sorted(out.iterdir()) if p.name in _OWN_FILES}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def refine_artifact(
    artifact_dir: str | Path,
    out_dir: str | Path,
    *,
    traces: int = 5,
    model_path: str | Path | None = None,
    step: float = 1.0,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Time a co-executed artifact's splits inside the model and rebuild it balanced.

    :func:`refined_plan` (timelines on this machine, each split moved to the share that
    balances it), then :func:`compile_refined` (the refined plan built with the artifact's
    settings into ``out_dir``). ``manifest["plan"]["refined"]`` records the measurements and
    the changes.

    Parameters
    ----------
    artifact_dir
        A co-executed artifact built by this codl-tvm (its manifest holds the kernel record).
    out_dir
        The new artifact's directory (``artifact_dir`` itself is never overwritten).
    traces
        Timelines to take; each split's time is the median over them.
    model_path
        The ONNX model, when the path in the artifact's manifest is gone (its SHA-256 must
        match the manifest's).
    step
        Fraction of the way to the balanced shares.
    force
        Replace an earlier artifact in ``out_dir``.
    """
    if Path(out_dir).resolve() == Path(artifact_dir).resolve():
        raise ArtifactError(f"{out_dir}: the refined artifact needs a directory of its own")
    plan, record = refined_plan(artifact_dir, traces=traces, step=step, log=log)
    return compile_refined(
        artifact_dir, plan, record, out_dir, model_path=model_path, force=force, log=log
    )


def refined_plan(
    artifact_dir: str | Path,
    *,
    traces: int = 5,
    step: float = 1.0,
    log: Callable[[str], None] = print,
) -> tuple[Any, dict]:
    """Run a co-executed artifact on this machine, take ``traces`` timelines
    (:func:`codl_tvm.trace.trace_inference`), measure each split's time on each processor
    (:func:`codl_tvm.planner.refine.split_times`) and move every split's ratio, and the plan's
    ``block_ratio``, to the share that balances it (:func:`codl_tvm.planner.refine.
    refine_plan`).

    Returns
    -------
    (PartitionPlan, dict)
        The refined plan, and the record :func:`compile_refined` stores: the source artifact,
        its plan, the timelines' spans and each split's measurements and change.
    """
    from codl_tvm.frontend import random_inputs
    from codl_tvm.plan import PartitionPlan
    from codl_tvm.planner.refine import RefineError

    src = Path(artifact_dir)
    if not isinstance(traces, int) or traces < 1:
        raise ArtifactError(f"traces must be a number >= 1, got {traces!r}")
    art = load_artifact(src)
    if art.device != "coexec":
        raise ArtifactError(
            f"{src}: the artifact runs on the {art.device} alone; there are no splits to refine"
        )
    splits = art.kernel_splits
    if not splits:
        raise ArtifactError(
            f"{src}: the manifest has no kernel record (built by an older codl-tvm); "
            "compile it again to refine it"
        )
    ref = art.reference()
    values = ref[0] if ref is not None else random_inputs(art.model, 0)
    inputs = [values[s.name] for s in art.model.inputs]
    log(f"tracing {src} ({traces} inferences)")
    plan = PartitionPlan.load(src / "plan.json")
    try:
        refined, record = _refine_from_timelines(art, splits, inputs, plan, traces, step)
    except RefineError as exc:
        raise ArtifactError(f"{src}: {exc}") from None
    rows = record["splits"]
    for row in rows:
        if "new_ratio" in row:
            measured = (
                f" (CPU {row['cpu_ms']:.3f} ms, GPU {row['gpu_ms']:.3f} ms)"
                if row.get("cpu_ms") is not None
                else ""
            )
            log(
                f"  {row['split']}: GPU share {row['built_share']:.2f} -> "
                f"{row['new_ratio']:.2f}{measured}"
            )
    return refined, {"from": str(src), **record}


def _refine_from_timelines(traced, splits: dict, inputs, plan, traces: int, step: float = 1.0):
    """Take ``traces`` timelines of ``traced`` (anything with a ``vm``; its kernel record is
    ``splits``) and refine ``plan`` from them; returns ``(refined plan, record)`` (the record
    without its ``"from"``). Raises :class:`~codl_tvm.planner.refine.RefineError`."""
    from codl_tvm.planner.refine import refine_plan, split_times
    from codl_tvm.trace import trace_inference

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


def compile_refined(
    artifact_dir: str | Path,
    plan,
    record: dict,
    out_dir: str | Path,
    *,
    model_path: str | Path | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Build ``plan`` (from :func:`refined_plan`) with the settings of the artifact it refines
    (preset, CPU kernels, channel blocks, reference seed) into ``out_dir``; ``record`` goes to
    ``manifest["plan"]["refined"]``. ``model_path``: the ONNX model, when the artifact's path
    to it is gone (its SHA-256 must match)."""
    src = Path(artifact_dir)
    m = load_artifact(src, verify=False, check_cpu=False).manifest
    model = Path(model_path) if model_path is not None else Path(m["model"]["file"])
    if not model.is_file():
        raise ArtifactError(f"{model}: the artifact's model file is gone; give its path (--model)")
    if _sha256(model) != m["model"]["sha256"]:
        raise ArtifactError(f"{model}: not the model {src} was built from (SHA-256 differs)")
    reference = m.get("reference")
    out = compile_artifact(
        model,
        out_dir,
        device="coexec",
        plan=plan,
        preset=m.get("preset"),
        reference=reference is not None,
        seed=(reference or {}).get("seed", 0),
        force=force,
        winograd=True if m.get("winograd") else None,
        packed=True if m.get("packed") else None,
        log=log,
        coexec_cpu_alone=bool(m.get("coexec_cpu_alone_kernels", False)),
        split_channel_blocks=bool(m.get("split_channel_blocks", True)),
        # artifacts from before row blocks existed were built without them
        split_row_blocks=bool(m.get("split_row_blocks", False)),
    )
    manifest_path = out / MANIFEST
    new = json.loads(manifest_path.read_text())
    new["plan"]["source"] = "refined"
    new["plan"]["refined"] = record
    text = json.dumps(new, indent=2) + "\n"
    _replace_file(manifest_path, lambda tmp: tmp.write_text(text))
    return out


def _verify(model, candidates, libraries, rounds: int, seed, manifest, remote, log, more=None):
    """Time the co-executed builds (``candidates``: ``"coexec"`` and ``"coexec:<mode>"`` to
    their exported libraries) against each processor alone (here, or on ``remote``, a
    ``(tracker, key)`` pair); return the library of the fastest and record the measurements
    (and a fallback) in ``manifest``.

    ``more``, given the medians of that first timing, returns more candidate libraries (plans
    re-made with the cost model calibrated to the measured single-processor latencies, plans
    refined from timelines of the fastest co-executed build); if it returns any, every build is
    timed again with them and the second timing decides."""
    from codl_tvm.frontend import random_inputs

    libs = dict(candidates)
    for device in ("cpu", "opencl"):
        libs[device] = libraries.single(device)
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]

    def measure():
        if remote is None:
            samples, where = _time_here(libs, inputs, rounds), "this machine"
        else:
            samples, where = _time_remote(libs, inputs, rounds, *remote)
        return samples, where, {name: float(np.median(v)) for name, v in samples.items()}

    samples, where, ms = measure()
    first = None
    extra = more(ms) if more is not None else {}
    if extra:
        first = {"median_ms": ms, "samples_ms": samples}
        log(
            "verify: first timing "
            + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
            + f"; timing again with {', '.join(extra)}"
        )
        libs.update(extra)
        samples, where, ms = measure()
    chosen = min(ms, key=ms.get)
    manifest["verify"] = {
        "rounds": rounds,
        "on": where,
        "median_ms": ms,
        "samples_ms": samples,
        "chosen": chosen,
    }
    if first is not None:
        manifest["verify"]["first_timing"] = first
    log(
        f"verify on {where}: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items())
        + f" (median of {rounds} rounds): keeping {chosen}"
    )
    if chosen in ("cpu", "opencl"):
        best_coexec = min(v for k, v in ms.items() if k.startswith("coexec"))
        manifest["device"] = chosen
        manifest["vm_devices"] = [chosen]
        manifest["plan"]["fallback"] = (
            f"measured {best_coexec:.3f} ms co-executed vs {ms[chosen]:.3f} ms on the "
            f"{'CPU' if chosen == 'cpu' else 'GPU'} alone (--verify)"
        )
        target = libraries.preset.target("cpu" if chosen == "cpu" else "gpu")
        manifest["targets"] = {chosen: str(target)}
    return libs[chosen]


class _Libraries:
    """The exported libraries of one compile, in its work directory, reused from and stored in
    a build cache where one is given (keyed by everything the library depends on)."""

    def __init__(self, work: Path, cache: Path | None, model, manifest, preset_obj, log) -> None:
        self.work, self.cache, self.preset, self.log = work, cache, preset_obj, log
        self.model = model
        self._model = manifest["model"]["sha256"]
        self._winograd = manifest["winograd"]
        self._cpu_alone_winograd = manifest["winograd_cpu_alone"]
        self._packed = manifest["packed"]
        self._cpu_alone_packed = manifest["packed_cpu_alone"]
        self.coexec_cpu_algorithms: tuple[str, ...] = ()
        self.coexec_cpu_alone = False
        self.channel_blocks = True
        self.row_blocks = False
        # library name -> its kernel calls and their splits (co-executed builds)
        self.kernel_splits: dict[str, dict] = {}
        self._pending_splits: dict | None = None
        if cache is not None:
            cache.mkdir(parents=True, exist_ok=True)

    def key(self, device: str, plan) -> str:
        import tvm

        parts = [
            _code_digest(),
            tvm.__version__,
            self._model,
            self.preset.name,
            str(self.preset.target("cpu")),
            str(self.preset.target("gpu")) if self.preset.gpu is not None else None,
            device,
            None if plan is None else plan.to_json(),
            self._winograd,
            device == "cpu" and plan is None and self._cpu_alone_winograd,
            self._packed,
            device == "cpu" and plan is None and self._cpu_alone_packed,
            list(self.coexec_cpu_algorithms) if device == "coexec" else None,
            device == "coexec" and self.coexec_cpu_alone,
            device == "coexec" and self.channel_blocks,
            device == "coexec" and self.row_blocks,
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def new_kernel_splits(self) -> dict:
        """A dictionary for the build being made to fill (see ``coexec_pipeline``)."""
        self._pending_splits = {}
        return self._pending_splits

    def get(self, name: str, device: str, plan, build: Callable[[], Any]) -> Path:
        """The library of ``name`` (``device`` with ``plan``), from the cache or ``build()``.

        The kernel splits a co-executed build records are kept beside it (in the cache too,
        ``<key>.splits.json``) and in :attr:`kernel_splits` under ``name``."""
        from codl_tvm.targets import export_library

        path = self.work / f"{name.replace(':', '_')}.so"
        cached = None if self.cache is None else self.cache / f"{self.key(device, plan)}.so"
        sidecar = None if cached is None else cached.with_suffix(".splits.json")
        if cached is not None and cached.is_file():
            self.log(f"reusing the {name} library from the build cache ({cached.name})")
            shutil.copyfile(cached, path)
            if sidecar.is_file():
                self.kernel_splits[name] = json.loads(sidecar.read_text())
            return path
        self._pending_splits = None
        export_library(build(), path, self.preset)
        if self._pending_splits:
            self.kernel_splits[name] = self._pending_splits
        if cached is not None:
            _replace_file(cached, lambda tmp: shutil.copyfile(path, tmp))
            if name in self.kernel_splits:
                text = json.dumps(self.kernel_splits[name])
                _replace_file(sidecar, lambda tmp: tmp.write_text(text))
        return path

    def single(self, device: str) -> Path:
        """The model built for one processor (``cpu`` or ``opencl``)."""
        import tvm

        from codl_tvm.pipeline import single_device_pipeline

        target = self.preset.target("cpu" if device == "cpu" else "gpu")

        def build():
            from codl_tvm.schedules import cpu_alone_settings, packed_enabled, winograd_enabled
            from codl_tvm.schedules.config import (
                PACKED_CPU_ALONE,
                WINOGRAD_CPU_ALONE,
                packed_presets,
                winograd_presets,
            )

            presets = set(winograd_presets())
            packed = set(packed_presets())
            if device == "cpu" and self._cpu_alone_winograd:
                presets |= set(WINOGRAD_CPU_ALONE)
            if device == "cpu" and self._cpu_alone_packed:
                packed |= set(PACKED_CPU_ALONE)
            self.log(f"building for the {_PROCESSOR[device]} alone (preset {self.preset.name})")
            alone = device == "cpu" and self._cpu_alone_packed
            with winograd_enabled(presets), packed_enabled(packed), cpu_alone_settings(alone):
                return tvm.compile(
                    self.model.mod, target=target, relax_pipeline=single_device_pipeline(target)
                )

        return self.get(device, device, None, build)


def _replace_file(dst: Path, fill: Callable[[Path], Any]) -> None:
    """Write ``dst`` through a temporary file then rename: parallel compiles sharing a build
    cache never see half a file."""
    tmp = dst.with_suffix(f".{os.getpid()}.tmp")
    fill(tmp)
    os.replace(tmp, dst)


_CODE_DIGEST: str | None = None


def _code_digest() -> str:
    """A digest of codl-tvm's Python sources: a library built by other code is never reused."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        root = Path(__file__).resolve().parent
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def _time_here(libs: dict[str, Path], inputs, rounds: int) -> dict[str, list[float]]:
    """Median of 2 runs per round, the builds round-robin, so drift does not favour one."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm import runtime
    from codl_tvm.runner import time_vm

    runtime.load()
    vms = {}
    for name, path in libs.items():
        devices = {"coexec": [tvm.opencl(0), tvm.cpu(0)], "cpu": [tvm.cpu(0)]}.get(
            name.split(":", 1)[0], [tvm.opencl(0)]
        )
        vms[name] = (VirtualMachine(tvm.runtime.load_module(str(path)), devices), devices[0])
    samples: dict[str, list[float]] = {name: [] for name in vms}
    for _ in range(rounds):
        for name, (vm, dev) in vms.items():
            samples[name].append(time_vm(vm, dev, inputs, number=2, repeat=1).median_ms)
    return samples


def _time_remote(libs: dict[str, Path], inputs, rounds: int, tracker: str, key: str):
    """Each build uploaded to one device of ``key`` and timed there (``rounds`` repeats of 2
    runs; the builds one after the other in one session)."""
    from codl_tvm.deploy import run_remote
    from codl_tvm.rpc_utils import RPCError, check_remote_versions, request_remote

    try:
        remote = request_remote(tracker, key)
    except RPCError as exc:
        raise ArtifactError(f"--verify: {exc}") from None
    try:
        info = check_remote_versions(remote)
        if (info or {}).get("opencl") != "1":
            raise ArtifactError(
                f"--verify: remote device {remote.name} has no usable OpenCL runtime (start its "
                "server with `python -m codl_tvm.rpc_utils serve --opencl`)"
            )
        samples = {}
        for name, path in libs.items():
            device = name.split(":", 1)[0]
            run = run_remote(remote, path, inputs, device, number=2, repeat=rounds)
            samples[name] = [run.median_ms]
        return samples, f"{remote.name} (RPC {tracker}, key {key})"
    except RPCError as exc:
        raise ArtifactError(f"--verify: {exc}") from None
    finally:
        remote.close()


def _packed_on() -> bool:
    from codl_tvm.schedules.config import packed_presets

    return bool(packed_presets())


def _winograd_on() -> bool:
    from codl_tvm.schedules.config import winograd_presets

    return bool(winograd_presets())


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _spec(s) -> dict:
    return {"name": s.name, "shape": list(s.shape), "dtype": s.dtype}


def _make_plan(model, out: Path, mode, cost_model, plan, preset_name, manifest, log, config=None):
    """The plan of a co-executed compile (:func:`~codl_tvm.planner.policy.resolve_plan`, the
    plan resolution ``run --plan auto`` uses too), recorded in ``manifest["plan"]`` and
    written to ``out``."""
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
            "mode": mode,
            "cost_model": {
                "file": str(path),
                "sha256": _sha256(path),
                "kind": choice.cost_model_kind,
            },
            "planning_s": round(choice.planning_s or 0.0, 4),
            "summary": report.summary.to_dict() if report.summary else None,
        }
        if config is not None and config.weight_gbps is not None:
            manifest["plan"]["weight_gbps"] = list(config.weight_gbps)
        log(report.table())
    _write_plan(out, choice.plan, choice.report)
    return choice


def _candidate_plans(model, plan, mode, modes, manifest, log, config=None) -> dict[str, tuple]:
    """The plans of ``modes`` that differ from ``plan`` and from each other and co-execute
    (single-processor plans are the CPU and GPU builds already timed): ``{"coexec:<mode>":
    (plan, report)}``, made with the cost model ``plan`` was made with."""
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.planner import plan_model
    from codl_tvm.planner.policy import single_processor

    cm = load_model(manifest["plan"]["cost_model"]["file"])
    seen = {plan.to_json()}
    found = {}
    for m in modes:
        if m == mode:
            continue
        cand, report = plan_model(
            model.mod, cm, mode=m, config=config, model_name=Path(model.path).name
        )
        text = cand.to_json()
        alone = not cand.entries() or single_processor(cand, None, m) is not None
        if text in seen or alone:
            log(f"verify: the {m} plan adds no candidate (same plan, or one processor alone)")
            continue
        seen.add(text)
        found[f"coexec:{m}"] = (cand, report)
    manifest["plan"]["verify_candidates"] = [mode, *(k.split(":", 1)[1] for k in found)]
    return found


#: Re-plan with calibrated predictions only when the two processors' measured/predicted
#: ratios differ by more than this factor: equal factors keep the processors' balance (only
#: the weight of the sharing costs would change), not worth another build and timing.
CALIBRATION_MIN_SHIFT = 1.1


def _calibrated_plans(model, mode, report, ms, seen: set, manifest, log, config) -> dict:
    """The plan of ``mode`` re-made with each processor's predictions scaled by ``measured /
    predicted`` of the model on it alone (``ms["cpu"]``, ``ms["opencl"]`` against ``report``'s
    summary): ``{"coexec:<mode>:calibrated": (plan, report)}`` if it co-executes and differs
    from every plan in ``seen`` (which grows), else ``{}``. One plan, not one per verify mode:
    each costs a build and its first OpenCL compile. The factors are recorded in
    ``manifest["plan"]["calibration"]``."""
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.planner import PlannerConfig, plan_model
    from codl_tvm.planner.policy import single_processor

    s = report.summary
    if s is None or not (s.cpu_only_ms > 0 and s.gpu_only_ms > 0):
        return {}
    cpu_scale, gpu_scale = ms["cpu"] / s.cpu_only_ms, ms["opencl"] / s.gpu_only_ms
    record = {"cpu_scale": cpu_scale, "gpu_scale": gpu_scale, "candidates": []}
    manifest["plan"]["calibration"] = record
    shift = max(cpu_scale / gpu_scale, gpu_scale / cpu_scale)
    if shift < CALIBRATION_MIN_SHIFT:
        log(
            f"verify: measured/predicted CPU x{cpu_scale:.2f}, GPU x{gpu_scale:.2f}: within "
            f"{CALIBRATION_MIN_SHIFT}x of each other, no calibrated re-plan"
        )
        return {}
    config = dataclasses.replace(config or PlannerConfig(), processor_scale=(cpu_scale, gpu_scale))
    cm = load_model(manifest["plan"]["cost_model"]["file"])
    found = {}
    name = Path(model.path).name
    cand, rep = plan_model(model.mod, cm, mode=mode, config=config, model_name=name)
    text = cand.to_json()
    if text not in seen and cand.entries() and single_processor(cand, None, mode) is None:
        seen.add(text)
        found[f"coexec:{mode}:calibrated"] = (cand, rep)
        record["candidates"].append(mode)
    log(
        f"verify: measured/predicted CPU x{cpu_scale:.2f}, GPU x{gpu_scale:.2f}; calibrated "
        f"re-plans add {len(found)} candidate(s)"
        + (f" ({', '.join(record['candidates'])})" if found else "")
    )
    return found


def _refined_candidates(
    model, source, plan, library, libraries, build, refine, seed, seen, refined, log, mode
) -> dict:
    """``refine = (rounds, traces)`` rounds of refinement for ``--verify``: timelines of the
    co-executed build ``source`` (its ``library``, built with ``plan``), each split balanced
    from them (:func:`codl_tvm.planner.refine.refine_plan`), the result built as
    ``coexec:refined`` (then ``coexec:refined2`` from that, ...). Returns ``{name: library}``
    and records ``refined[name] = (plan, record)``; stops early when a round changes nothing
    or cannot be refined. ``mode``: the planner mode the refined plans descend from."""
    from types import SimpleNamespace

    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm.frontend import random_inputs
    from codl_tvm.planner.refine import RefineError, moves

    rounds, traces = refine
    values = random_inputs(model, seed)
    inputs = [values[s.name] for s in model.inputs]
    found = {}
    for r in range(1, rounds + 1):
        splits = libraries.kernel_splits.get(source)
        if not splits:
            log(f"verify: {source} has no kernel record; nothing to refine")
            break
        vm = VirtualMachine(tvm.runtime.load_module(str(library)), [tvm.opencl(0), tvm.cpu(0)])
        try:
            new, record = _refine_from_timelines(
                SimpleNamespace(vm=vm), splits, inputs, plan, traces
            )
        except RefineError as exc:
            log(f"verify: {source} cannot be refined: {exc}")
            break
        text = new.to_json()
        if text in seen:
            log(f"verify: refining {source} gives no new plan; no more rounds")
            break
        seen.add(text)
        name = "coexec:refined" if r == 1 else f"coexec:refined{r}"
        log(
            f"verify: {name} from {traces} timelines of {source}: "
            + ", ".join(moves(record["splits"]))
        )
        library = libraries.get(name, "coexec", new, lambda p=new: build(p))
        refined[name] = (new, {"from": source, "mode": mode, **record})
        found[name] = library
        source, plan = name, new
    return found


def _adopt_plan(out: Path, model, plan, report, mode: str, manifest) -> None:
    """Make the plan that ``--verify`` measured fastest the artifact's plan (its files and
    manifest entry); the primary plan's prediction stays on record."""
    from codl_tvm.coexec import placement_report

    record = manifest["plan"]
    record["planned_mode"] = record.get("mode")
    record["mode"] = mode
    record["summary"] = report.summary.to_dict() if report is not None and report.summary else None
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


def _write_plan(out: Path, plan, report) -> None:
    """The artifact's plan files: ``plan.json``, and the planner's report when there is one."""
    (out / "plan.json").write_text(plan.to_json() + "\n")
    if report is not None:
        report.save(out / "plan_report.json")
        (out / "plan_report.txt").write_text(report.table() + "\n")


# ---------------------------------------------------------------------------------------------
# Running (runtime-only TVM is enough).


@dataclass
class Artifact:
    """A loaded artifact: ``artifact(inputs)`` runs it, ``time`` measures it.

    Attributes
    ----------
    path
        The artifact directory.
    manifest
        Its parsed ``manifest.json``.
    """

    path: Path
    manifest: dict
    _vm: Any = None
    _devices: Any = None

    @property
    def device(self) -> str:
        return self.manifest["device"]

    @property
    def model(self) -> SimpleNamespace:
        """Input/output specs in the shape :mod:`codl_tvm.frontend`'s helpers expect."""
        from codl_tvm.frontend import TensorSpec

        m = self.manifest["model"]

        def specs(items):
            return [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in items]

        return SimpleNamespace(
            path=m["file"], inputs=specs(m["inputs"]), outputs=specs(m["outputs"])
        )

    def _load(self):
        if self._vm is not None:
            return
        import tvm
        from tvm.runtime.vm import VirtualMachine

        names = self.manifest["vm_devices"]
        if "opencl" in names:
            from codl_tvm import runtime

            runtime.load()
        self._devices = [tvm.opencl(0) if n == "opencl" else tvm.cpu(0) for n in names]
        lib = tvm.runtime.load_module(str(self.path / LIBRARY))
        self._vm = VirtualMachine(lib, self._devices)

    @property
    def kernel_splits(self) -> dict | None:
        """A co-executed build's kernel calls in execution order, each with the split it
        computes (:func:`codl_tvm.passes.kernel_splits.kernel_splits`); None for other builds."""
        return self.manifest.get("kernel_splits")

    @property
    def vm(self):
        """The Relax VM over the manifest's devices (created on first use)."""
        self._load()
        return self._vm

    def reference(self) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
        """``(inputs, outputs)`` stored at compile time, or None."""
        ref = self.path / REFERENCE
        if not ref.is_file():
            return None
        with np.load(ref, allow_pickle=False) as data:
            inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
            outs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
        return inputs, [outs[s.name] for s in self.model.outputs]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run once on inputs in ``main``'s order; return numpy outputs."""
        import tvm

        from codl_tvm.runner import _flatten

        self._load()
        args = [tvm.runtime.tensor(np.asarray(x, order="C"), self._devices[0]) for x in inputs]
        return _flatten(self._vm["main"](*args))

    def runner(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        """A function that runs one inference on ``inputs`` (placed on the device once, here)
        and returns when every device has finished: for timing loops of one's own."""
        import tvm

        self._load()
        args = [tvm.runtime.tensor(np.asarray(x, order="C"), self._devices[0]) for x in inputs]
        main = self._vm["main"]
        devices = list({str(d): d for d in self._devices}.values())

        def run() -> None:
            main(*args)
            for dev in devices:
                dev.sync()

        return run

    def time(self, inputs: Sequence[np.ndarray], number: int = 5, repeat: int = 3):
        """Latency (``time_evaluator`` on the first VM device's timer; warm-up run first)."""
        from codl_tvm.runner import time_vm

        self._load()
        return time_vm(self._vm, self._devices[0], inputs, number, repeat)


def load_artifact(path: str | Path, verify: bool = True, check_cpu: bool = True) -> Artifact:
    """Read an artifact directory.

    Parameters
    ----------
    path
        The artifact directory.
    verify
        Check every file against its SHA-256 in the manifest.
    check_cpu
        Check that this machine's CPU has every instruction-set feature the library's CPU code
        was compiled for (``manifest["cpu"]``): a library for another CPU would die of an
        illegal instruction. Off to read an artifact's files without running it.

    Raises
    ------
    ArtifactError
        Not an artifact, another format version, a file altered, or a CPU that cannot run it.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{path}: no {MANIFEST}; not a codl-tvm artifact directory")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{manifest_path}: unreadable ({exc})") from None
    if not isinstance(manifest, Mapping) or manifest.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{manifest_path}: not a codl-tvm artifact manifest")
    if manifest.get("version") != ARTIFACT_VERSION:
        raise ArtifactError(
            f"{manifest_path}: artifact format version {manifest.get('version')!r}; this "
            f"codl-tvm reads version {ARTIFACT_VERSION} (recompile with `codl-tvm compile`)"
        )
    for key in ("device", "vm_devices", "model", "files"):
        if key not in manifest:
            raise ArtifactError(f"{manifest_path}: missing field {key!r}")
    if check_cpu and isinstance(manifest.get("cpu"), Mapping):
        _check_cpu(path, manifest["cpu"])
    if verify:
        for name, digest in manifest["files"].items():
            f = path / name
            if not f.is_file():
                raise ArtifactError(f"{path}: {name} is missing")
            if _sha256(f) != digest:
                raise ArtifactError(f"{path}: {name} does not match its SHA-256 in {MANIFEST}")
    return Artifact(path=path, manifest=dict(manifest))


def _check_cpu(path: Path, record: Mapping) -> None:
    """Refuse an artifact whose CPU code this machine cannot run (``manifest["cpu"]``)."""
    arch, missing = missing_cpu_features(dict(record))
    name = record.get("name", "generic")
    if arch is not None:
        raise ArtifactError(
            f"{path}: built for {record.get('arch')} CPUs ({name}); this machine is {arch}"
        )
    if missing:
        raise ArtifactError(
            f"{path}: built for CPU {name!r}, whose instructions this machine's CPU lacks "
            f"({', '.join(missing)}); compile it again here (`codl-tvm compile`) or run it on "
            "such a CPU"
        )
