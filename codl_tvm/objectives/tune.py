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

The measurements are a profiling dataset (:mod:`codl_tvm.cost_model.dataset`) in a cache
directory, one file per kernel setting and timing protocol, its records keyed by operator,
partition, processor and device description (:func:`codl_tvm.profiling.profile.job_key`), each
flushed as it is measured: a later run measures only what is missing (an interrupted one
resumes at the part it was on), and ``codl-tvm cost-model fit`` reads the file as it reads any
dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from codl_tvm.build.targets import TargetPreset, get_preset
from codl_tvm.core.errors import ProfileError
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
from codl_tvm.profiling.profile import ProfileJob, job_key, make_jobs, open_dataset, profile
from codl_tvm.profiling.sessions import LocalSession, device_description
from codl_tvm.profiling.timing import TimingConfig
from codl_tvm.runtime import default_cache_dir

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
    """

    cache: Path
    tuned: tuple[str, ...] = ()
    cached: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    parts_measured: int = 0
    table: MeasuredModel | None = None


def tune_operators(
    mod,
    cost_model: CostModel,
    config: PlannerConfig,
    budget_s: float,
    cache_dir: str | Path,
    preset: str | TargetPreset = "opencl",
    ratios: tuple[float, ...] = TUNE_RATIOS,
    timing: TimingConfig = TUNE_TIMING,
) -> TuneResult:
    """Measure the parts of the operators :func:`tune_candidates` finds on this machine,
    within ``budget_s`` seconds, resuming from the measurements in ``cache_dir``.

    The budget is checked before each part (a part started is finished); progress is one
    INFO line per operator. Run inside the planning context of the build (the algorithm
    switches it turns on), so that the parts are built with the kernels the build makes.

    Raises
    ------
    ProfileError
        ``budget_s`` is not a positive number of seconds, or this machine cannot run
        ``preset``'s parts (:func:`tune_unreachable`).
    """
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not budget_s > 0:
        raise ProfileError(f"budget_s must be a time budget in seconds > 0, got {budget_s!r}")
    preset = get_preset(preset)
    why = tune_unreachable(preset)
    if why is not None:
        raise ProfileError(f"tuning times operator parts on this machine, but {why}")
    path = tune_cache_file(cache_dir, timing)
    candidates = tune_candidates(mod, cost_model, config, ratios)
    if not candidates:
        logger.info("tune: no operator outside the cost model's data, nothing to measure")
        return TuneResult(path)
    run = _Run.start(path, preset, timing, budget_s)
    logger.info(
        "tune: %d operator(s) outside the cost model's data, measured here within %g s (%s)",
        len(candidates),
        budget_s,
        run.path,
    )
    earlier = set(run.done)
    tuned, cached, left, failed, measured = [], [], [], {}, 0
    for i, cand in enumerate(candidates, 1):
        where = f"tune [{i}/{len(candidates)}] {cand.name} (predicted {cand.predicted_ms:.3f} ms)"
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
            logger.info("%s: %d of %d parts measured, the budget is spent", where, count, len(todo))
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
    table = run.table([c.params for c in candidates if c.name in tuned])
    return TuneResult(run.path, tuple(tuned), tuple(cached), tuple(left), failed, measured, table)


@dataclass
class _Run:
    """One tuning run's measuring state: the cache and its header, the session and the device
    it describes, the targets the parts are built for, the deadline and the job keys measured
    so far."""

    path: Path
    meta: dict
    session: LocalSession
    device: dict
    targets: dict
    timing: TimingConfig
    deadline: float
    done: set[str]

    @classmethod
    def start(cls, path: Path, preset: TargetPreset, timing: TimingConfig, budget_s: float) -> _Run:
        switches = algorithm_switches()
        meta = {"command": "codl-tvm tune", **({"algorithms": switches} if switches else {})}
        # the profiler's own resume: the keys measured, a line cut by a killed run dropped
        writer, done = open_dataset(path, meta, timing)
        writer.close()
        targets = {"gpu_target": preset.target("gpu"), "cpu_target": preset.target("cpu")}
        session = LocalSession()
        device = device_description(session, **targets)
        deadline = time.monotonic() + budget_s
        return cls(path, meta, session, device, targets, timing, deadline, done)

    def key(self, job: ProfileJob) -> str:
        return job_key(job.params, job.partition, job.processor, self.device)

    def measure(self, jobs: list[ProfileJob]) -> tuple[int, str | None]:
        """Measure ``jobs`` in order into the cache until the deadline: how many were measured
        and, where one could not be built or timed, why (the rest then not tried)."""
        for count, job in enumerate(jobs):
            if time.monotonic() >= self.deadline:
                return count, None
            try:
                profile(
                    [job],
                    self.path,
                    self.session,
                    timing=self.timing,
                    sharing_sizes=(),
                    meta=self.meta,
                    progress=False,
                    **self.targets,
                )
            except (ProfileError, RuntimeError) as exc:
                return count, _one_line(exc)
            self.done.add(self.key(job))
        return len(jobs), None

    def table(self, params: list[OpParams]) -> MeasuredModel | None:
        """The measurements of the operators ``params`` on this device, as a lookup table."""
        if not params or not self.path.exists():
            return None
        wanted = set(params)
        records = [
            r
            for r in load_dataset(self.path).op_records
            if r.params in wanted and dict(r.device) == self.device
        ]
        return MeasuredModel().fit(records) if records else None


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def tuned_config(
    mod, config: PlannerConfig, options: CompileOptions, preset: TargetPreset
) -> PlannerConfig:
    """``config`` with the operators ``options.tune_budget_s`` tunes (:func:`tune_operators`,
    the cache in :func:`tune_cache_dir` of ``options.build_cache``): the compile's planning
    step; ``config`` itself without tuning.

    Raises
    ------
    OptionsError
        This machine cannot run ``preset``'s parts.
    """
    if options.tune_budget_s is None:
        return config
    why = tune_unreachable(preset)
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
    )
    return dataclasses.replace(config, tuned_parts=result.table)
