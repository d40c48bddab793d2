"""The latency objective: ``compile_artifact`` plans an ONNX model, builds it and writes the
artifact directory.

One compile is four phases over one :class:`_Compile` (its options, model, libraries and the
typed :class:`~codl_tvm.runtime.artifact.Manifest` it fills): resolve the plan (the planning
policy, :func:`codl_tvm.planner.policy.resolve_plan`, shared with ``run --plan auto``), build
(:class:`~codl_tvm.build.cache.Libraries`, keyed by a :class:`~codl_tvm.build.cache.BuildSpec`;
a compile that measures builds each processor alone in worker processes while it plans),
verify (time the candidates, :mod:`codl_tvm.objectives.verify`) and finalize (weights, program
binaries, reference outputs, manifest). The directory is written through
:mod:`codl_tvm.runtime.artifact`, which swaps it in only when complete.

Compiling needs TVM's compiler, which a runtime-only TVM (a device running artifacts) lacks:
the planning policy and the schedules, which need it, are imported inside the functions that
compile, so ``codl_tvm.artifact`` still imports there to load and run artifacts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from codl_tvm import runtime
from codl_tvm.build.cache import Libraries
from codl_tvm.build.coexec import placement_report
from codl_tvm.build.runner import build
from codl_tvm.build.targets import TargetPreset, cpu_record, get_preset
from codl_tvm.core.errors import (
    ArtifactError,
    ModelFileError,
    NoDefaultModelError,
    PlanError,
    PlannerError,
)
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.frontend.importer import OnnxModel, load_onnx, random_inputs
from codl_tvm.objectives.gpu_data import kept_gpu_data, planner_channels, prepare_gpu_data
from codl_tvm.objectives.measure import cost_model_mismatch, measurement, warms_up
from codl_tvm.objectives.tune import tuned_config
from codl_tvm.objectives.verify import build_candidate, gpu_data_auto, refined_candidates
from codl_tvm.objectives.verify import verify as verify_builds
from codl_tvm.options import CompileOptions, OptionsError
from codl_tvm.planner import PlannerConfig, PlanReport
from codl_tvm.runtime import program_binaries
from codl_tvm.runtime.artifact import (
    ARTIFACT_FILES,
    LIBRARY,
    PROCESSOR_NAMES,
    REFERENCE,
    Manifest,
    ModelRecord,
    file_sha256,
    package_version,
    staged_directory,
    write_plan_files,
)
from codl_tvm.runtime.weights import WEIGHTS

__all__ = [
    "CompileOptions",
    "adopt_plan_record",
    "compile_artifact",
    "compile_model",
    "default_cost_model_for",
]

logger = logging.getLogger(__name__)

_VM_DEVICES = {"coexec": ["opencl", "cpu"], "cpu": ["cpu"], "opencl": ["opencl"]}


def default_cost_model_for(preset: str | None) -> Path:
    """The shipped cost model for a target preset (see ``codl_tvm.cost_model.defaults``)."""
    return default_model_path(preset)


def compile_artifact(
    model_path: str | Path, out_dir: str | Path, options: CompileOptions | None = None
) -> Path:
    """Plan and build an ONNX model into an artifact directory.

    Parameters
    ----------
    model_path
        The ONNX model.
    out_dir
        The artifact directory (created; must be new, empty, or an earlier artifact with
        ``options.force``).
    options
        How to plan and build (:class:`~codl_tvm.options.CompileOptions`, checked when made);
        default: its defaults. Progress goes to this module's logger at INFO.

    Returns
    -------
    Path
        ``out_dir``.

    Raises
    ------
    ArtifactError
        The model, the plan or the build failed, or the output directory may not be replaced;
        :class:`~codl_tvm.options.OptionsError` (a subclass) for options this compile cannot
        use (e.g. ``verify`` on this machine with a cross-compiling preset).
    """
    options = options or CompileOptions()
    model_path, out = Path(model_path), Path(out_dir)
    if not model_path.is_file():
        raise ArtifactError(f"{model_path}: no such model file")
    start = time.perf_counter()
    with staged_directory(out, options.force) as stage, _algorithms_for_every_preset(options):
        job = _Compile.start(model_path, stage, options)
        try:
            built = job.build() if job.device != "coexec" else job.build_coexec()
            job.finalize(built)
        finally:
            job.close()
        job.write_manifest()
    logger.info(
        "wrote %s/ (%s) in %.1f s",
        out,
        ", ".join(sorted(p.name for p in out.iterdir())),
        time.perf_counter() - start,
    )
    return out


#: The name :mod:`codl_tvm.options` gave the same call before the options object was its
#: argument.
compile_model = compile_artifact


def _algorithms_for_every_preset(options: CompileOptions) -> contextlib.ExitStack:
    """``winograd=True`` / ``packed=True``: those convs switched on for every preset."""
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.schedules import packed_enabled, winograd_enabled

    stack = contextlib.ExitStack()
    if options.winograd:
        stack.enter_context(winograd_enabled("all"))
    if options.packed:
        stack.enter_context(packed_enabled("all"))
    return stack


@dataclass
class _Compile:
    """One compile's state, shared by its phases.

    ``out`` is the staging directory; ``device`` what is built (``coexec`` until a fallback);
    ``plan``/``report`` the co-executed plan and the planner's report; ``work`` the directory of
    the libraries being built; ``switches`` the algorithms switched on for co-executed CPU
    parts while the compile runs.
    """

    options: CompileOptions
    model: OnnxModel
    out: Path
    preset: TargetPreset
    manifest: Manifest
    libraries: Libraries
    work: Path
    device: str
    switches: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    plan: PartitionPlan | None = None
    report: PlanReport | None = None
    planner_config: PlannerConfig | None = None
    # rounds of timing: options.verify, else MEASURE_ROUNDS where measured by default
    rounds: int = 0
    # why a compile that would measure could not (None: measured, or not asked to)
    unchecked: str | None = None
    # verify's candidates: name -> library, name -> (plan, report), plans timed, refined ones
    candidates: dict[str, Path] = field(default_factory=dict)
    plans: dict[str, tuple] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    refined: dict[str, tuple] = field(default_factory=dict)
    # candidates that failed to build or run: name -> reason (manifest.verify["dropped"])
    dropped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(cls, model_path: Path, out: Path, options: CompileOptions) -> _Compile:
        """Import the model and begin its manifest (nothing built yet)."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import cpu_alone_packed, cpu_alone_winograd

        preset = get_preset(options.preset or "opencl")
        model = load_onnx(model_path)
        if options.verify and preset.is_cross and options.remote is None:
            raise OptionsError(
                f"verify times the builds on this machine, but preset {preset.name!r} "
                f"cross-compiles for {preset.triple}; give tracker and key to time them on the "
                "device through RPC",
                ("verify", "tracker", "key"),
            )
        manifest = Manifest(
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            codl_tvm_version=package_version("codl-tvm"),
            tvm_version=tvm.__version__,
            # resolved: the manifest is read from other directories (refine, run)
            model=ModelRecord(
                str(model_path.resolve()),
                file_sha256(model_path),
                list(model.inputs),
                list(model.outputs),
            ),
            device=options.device,
            vm_devices=list(_VM_DEVICES[options.device]),
            preset=preset.name,
            winograd=_switched_on()[0],
            winograd_cpu_alone=options.winograd is None and cpu_alone_winograd(preset),
            packed=_switched_on()[1],
            packed_cpu_alone=options.packed is None and cpu_alone_packed(preset),
            # the instruction set the library's CPU code needs (also the OpenCL build's host
            # code): load_artifact refuses a machine without it instead of an illegal instruction
            cpu=cpu_record(preset.target("cpu")),
        )
        work = Path(tempfile.mkdtemp(prefix="codl-artifact-"))
        libraries = Libraries(work, options.build_cache, model, manifest, preset)
        # verify times embedded builds (as every earlier compile cached them); the chosen one
        # is built again with its weights beside in finalize
        rounds, unchecked = measurement(options, preset)
        libraries.weights_placement = "embedded" if rounds else options.weights
        libraries.warm_up = warms_up(options)
        gpu = prepare_gpu_data(options, libraries)  # as asked, else the cost model's profile
        if gpu is not None:  # a build for the GPU alone: images, half (checked on the device)
            manifest.extra["gpu"], manifest.vm_devices = gpu, libraries.gpu_vm_devices()
        job = cls(options, model, out, preset, manifest, libraries, work, options.device)
        job.rounds, job.unchecked = rounds, unchecked
        return job

    def start_candidate_builds(self) -> None:
        """A co-executed compile that measures times each processor alone: start those builds
        in worker processes now (they need no plan), beside planning and the co-executed
        build (:meth:`~codl_tvm.build.cache.Libraries.start_single`)."""
        if self.rounds and self.device == "coexec" and self.preset.has_gpu:
            self.libraries.start_single(("cpu", "opencl"))

    def close(self) -> None:
        """Stop the build workers still running and remove the work directory."""
        self.libraries.close()
        self.switches.close()
        shutil.rmtree(self.work, ignore_errors=True)

    # -- phase 1: the plan ---------------------------------------------------------------------

    def _coexec_cpu_kernels(self) -> None:
        """Switch on the kernels co-executed CPU parts get, as the planner must predict them."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import (
            coexec_cpu_algorithms,
            cost_model_cpu_alone,
            cpu_alone_algorithms,
            switch_on,
        )
        from codl_tvm.schedules import cpu_alone_settings

        o, preset, manifest = self.options, self.preset, self.manifest
        cpu_alone = o.coexec_cpu_alone
        if cpu_alone is None:
            cpu_alone = o.plan is None and cost_model_cpu_alone(o.cost_model, preset.name)
        if cpu_alone:
            # the CPU-alone kernels everywhere on the CPU, whatever the cost model knows
            algos = cpu_alone_algorithms(preset, o.winograd is not False, o.packed is not False)
            self.switches.enter_context(cpu_alone_settings(True))
            manifest.coexec_cpu_alone_kernels = True
            self.libraries.coexec_cpu_alone = True
            profiled = o.plan is None and cost_model_cpu_alone(o.cost_model, preset.name)
            logger.info(
                "co-executed CPU functions use the kernels of the build for the CPU alone "
                "(CPU_ALONE_SETTINGS)%s",
                ", which the cost model was profiled with"
                if profiled
                else "; the cost model was profiled with the preset's, so the planner's CPU "
                "predictions describe those",
            )
        elif o.plan is not None:
            algos = ()
        else:
            algos = coexec_cpu_algorithms(o.cost_model, preset, o.winograd, o.packed)
        switch_on(self.switches, algos, preset)
        manifest.coexec_cpu_algorithms = list(algos)
        self.libraries.coexec_cpu_algorithms = algos
        if algos:
            logger.info(
                "co-executed CPU parts use %s kernels (the cost model has data for them)",
                " and ".join(algos),
            )
        alone = [
            name
            for name in cpu_alone_algorithms(preset, o.winograd is None, o.packed is None)
            if name not in algos
        ]
        if alone and o.plan is None:
            # The planner predicts the CPU alone with the kernels the cost model knows.
            manifest.cpu_alone_unmodelled = alone
            logger.info(
                "note: the build for the CPU alone uses %s kernels, which the cost model has no "
                "data for: the planner predicts the CPU alone (and CPU parts) with direct "
                "kernels, so it may co-execute where the CPU alone is faster; verify measures "
                "instead (or profile them: codl-tvm profile --%s)",
                " and ".join(alone),
                " --".join(alone),
            )

    def resolve_plan(self) -> None:
        """The co-executed plan (:func:`~codl_tvm.planner.policy.resolve_plan`), recorded in
        the manifest and written to ``out``; falls back to one processor where the policy says
        so (unless ``verify`` measures instead)."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import planner_config, resolve_plan

        o, manifest = self.options, self.manifest
        if self.preset.gpu is None:
            raise OptionsError(
                f"preset {self.preset.name!r} has no GPU; use device 'cpu'", ("device",)
            )
        self._coexec_cpu_kernels()
        config = dataclasses.replace(
            planner_config(self.preset),
            weight_gbps=o.weight_gbps,
            processor_scale=o.processor_scale,
            split_margin=o.split_margin,
            gpu_channels=planner_channels(self.libraries),
        )
        self.planner_config = tuned_config(self.model.mod, config, o, self.preset, manifest)
        self.start_candidate_builds()  # after tuning, whose timings they would disturb
        try:
            choice = resolve_plan(
                self.model.mod,
                plan=o.plan,
                mode=o.mode,
                cost_model=o.cost_model,
                preset=self.preset.name,
                config=self.planner_config,
                model_name=Path(self.model.path).name,
            )
        except PlanError as exc:
            raise ArtifactError(f"plan: {exc}") from None
        except (PlannerError, ModelFileError, NoDefaultModelError) as exc:
            raise ArtifactError(str(exc)) from None
        self.plan, self.report = choice.plan, choice.report
        manifest.plan = (
            {"source": "given"}
            if choice.source != "planner"
            else _planner_record(choice, self.planner_config)
        )
        if choice.source == "planner":
            self._check_cost_model_device(Path(choice.cost_model))
        if self.report is not None:
            logger.info("%s", self.report.table())
        write_plan_files(self.out, choice.plan, choice.report)
        if choice.device == "coexec":
            return
        if self.unchecked is not None:
            manifest.plan["unchecked"] = self.unchecked
        if self.rounds:
            # The measurement decides (the prediction may pick the wrong processor too).
            manifest.plan["predicted_fallback"] = choice.reason
            return
        self.device = manifest.device = choice.device
        manifest.vm_devices = [choice.device]
        manifest.plan["fallback"] = choice.reason
        logger.info(
            "not co-executing: %s; building for the %s alone",
            choice.reason,
            PROCESSOR_NAMES[choice.device],
        )

    def _check_cost_model_device(self, path: Path) -> None:
        """Say so when the cost model describes another device than this compile's
        (``manifest.plan["cost_model"]["device_mismatch"]``)."""
        why = cost_model_mismatch(path, self.preset, self.options, bool(self.rounds))
        if why is not None:
            self.manifest.plan["cost_model"]["device_mismatch"] = why

    # -- phase 2: the build --------------------------------------------------------------------

    def build_coexec(self) -> Path:
        """Plan, then build the plan co-executed (and, with ``verify``, every candidate, keeping
        the fastest); a fallback to one processor builds that instead."""
        self.resolve_plan()
        if self.device != "coexec":
            return self.build()
        o, manifest, libraries = self.options, self.manifest, self.libraries
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import single_processor

        # without a report, single_processor names only plans that split nothing
        if self.rounds and not o.verify and single_processor(self.plan, None, o.mode):
            # the co-executed build of such a plan is one processor's work with extra
            # synchronisation: only the two processors alone are worth timing
            return verify_builds(self.model, {}, libraries, self.rounds, o.seed, manifest, o.remote)
        manifest.split_channel_blocks = bool(o.split_channel_blocks)
        manifest.split_row_blocks = bool(o.split_row_blocks)
        libraries.channel_blocks = bool(o.split_channel_blocks)
        libraries.row_blocks = bool(o.split_row_blocks)
        libraries.issue_ahead = bool(o.issue_ahead)
        runtime.load()
        if self.rounds:
            # measured: a co-executed build that fails is dropped, the processors alone decide
            libraries.start_image_variant(self.plan)  # auto: its image build in a worker
            built = build_candidate(
                "coexec", lambda: libraries.coexec("coexec", self.plan), self.dropped, libraries
            )
        else:
            built = libraries.coexec("coexec", self.plan)
        manifest.kernel_splits = libraries.kernel_splits.get("coexec")
        self._write_placement(self.plan)
        manifest.targets = {p: str(self.preset.target(p)) for p in ("gpu", "cpu")}
        return self.verify(built) if self.rounds else built

    def build(self) -> Path:
        """The model built for the one processor of :attr:`device` (``auto`` GPU data: measured)."""
        target = self.preset.target("cpu" if self.device == "cpu" else "gpu")
        if target is None:
            raise OptionsError(
                f"preset {self.preset.name!r} has no GPU; use device 'cpu'", ("device",)
            )
        self.manifest.targets = {self.device: str(target)}
        if self.device == "opencl" and self.options.gpu_data_type == "auto":
            return gpu_data_auto(self.model, self.libraries, self.options, self.manifest)
        return self.libraries.single(self.device)

    def _write_placement(self, plan: PartitionPlan) -> None:
        """``placement.json``: where each part of ``plan`` runs, as this build splits blocks."""
        o = self.options
        placement = placement_report(
            self.model.mod, plan, o.split_channel_blocks, o.split_row_blocks
        )
        (self.out / "placement.json").write_text(json.dumps(placement, indent=2) + "\n")

    # -- phase 3: verify -----------------------------------------------------------------------

    def verify(self, built: Path | None) -> Path:
        """Time the co-executed candidates against each processor alone
        (:func:`codl_tvm.objectives.verify.verify`) and make the fastest the artifact's;
        ``built`` is the primary plan's build (None: it failed, and was dropped)."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import candidate_plans

        o, manifest = self.options, self.manifest
        self.candidates = {"coexec": built} if built is not None else {}
        if o.verify_modes and self.report is not None:
            cost_model = manifest.plan["cost_model"]["file"]
            self.plans = candidate_plans(
                self.model.mod,
                cost_model,
                self.plan,
                o.mode,
                o.verify_modes,
                self.planner_config,
                Path(self.model.path).name,
            )
            manifest.plan["verify_candidates"] = [
                o.mode,
                *(k.split(":", 1)[1] for k in self.plans),
            ]
            for name, (cand, _) in self.plans.items():
                path = self._build_candidate(name, cand)
                if path is not None:
                    self.candidates[name] = path
        self.seen = {self.plan.to_json(), *(c.to_json() for c, _ in self.plans.values())}
        built = verify_builds(
            self.model,
            self.candidates,
            self.libraries,
            self.rounds,
            o.seed,
            manifest,
            o.remote,
            self._more_candidates,
            self.dropped,
        )
        chosen = manifest.verify["chosen"]
        manifest.kernel_splits = self.libraries.kernel_splits.get(chosen)
        if chosen in self.plans:
            self._adopt_plan(*self.plans[chosen], chosen.split(":")[1])
            if chosen.endswith(":calibrated"):
                manifest.plan["calibrated"] = True
        elif chosen in self.refined:
            new_plan, record = self.refined[chosen]
            self._adopt_plan(new_plan, None, record["mode"])
            manifest.plan["source"] = "refined"
            manifest.plan["refined"] = record
        return built

    def _more_candidates(self, ms: dict[str, float]) -> dict[str, Path]:
        """Candidates made from verify's first timing ``ms``: the calibrated plan, refined
        plans."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.planner.policy import calibrated_plans

        o, manifest = self.options, self.manifest
        found = {}
        # calibration and refinement are what an explicit verify asks for; the default
        # measurement times the three builds only
        if self.report is not None and o.verify_calibrate and o.verify:
            found, record = calibrated_plans(
                self.model.mod,
                manifest.plan["cost_model"]["file"],
                o.mode,
                self.report,
                ms,
                self.seen,
                self.planner_config,
                Path(self.model.path).name,
            )
            if record is not None:
                manifest.plan["calibration"] = record
        self.plans.update(found)
        libs = {name: self._build_candidate(name, c) for name, (c, _) in found.items()}
        libs = {name: path for name, path in libs.items() if path is not None}
        coexec = [k for k in ms if k.startswith("coexec")]
        if o.refine and coexec:  # refinement starts from a co-executed build that ran
            source = min(coexec, key=ms.get)
            mode = source.split(":")[1] if source in self.plans else manifest.plan.get("mode")
            libs.update(
                refined_candidates(
                    self.model,
                    source,
                    self.plans[source][0] if source in self.plans else self.plan,
                    self.candidates[source],
                    self.libraries,
                    (o.refine, o.refine_traces),
                    o.seed,
                    self.seen,
                    self.refined,
                    mode,
                    self.dropped,
                )
            )
            manifest.plan["refine"] = {
                "rounds": o.refine,
                "traces": o.refine_traces,
                "candidates": {name: rec for name, (_, rec) in self.refined.items()},
            }
        return libs

    def _build_candidate(self, name: str, plan: PartitionPlan) -> Path | None:
        """The co-executed build ``name`` of ``plan``; None where it fails (dropped, said in
        one line: :func:`~codl_tvm.objectives.verify.build_candidate`)."""
        libraries = self.libraries
        return build_candidate(name, lambda: libraries.coexec(name, plan), self.dropped, libraries)

    def _adopt_plan(self, plan: PartitionPlan, report: PlanReport | None, mode: str) -> None:
        """Make the plan that verify measured fastest the artifact's plan (its files and
        manifest entry); the primary plan's prediction stays on record."""
        adopt_plan_record(self.manifest.plan, report, mode)
        if report is None:  # a refined plan: the planner's report describes another plan
            for name in ("plan_report.json", "plan_report.txt"):
                (self.out / name).unlink(missing_ok=True)
        write_plan_files(self.out, plan, report)
        # the blocks this build split with the plan, as the primary plan's report had them
        self._write_placement(plan)

    # -- phase 4: finalize ---------------------------------------------------------------------

    def finalize(self, built: Path) -> None:
        """Move the chosen library in, with its weights, program binaries and the reference
        outputs."""
        o, manifest, out = self.options, self.manifest, self.out
        kept_gpu_data(manifest, self.libraries, built)
        if o.weights == "beside":
            built = self._weights_beside(built)
        else:
            manifest.weights = {"placement": "embedded"}
        shutil.move(str(built), out / LIBRARY)
        if "opencl" in manifest.vm_devices:
            # where this machine's OpenCL device is the preset's, ship its program binaries
            manifest.program_binaries = program_binaries.embed_for_preset(
                self.preset, out / LIBRARY, out
            )
        if manifest.device == "cpu" and manifest.winograd_cpu_alone:
            manifest.winograd = True  # the library is a build for the CPU alone
        if manifest.device == "cpu" and manifest.packed_cpu_alone:
            manifest.packed = True
        if o.reference:
            self._write_reference()

    def _weights_beside(self, built: Path) -> Path:
        """The library ``built`` with its weights beside it (built again if it has them
        embedded): its weights file moved to ``out`` and recorded in the manifest."""
        libraries = self.libraries
        name = libraries.name_of(built)
        if libraries.specs[name].weights != "beside":
            logger.info("building the %s library again with its weights beside it", name)
            built = libraries.rebuild(name, "beside")
            name = libraries.name_of(built)
        record = libraries.weights[name]
        shutil.move(str(built.with_suffix(".weights")), self.out / WEIGHTS)
        self.manifest.weights = {"placement": "beside", **record, "file": WEIGHTS}
        logger.info(
            "%d weights (%.1f MB) beside the library in %s, loaded while the first inference runs",
            len(record["tensors"]),
            record["bytes"] / 1e6,
            WEIGHTS,
        )
        return built

    def _write_reference(self) -> None:
        """Seeded inputs and the unpartitioned model's outputs on the host CPU."""
        # deferred: needs TVM's compiler (see the module docstring)
        from codl_tvm.schedules import packed_enabled, winograd_enabled

        logger.info("computing the reference outputs (unpartitioned model, host CPU)")
        model, seed = self.model, self.options.seed
        values = random_inputs(model, seed)
        ordered = [values[s.name] for s in model.inputs]
        # the reference is the plain direct model
        with winograd_enabled(()), packed_enabled(()):
            outs = build(model.mod, "cpu", work_dir=self.work)(ordered)
        np.savez(
            self.out / REFERENCE,
            **{f"input:{k}": v for k, v in values.items()},
            **{f"output:{s.name}": o for s, o in zip(model.outputs, outs)},
        )
        self.manifest.reference = {"file": REFERENCE, "seed": seed, "target": "host llvm"}

    def write_manifest(self) -> None:
        """``manifest.json`` with every file's SHA-256; on PoCL, the program binaries taken
        again after one run of the finished artifact."""
        manifest, out = self.manifest, self.out
        manifest.files = {
            p.name: file_sha256(p)
            for p in sorted(out.iterdir())
            if p.name in ARTIFACT_FILES and p.is_file()
        }
        manifest.write(out)
        if not (manifest.program_binaries and program_binaries.is_pocl(runtime.info())):
            return
        # PoCL compiles each kernel's work-group function at its first launch: binaries taken
        # after one run of the finished artifact carry them; where that run fails, the
        # binaries of the build stay (PoCL then compiles those functions at first launch)
        try:
            manifest.program_binaries = program_binaries.embed_after_warm_up(
                out, out / LIBRARY, manifest.program_binaries
            )
        except ArtifactError as exc:
            logger.info("note: %s; the program binaries are kept as built", exc)
        manifest.write(out)


def adopt_plan_record(record: dict[str, Any], report: PlanReport | None, mode: str) -> None:
    """Make ``record`` (``manifest.plan``) describe a plan verify chose over the primary one:
    its mode (for an ``auto`` plan, the mode auto chose; ``mode`` where there is no report, as
    for a refined plan), its predicted summary and ``auto`` candidates; the primary plan's
    mode stays as ``planned_mode``."""
    record["planned_mode"] = record.get("mode")
    record["mode"] = report.mode if report is not None else mode
    record["summary"] = report.summary.to_dict() if report and report.summary else None
    record.pop("auto", None)  # the primary plan's candidates
    if report is not None and report.candidates is not None:
        record["auto"] = {"candidates_ms": dict(report.candidates)}
    record["chosen_by_verify"] = True


def _planner_record(choice, config: PlannerConfig) -> dict[str, Any]:
    """``manifest.plan`` for a plan the planner made (``choice``, a
    :class:`~codl_tvm.planner.policy.PlanChoice`)."""
    path, report = choice.cost_model, choice.report
    record: dict[str, Any] = {
        "source": "planner",
        "mode": report.mode,  # auto: the mode it chose
        "cost_model": {
            "file": str(path),
            "sha256": file_sha256(path),
            "kind": choice.cost_model_kind,
        },
        "planning_s": round(choice.planning_s or 0.0, 4),
        "summary": report.summary.to_dict() if report.summary else None,
    }
    if report.candidates is not None:
        record["auto"] = {"candidates_ms": dict(report.candidates)}
    if config.weight_gbps is not None:
        record["weight_gbps"] = list(config.weight_gbps)
    if tuple(config.processor_scale) != (1.0, 1.0):
        record["processor_scale"] = list(config.processor_scale)
    record["split_margin"] = config.split_margin
    if config.gpu_channels > 1:  # OC cuts rounded to whole image pixels for the GPU
        record["gpu_channels"] = config.gpu_channels
    return record


def _switched_on() -> tuple[bool, bool]:
    """Whether Winograd and packed convs are switched on for some preset."""
    # deferred: needs TVM's compiler (see the module docstring)
    from codl_tvm.schedules.settings import packed_presets, winograd_presets

    return bool(winograd_presets()), bool(packed_presets())
