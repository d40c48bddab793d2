"""Tuning: the operators the cost model knows least, measured on the target before planning.

A cost model predicts the operators like its data well and the others (a class, kernel or
shape outside it: :meth:`codl_tvm.planner.split.margin.Uncertainty.novelty`) up to 2x off, so
the planner holds their splits to its leave-one-model-out error. ``compile --tune SECONDS``
(and ``plan --tune``) measures them instead, on this machine, with the profiler
(:func:`codl_tvm.profiling.profile.profile`: each part built alone and timed with its
protocol): whole on each processor first, then split at a few GPU shares
(:data:`TUNE_RATIOS`) along each dimension the planner tries, the most expensive operator
(predicted on its faster processor: where a wrong decision costs most) first, until the budget
is spent. An operator measured completely is planned on its measurements
(``PlannerConfig.tuned_parts``) and its decision reported as ``measured``; the others stay
predicted, held to the margin.

With ``remote=(tracker, key)`` (``compile --tune S --tracker H:P --key K``) the parts are built
here with the preset's (cross-)toolchain and timed on a device of ``key`` behind the TVM RPC
tracker (its server started with ``codl-tvm serve --opencl``), as ``verify`` times builds there.
:meth:`TuneResult.record` is what a compile writes to its manifest (``"tune"``) and ``plan
--tune --report`` to its report.

The measurements are a profiling dataset (:mod:`codl_tvm.cost_model.dataset`) in a cache
directory, one file per kernel setting and timing protocol, its records keyed by operator,
partition, processor and device description (:func:`codl_tvm.profiling.profile.job_key`; a
remote device's says ``remote`` and names its tracker key, so measurements here and there never
stand in for each other), each flushed as it is measured: a later run measures only what is
missing (an interrupted one resumes at the part it was on), and ``codl-tvm cost-model fit``
reads the file as it reads any dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codl_tvm.build.targets import TargetPreset, get_preset
from codl_tvm.core.errors import CodlError, ProfileError, RPCError, ToolchainError
from codl_tvm.cost_model.base import CostModel, load_model
from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.cost_model.defaults import cost_model_path
from codl_tvm.cost_model.features import OpParams
from codl_tvm.cost_model.measured import MeasuredModel
from codl_tvm.cost_model.part_ir import algorithm_switches
from codl_tvm.objectives.measure import unreachable
from codl_tvm.options import CompileOptions, OptionsError
from codl_tvm.planner.split.codl import SplitPlanner
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.predict import calibrated_model
from codl_tvm.profiling.part_build import compile_part
from codl_tvm.profiling.profile import ProfileJob, job_key, make_jobs, open_dataset
from codl_tvm.profiling.sessions import LocalSession, RPCSession, Session, device_description
from codl_tvm.profiling.timing import TimingConfig, measure_op
from codl_tvm.rpc.client import RemoteDevice, check_remote_versions, request_remote
from codl_tvm.runtime import default_cache_dir
from codl_tvm.runtime.artifact import Manifest

__all__ = [
    "TUNABLE_KINDS",
    "TUNE_RATIOS",
    "TUNE_TIMING",
    "TuneCandidate",
    "TuneResult",
    "tune_cache_dir",
    "tune_cache_file",
    "tune_candidates",
    "tune_operators",
    "tune_unreachable",
    "tuned_config",
]

logger = logging.getLogger(__name__)

#: The GPU shares a tuned operator's splits are measured at (the nearest the planner tries):
#: a few across the range, as each costs two builds.
TUNE_RATIOS: tuple[float, ...] = (0.3, 0.5, 0.7)

#: The operator kinds the profiler builds as the model has them (its pool parts are max
#: pools, so an average pool's measurement would be another operator's).
TUNABLE_KINDS: tuple[str, ...] = ("conv2d", "max_pool2d", "matmul")

#: The timing protocol of tuning: the profiler's own (its medians are what the datasets hold).
TUNE_TIMING = TimingConfig()


def tune_cache_dir(build_cache: str | Path | None = None) -> Path:
    """Where tuning keeps its measurements: ``tune/`` beside the libraries of ``build_cache``,
    else in the user's cache directory (:func:`codl_tvm.runtime.default_cache_dir`)."""
    return (Path(build_cache) if build_cache is not None else default_cache_dir()) / "tune"


def tune_cache_file(directory: str | Path, timing: TimingConfig = TUNE_TIMING) -> Path:
    """The dataset in ``directory`` holding the parts measured with the algorithm switches on
    now (Winograd, packed convs: other kernels) and ``timing``: one file per setting, as a
    dataset holds one (:func:`codl_tvm.profiling.profile.open_dataset`)."""
    setting = {"algorithms": algorithm_switches(), "timing": timing.to_meta()}
    digest = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:12]
    return Path(directory) / f"tune-{digest}.jsonl"


def tune_unreachable(preset: TargetPreset) -> str | None:
    """Why this machine cannot measure ``preset``'s parts (None: it can)."""
    if preset.is_cross:
        return f"preset {preset.name!r} cross-compiles for {preset.triple}, not this machine"
    return unreachable(preset)


@dataclass(frozen=True)
class TuneCandidate:
    """An operator to tune: its name, description, why the cost model knows it least, its
    predicted latency on its faster processor and the parts to measure (whole parts first)."""

    name: str
    params: OpParams
    novel: tuple[str, ...]
    predicted_ms: float
    jobs: tuple[ProfileJob, ...]


def _shares(config: PlannerConfig, ratios: tuple[float, ...]) -> list[float]:
    """The planner's GPU shares nearest to ``ratios`` (the planner asks only for its own)."""
    grid = config.split_ratios
    return sorted({min(grid, key=lambda s: abs(s - r)) for r in ratios}) if grid else []


def tune_candidates(
    mod, cost_model: CostModel, config: PlannerConfig, ratios: tuple[float, ...] = TUNE_RATIOS
) -> list[TuneCandidate]:
    """The operators of ``mod`` that ``cost_model`` (calibrated by ``config``) flags as outside
    its data, that the profiler can build, the most expensive first."""
    model, _ = calibrated_model(cost_model, dataclasses.replace(config, tuned_parts=None))
    with warnings.catch_warnings():
        # the cost model's fallbacks: the planning that follows reports them in its notes
        warnings.simplefilter("ignore")
        planner = SplitPlanner(mod, model, config, "tune")
    shares = _shares(config, ratios)
    found = []
    for op in planner.ops:
        if op.params is None or not op.novel or op.info.kind not in TUNABLE_KINDS:
            continue
        dims = [d.value for d in op.info.dims if d.value in config.dims]
        named = [(op.name, op.params)]
        jobs = make_jobs(named, ("none",), (0.0,)) + make_jobs(named, dims, shares)
        cost = min(op.cpu_ms, op.gpu_ms)
        found.append(TuneCandidate(op.name, op.params, tuple(op.novel), cost, tuple(jobs)))
    return sorted(found, key=lambda c: (-c.predicted_ms, c.name))


@dataclass(frozen=True)
class TuneResult:
    """What a tuning run measured.

    Attributes
    ----------
    cache
        The dataset holding the measurements.
    tuned
        The operators measured completely (in this run or an earlier one), in tuning order.
    cached
        Of ``tuned``, those an earlier run had measured: nothing was measured for them now.
    left
        The operators not measured completely: the budget ran out, or a part failed
        (``failed``); they stay predicted, and a later run resumes them.
    failed
        Operator -> why one of its parts could not be built or timed.
    parts_measured
        Parts measured in this run.
    table
        The tuned operators' measurements (``PlannerConfig.tuned_parts``); None where none
        was tuned.
    flagged
        Every operator the cost model flagged and the profiler can build
        (:func:`tune_candidates`), in tuning order: ``tuned`` and ``left`` together.
    budget_s, spent_s
        The time budget, and the seconds the run took (connecting, building and timing).
    on
        Where the parts were timed: ``"this machine"``, or the remote device and its tracker.
    device
        The description the measurements are keyed by (empty where nothing was flagged).
    times
        Tuned operator -> its measured parts as the planner reads them: ``whole_cpu_ms``,
        ``whole_gpu_ms`` and ``splits`` (each ``dim``, ``gpu_share``, ``cpu_ms``, ``gpu_ms``).
    """

    cache: Path
    tuned: tuple[str, ...] = ()
    cached: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    parts_measured: int = 0
    table: MeasuredModel | None = None
    flagged: tuple[str, ...] = ()
    budget_s: float | None = None
    spent_s: float = 0.0
    on: str = "this machine"
    device: dict[str, Any] = field(default_factory=dict)
    times: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The run as JSON: a compile's ``manifest.json`` ``"tune"`` and ``plan --tune
        --report``'s ``"tune"``. ``measured`` (``measured_fresh`` in this run,
        ``measured_cached`` from the cache) and ``predicted`` (the budget ran out, or a part
        failed: ``failed``) add up to ``flagged``; ``operators`` holds each measured
        operator's parts the plan was made on."""
        return {
            "budget_s": self.budget_s,
            "spent_s": round(self.spent_s, 3),
            "cache": str(Path(self.cache).resolve()),  # the manifest is read elsewhere
            "on": self.on,
            "device": dict(self.device),
            "flagged": len(self.flagged),
            "measured": len(self.tuned),
            "measured_fresh": len(self.tuned) - len(self.cached),
            "measured_cached": len(self.cached),
            "predicted": len(self.left),
            "parts_measured": self.parts_measured,
            "left": list(self.left),
            "failed": dict(self.failed),
            "operators": [
                {"name": n, "from_cache": n in self.cached, **self.times.get(n, {})}
                for n in self.tuned
            ],
        }


def tune_operators(
    mod,
    cost_model: CostModel,
    config: PlannerConfig,
    budget_s: float,
    cache_dir: str | Path,
    preset: str | TargetPreset = "opencl",
    ratios: tuple[float, ...] = TUNE_RATIOS,
    timing: TimingConfig = TUNE_TIMING,
    remote: tuple[str, str] | None = None,
) -> TuneResult:
    """Measure the parts of the operators :func:`tune_candidates` finds on this machine (or,
    with ``remote``, on a device of ``key`` behind the TVM RPC ``tracker``), within
    ``budget_s`` seconds, resuming from the measurements in ``cache_dir``.

    The budget is checked before each part (a part started is finished); progress is one
    INFO line per operator. Run inside the planning context of the build (the algorithm
    switches it turns on), so that the parts are built with the kernels the build makes.

    Raises
    ------
    ProfileError
        ``budget_s`` is not a positive number of seconds, this machine cannot run
        ``preset``'s parts (:func:`tune_unreachable`; without ``remote``), the remote device
        cannot be reached or has no OpenCL runtime, or the preset's toolchain is missing.
    """
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not budget_s > 0:
        raise ProfileError(f"budget_s must be a time budget in seconds > 0, got {budget_s!r}")
    started = time.monotonic()
    preset = get_preset(preset)
    why = None if remote is not None else tune_unreachable(preset)
    if why is not None:
        raise ProfileError(f"tuning times operator parts on this machine, but {why}")
    path = tune_cache_file(cache_dir, timing)
    candidates = tune_candidates(mod, cost_model, config, ratios)
    if not candidates:
        logger.info("tune: no operator outside the cost model's data, nothing to measure")
        return TuneResult(path, budget_s=budget_s, spent_s=time.monotonic() - started)
    with _Run.start(path, preset, timing, started + budget_s, remote) as run:
        logger.info(
            "tune: %d operator(s) outside the cost model's data, measured on %s within %g s (%s)",
            len(candidates),
            run.on,
            budget_s,
            run.path,
        )
        earlier = set(run.done)
        tuned, cached, left, failed, measured = [], [], [], {}, 0
        for i, cand in enumerate(candidates, 1):
            where = f"tune [{i}/{len(candidates)}] {cand.name}"
            where += f" (predicted {cand.predicted_ms:.3f} ms)"
            todo = [j for j in cand.jobs if run.key(j) not in run.done]
            if not todo:
                tuned.append(cand.name)
                if all(run.key(j) in earlier for j in cand.jobs):
                    cached.append(cand.name)
                logger.info("%s: measured before, %d parts", where, len(cand.jobs))
                continue
            start = time.monotonic()
            count, error = run.measure(todo)
            measured += count
            if error is not None:
                failed[cand.name] = error
                left.append(cand.name)
                logger.warning("%s: not tuned, a part failed: %s", where, error)
            elif count < len(todo):
                left.append(cand.name)
                logger.info(
                    "%s: %d of %d parts measured, the budget is spent", where, count, len(todo)
                )
            else:
                tuned.append(cand.name)
                elapsed = time.monotonic() - start
                logger.info(
                    "%s: %d parts measured in %.1f s (%s)", where, count, elapsed, cand.novel[0]
                )
        if left:
            logger.info(
                "tune: %d operator(s) stay predicted (%s); a later run resumes from %s",
                len(left),
                ", ".join(left),
                run.path,
            )
        table, times = run.measurements([c for c in candidates if c.name in tuned])
    return TuneResult(
        run.path,
        tuple(tuned),
        tuple(cached),
        tuple(left),
        failed,
        measured,
        table,
        tuple(c.name for c in candidates),
        budget_s,
        time.monotonic() - started,
        run.on,
        run.device,
        times,
    )


@dataclass
class _Run:
    """One tuning run's measuring state: the cache and its header, the session and the device
    it describes (and the remote device it runs on, if any), the preset and targets the parts
    are built for, the directory they are built in, the deadline and the job keys measured so
    far. A context manager: leaving it disconnects and removes the built parts."""

    path: Path
    meta: dict
    session: Session
    device: dict
    preset: TargetPreset
    targets: dict
    timing: TimingConfig
    deadline: float
    done: set[str]
    work: Path
    on: str = "this machine"
    remote: RemoteDevice | None = None

    @classmethod
    def start(
        cls,
        path: Path,
        preset: TargetPreset,
        timing: TimingConfig,
        deadline: float,
        remote: tuple[str, str] | None = None,
    ) -> _Run:
        switches = algorithm_switches()
        meta = {"command": "codl-tvm tune", **({"algorithms": switches} if switches else {})}
        # the profiler's own resume: the keys measured, a line cut by a killed run dropped
        writer, done = open_dataset(path, meta, timing)
        writer.close()
        targets = {"gpu_target": preset.target("gpu"), "cpu_target": preset.target("cpu")}
        if remote is None:
            session: Session = LocalSession()
            device, on, connected = device_description(session, **targets), "this machine", None
        else:
            connected, on = _connect(*remote)
            session = RPCSession(connected.session)
            # the tracker key names the kind of device: a device like this one's measured there
            device = {**device_description(session, **targets), "rpc_key": remote[1]}
        work = Path(tempfile.mkdtemp(prefix="codl-tune-"))
        return cls(
            path, meta, session, device, preset, targets, timing, deadline, done, work, on,
            connected,
        )  # fmt: skip

    def __enter__(self) -> _Run:
        return self

    def __exit__(self, *exc) -> None:
        if self.remote is not None:
            self.remote.close()
        shutil.rmtree(self.work, ignore_errors=True)

    def key(self, job: ProfileJob) -> str:
        return job_key(job.params, job.partition, job.processor, self.device)

    def measure(self, jobs: list[ProfileJob]) -> tuple[int, str | None]:
        """Build ``jobs`` here and time them on the session in order into the cache until the
        deadline (each record flushed as measured): how many were measured and, where one
        could not be built or timed, why (the rest then not tried).

        Raises
        ------
        ProfileError
            The preset's toolchain is missing: no part can be built.
        """
        # cross-compiled parts are linked by the preset's toolchain, others as the profiler does
        export = self.preset.name if self.preset.is_cross else None
        writer, _ = open_dataset(self.path, self.meta, self.timing)
        with writer:
            for count, job in enumerate(jobs):
                if time.monotonic() >= self.deadline:
                    return count, None
                target = self.targets["gpu_target" if job.processor == "gpu" else "cpu_target"]
                try:
                    part = compile_part(
                        job.params, job.partition, job.processor, self.work, target, job.name,
                        preset=export,
                    )  # fmt: skip
                    record = measure_op(self.session, part, self.work, self.device, self.timing)
                except ToolchainError as exc:
                    raise ProfileError(
                        f"tune: cannot build parts for preset {self.preset.name!r}: {exc}"
                    ) from None
                except (CodlError, RuntimeError) as exc:
                    return count, _one_line(exc)
                writer.append(record)
                self.done.add(self.key(job))
        return len(jobs), None

    def measurements(
        self, tuned: list[TuneCandidate]
    ) -> tuple[MeasuredModel | None, dict[str, dict[str, Any]]]:
        """The measurements of the ``tuned`` operators on this run's device: as a lookup table
        (None where none), and each operator's parts (:attr:`TuneResult.times`)."""
        if not tuned or not self.path.exists():
            return None, {}
        wanted = {c.params for c in tuned}
        records = [
            r
            for r in load_dataset(self.path).op_records
            if r.params in wanted and dict(r.device) == self.device
        ]
        samples: dict[str, list[float]] = {}
        for r in records:
            samples.setdefault(job_key(r.params, r.partition, r.processor, self.device), []).append(
                r.latency_ms
            )
        medians = {k: statistics.median(v) for k, v in samples.items()}
        times = {c.name: _operator_times(c, lambda j: medians.get(self.key(j))) for c in tuned}
        return (MeasuredModel().fit(records) if records else None), times


def _connect(tracker: str, key: str) -> tuple[RemoteDevice, str]:
    """A device of ``key`` behind ``tracker`` with a usable OpenCL runtime, and where it is (in
    words, as ``verify`` says it)."""
    try:
        remote = request_remote(tracker, key)
    except RPCError as exc:
        raise ProfileError(f"tune: {exc}") from None
    try:
        info = check_remote_versions(remote) or {}
        if info.get("opencl") != "1":
            raise ProfileError(
                f"tune: remote device {remote.name} has no usable OpenCL runtime (start its "
                "server with `codl-tvm serve --opencl`)"
            )
    except (ProfileError, RPCError) as exc:
        remote.close()
        raise ProfileError(str(exc) if str(exc).startswith("tune: ") else f"tune: {exc}") from None
    on = f"{remote.name} (RPC {tracker}, key {key})"
    if info.get("emulated"):  # e.g. qemu: what it measures follows no real latency
        on += f" [EMULATED ({info['emulated']}): not hardware latencies]"
    return remote, on


def _operator_times(cand: TuneCandidate, median_ms) -> dict[str, Any]:
    """``cand``'s measured parts (``median_ms(job)``: the part's median, None if missing)."""
    whole: dict[str, float | None] = {}
    splits: dict[tuple[str, float], dict[str, Any]] = {}
    for job in cand.jobs:
        ms = median_ms(job)
        if job.partition.dim == "none":
            whole[job.processor] = ms
            continue
        split = splits.setdefault(
            (job.partition.dim, job.partition.ratio),
            {"dim": job.partition.dim, "gpu_share": job.partition.ratio},
        )
        split[f"{job.processor}_ms"] = ms
    for split in splits.values():  # a part a split leaves empty is not measured
        split.setdefault("cpu_ms", None)
        split.setdefault("gpu_ms", None)
    return {
        "whole_cpu_ms": whole.get("cpu"),
        "whole_gpu_ms": whole.get("gpu"),
        "splits": list(splits.values()),
    }


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def tuned_config(
    mod,
    config: PlannerConfig,
    options: CompileOptions,
    preset: TargetPreset,
    manifest: Manifest | None = None,
) -> PlannerConfig:
    """``config`` with the operators ``options.tune_budget_s`` tunes (:func:`tune_operators`,
    the cache in :func:`tune_cache_dir` of ``options.build_cache``; on the device behind
    ``options.remote`` where given): the compile's planning step; ``config`` itself without
    tuning. With ``manifest``, the run's :meth:`TuneResult.record` goes to its ``"tune"``.

    Raises
    ------
    OptionsError
        This machine cannot run ``preset``'s parts (and no tracker is given).
    """
    if options.tune_budget_s is None:
        return config
    why = None if options.remote is not None else tune_unreachable(preset)
    if why is not None:
        raise OptionsError(
            f"tune_budget_s times the planner's operators on this machine, but {why}",
            ("tune_budget_s", "preset"),
        )
    cost_model = load_model(cost_model_path(options.cost_model, preset.name))
    result = tune_operators(
        mod,
        cost_model,
        config,
        options.tune_budget_s,
        tune_cache_dir(options.build_cache),
        preset,
        remote=options.remote,
    )
    if manifest is not None:
        manifest.extra["tune"] = result.record()
    return dataclasses.replace(config, tuned_parts=result.table)
