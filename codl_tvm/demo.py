"""``codl-tvm demo``: what the project does, shown on whatever machine runs it.

The demo takes one model (the bundled CNN by default) through two builds on the local OpenCL
device and the CPU:

1. **the planned build**: the planner with the shipped cost model decides, as ``codl-tvm
   compile`` does, and may keep the model on one processor (with its reason: on a laptop the
   local OpenCL device is the CPU's own cores, so the CPU alone wins);
2. **a co-executed build with a fixed split** (every operator along one dimension at one GPU
   share, consecutive operators chained where the partitioning pass allows), so that the
   co-execution itself is seen whatever the planner chose.

Both are checked against the unpartitioned model on the host CPU and timed side by side (one
sentence says why they differ on this machine), and one co-executed inference is traced into a
timeline picture with a GPU lane and a CPU lane. The planner's predictions are those of its
cost model, for the hardware the model was fitted on (the shipped ones: an emulated SoC, or an
H100 with a 16-core Xeon), and the summary says so beside what was measured here.

:func:`run_demo` does the work and returns a :class:`DemoResult`; the CLI prints
:meth:`DemoResult.lines`. Progress goes to this module's logger at INFO, one short line per
step (the first run compiles the OpenCL runtime plugin and the kernels); the builds' own
messages go to ``build.log`` in the output directory (their warnings to the console too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pkgutil
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import codl_tvm
from codl_tvm import runtime
from codl_tvm.build.runner import max_abs_difference
from codl_tvm.core.errors import ArtifactError, BuildError, PlanError
from codl_tvm.core.plan import (
    ChainPlan,
    OpPartition,
    PartitionDim,
    PartitionPlan,
    uniform_plan,
)
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.passes.partition_analysis import OperatorAnalysis
from codl_tvm.planner.split.part_table import (
    OperatorPlacement,
    halo_span,
    operator_placement,
    placement_lines,
)
from codl_tvm.profiling.trace import Trace, trace_inference
from codl_tvm.runtime.artifact import Artifact, load_artifact

__all__ = [
    "DEMO_ENTRIES",
    "BuildOutcome",
    "DemoOptions",
    "DemoResult",
    "OperatorPlacement",
    "cost_model_hardware",
    "fixed_split_plan",
    "halo_span",
    "operator_placement",
    "placement_lines",
    "run_demo",
]

logger = logging.getLogger(__name__)

#: What the demo writes into its output directory (nothing else is ever replaced there).
DEMO_ENTRIES = ("planned", "coexec", "timeline.png", "timeline.json", "build.log")

# Outputs agree with the reference when the largest difference is within this fraction of the
# largest reference value (float32 sums in another order; the CLI's check since the start).
_RTOL = 1e-4


@dataclass(frozen=True)
class DemoOptions:
    """What the demo builds and where it writes.

    Attributes
    ----------
    model
        The ONNX model; None: the bundled CNN.
    cost_model
        Cost-model JSON for the planned build; None: the one shipped for the local device pair.
    dim, ratio
        The co-executed build's fixed split: every partitionable operator along ``dim`` (``H``
        or ``OC``) with GPU share ``ratio`` (strictly between 0 and 1, so both processors work).
    chain
        Chain consecutive split operators where the partitioning pass allows it (CoDL's
        chains: data is shared at chain entry and exit only); False splits each alone. None:
        chain H splits (a chain recomputes a few halo rows) and split OC alone (an OC chain
        computes every channel of its earlier convolutions on both processors).
    output
        The demo's directory (new, empty, or an earlier demo's with ``force``); None: a new
        temporary directory.
    force
        Replace an earlier demo's output in ``output``, and the files of ``trace``.
    trace
        Write the Chrome trace here (its PNG timeline beside it, ``.png``) instead of
        ``timeline.json``/``timeline.png`` in ``output``.
    seed
        Seed of the reference inputs.
    rounds, runs_per_round
        Timing: the two builds alternate for ``rounds`` rounds of ``runs_per_round`` runs;
        each build's latency is the median over rounds of its mean run time.
    """

    model: Path | None = None
    cost_model: Path | None = None
    dim: str = "H"
    ratio: float = 0.5
    chain: bool | None = None
    output: Path | None = None
    force: bool = False
    trace: Path | None = None
    seed: int = 0
    rounds: int = 5
    runs_per_round: int = 10


@dataclass(frozen=True)
class BuildOutcome:
    """One of the demo's builds, checked and timed."""

    label: str
    artifact: Path
    #: ``coexec``, ``cpu`` or ``opencl``: what the artifact runs on
    device: str
    max_abs_diff: float
    ok: bool
    latency_ms: float


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo found; :meth:`lines` is its printed summary."""

    model: Path
    opencl: str
    #: whether the OpenCL device is the host CPU's own cores (a CPU OpenCL runtime)
    opencl_on_host_cpu: bool
    cost_model: str
    #: the planner's predictions: ``predicted_ms``, ``cpu_only_ms``, ``gpu_only_ms``, for the
    #: hardware the cost model describes (:attr:`cost_model_hardware`), not this machine
    predicted: dict
    #: why the planned build runs on one processor; None when the planner co-executes
    fallback: str | None
    planned: BuildOutcome
    coexec: BuildOutcome
    split: str
    placement: list[OperatorPlacement]
    trace: Trace
    timeline_png: Path
    chrome_trace: Path
    why: str
    output: Path
    #: the hardware the cost model was fitted on, in words ("an emulated SoC: ...")
    cost_model_hardware: str = "the hardware its data was measured on"

    @property
    def ok(self) -> bool:
        """Both builds match the unpartitioned model."""
        return self.planned.ok and self.coexec.ok

    def lines(self) -> list[str]:
        """The summary the CLI prints (about 25 lines for the bundled CNN)."""
        name = self.model.name
        p = self.predicted
        out = [
            f"planner's predictions ({self.cost_model}), for {self.cost_model_hardware}, "
            "not this machine:",
            f"  CPU alone {p['cpu_only_ms']:.3f} ms, GPU alone {p['gpu_only_ms']:.3f} ms, "
            f"best plan {p['predicted_ms']:.3f} ms",
        ]
        if self.fallback is not None:
            out.append(f"{name} runs on the {self.planned.device} alone: {self.fallback}")
        else:
            out.append(f"{name} is co-executed as planned (see {self.planned.artifact}/plan.json)")
        out += ["", f"co-executed build, {self.split}:"]
        out += placement_lines(self.placement)
        out.append("")
        width = max(len(_label(self.planned)), len(_label(self.coexec)), 26)
        out.append(f"{'':24s}  {_label(self.planned):{width}s}  {_label(self.coexec)}")
        out.append(
            f"{'vs unpartitioned (CPU)':24s}  {_check(self.planned):{width}s}  "
            f"{_check(self.coexec)}"
        )
        ratio = self.coexec.latency_ms / self.planned.latency_ms
        out.append(
            f"{'latency here, median':24s}  {f'{self.planned.latency_ms:.3f} ms':{width}s}  "
            f"{self.coexec.latency_ms:.3f} ms ({ratio:.2f}x)"
        )
        out.append(f"why: {self.why}")
        s = self.trace.summary()
        lanes = self.trace.lane_counts()
        out.append(
            f"timeline of one co-executed inference: {self.timeline_png} (GPU lane "
            f"{lanes.get('GPU', 0)} kernels, CPU lane {lanes.get('CPU', 0)} kernels, overlap "
            f"{s['overlap_us'] / 1e3:.2f} ms of {s['span_us'] / 1e3:.2f} ms)"
        )
        out.append(
            f"artifacts: {self.planned.artifact}, {self.coexec.artifact} "
            "(run one again: codl-tvm run DIR)"
        )
        out.append(f"build messages: {self.output / 'build.log'}")
        return out


def _label(b: BuildOutcome) -> str:
    where = {"cpu": "CPU alone", "opencl": "GPU alone", "coexec": "GPU + CPU"}[b.device]
    return f"{b.label} ({where})"


def _check(b: BuildOutcome) -> str:
    return f"max abs diff {b.max_abs_diff:.2g} -> {'OK' if b.ok else 'MISMATCH'}"


def fixed_split_plan(mod, dim: str, ratio: float, chain: bool = True) -> PartitionPlan:
    """Every partitionable operator of ``mod`` along ``dim`` at GPU share ``ratio``; with
    ``chain``, runs of consecutive operators the partitioning pass accepts as a chain (each
    operator reads only the previous one's output) become chains.

    Raises
    ------
    PlanError
        No operator of ``mod`` can be split along ``dim``, or ``ratio`` is not strictly
        between 0 and 1 (a whole-model placement co-executes nothing).
    """
    d = PartitionDim.parse(dim, "demo split")
    if not 0.0 < float(ratio) < 1.0:
        raise PlanError(
            f"demo split: GPU share {ratio!r} leaves one processor idle; give a ratio strictly "
            "between 0 and 1"
        )
    single = uniform_plan(mod, d, ratio)
    if not single.ops:
        raise PlanError(f"demo split: no operator of the model can be split along {d.value}")
    if not chain:
        return single
    # The partitioning pass's own legality check, as the planner uses it for its chains.
    analysis = OperatorAnalysis(mod)

    def chainable(names: list[str]) -> bool:
        try:
            analysis.chain(ChainPlan(tuple(names), d, ratio))
        except PlanError:
            return False
        return True

    groups: list[list[str]] = []
    for op in (o.op for o in single.ops):
        if groups and chainable([*groups[-1], op]):
            groups[-1].append(op)
        else:
            groups.append([op])
    return PartitionPlan(
        ops=tuple(OpPartition(g[0], d, ratio) for g in groups if len(g) == 1),
        chains=tuple(ChainPlan(tuple(g), d, ratio) for g in groups if len(g) > 1),
        model_fingerprint=single.model_fingerprint,
    )


def _split_text(plan: PartitionPlan) -> str:
    entries = plan.entries()
    e = entries[0]
    chains = sum(1 for x in entries if len(x.ops) > 1)
    n_ops = sum(len(x.ops) for x in entries)
    how = f" in {chains} chain{'s' if chains > 1 else ''}" if chains else ""
    return f"{n_ops} operators split on {e.dim.value} at GPU share {e.ratio:.2f}{how}"


def _prepare_output(options: DemoOptions) -> Path:
    if options.output is None:
        return Path(tempfile.mkdtemp(prefix="codl-demo-"))
    out = Path(options.output)
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{out}: exists and is not a directory")
    if out.is_dir():
        entries = sorted(p.name for p in out.iterdir())
        foreign = [n for n in entries if n not in DEMO_ENTRIES]
        if foreign:
            raise ArtifactError(
                f"{out}: holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, "
                "which the demo did not write; give a new or empty directory"
            )
        if entries and not options.force:
            raise ArtifactError(
                f"{out}: holds an earlier demo's output; pass --force to replace it"
            )
    out.mkdir(parents=True, exist_ok=True)
    return out


def _check_trace_path(chrome: Path, force: bool) -> None:
    """Before anything is built: the trace's folder exists and no file of the user's is
    replaced without ``force``."""
    if not chrome.parent.is_dir():
        raise ArtifactError(f"--trace {chrome}: folder {chrome.parent} does not exist")
    for path in (chrome, chrome.with_suffix(".png")):
        if path.exists() and not force:
            raise ArtifactError(f"--trace {chrome}: {path} exists; pass --force to overwrite it")
        if path.is_dir():
            raise ArtifactError(f"--trace {chrome}: {path} is a directory")


def host_cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo`` on Linux), or ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def opencl_on_host_cpu(device_name: str, platform_name: str) -> bool:
    """Whether the OpenCL device is the host CPU (a CPU OpenCL runtime: Intel's, PoCL's)."""
    name = device_name.strip().lower()
    host = host_cpu_name().strip().lower()
    # a short name ("arm", "x86_64" from platform.processor()) says nothing about the model
    if min(len(host), len(name)) >= 6 and (host in name or name in host):
        return True
    # PoCL names its CPU devices "cpu-<arch>-<model>" (or "pthread-<model>" before 3.0)
    return "portable computing language" in platform_name.lower() and name.startswith(
        ("cpu", "pthread")
    )


def _why(
    planned: BuildOutcome, coexec: BuildOutcome, trace: Trace, device: str, on_host: bool
) -> str:
    """One sentence on why the two builds' latencies differ, from what was measured."""
    s = trace.summary()
    faster = coexec.latency_ms < planned.latency_ms
    if on_host:
        cores = os.cpu_count() or 0
        return (
            f"the OpenCL device here ({device}) runs on this machine's own {cores} CPU cores, so "
            f"its kernels ({s['gpu_busy_us'] / 1e3:.2f} ms busy in the timeline) compete with the "
            f"CPU kernels ({s['cpu_busy_us'] / 1e3:.2f} ms) for the same cores instead of running "
            "beside them"
            + (
                ", yet co-execution measured faster"
                if faster
                else "; on a phone the GPU is a separate processor and both parts run at once"
            )
            + "."
        )
    if faster:
        return (
            f"the GPU here ({device}) is a separate processor, so the two parts of each split "
            f"run at the same time ({s['overlap_us'] / 1e3:.2f} ms of overlap in the timeline)."
        )
    return (
        f"the GPU here ({device}) is a separate processor, but a fixed split does not match the "
        f"two processors' speeds on this model: one waits for the other "
        f"({s['sync_wait_us'] / 1e3:.2f} ms of synchronisation waits in the timeline), and the "
        "planner's own choice is the planned build."
    )


def _check_outputs(art: Artifact, inputs: list[np.ndarray], expected: list[np.ndarray]):
    outputs = art(inputs)
    # equal infinities and NaN against NaN agree; any other NaN or inf is an inf error
    err = max_abs_difference(outputs, expected)
    scale = max(1.0, *(float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)) for r in expected))
    return err, bool(err <= _RTOL * scale)


def _time_alternating(runners: dict[str, Callable[[], None]], rounds: int, runs: int):
    """Median over rounds of each build's mean run time (ms); builds alternate within a round
    (and swap order every round) so that a drift of the machine's load favours neither."""
    samples: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = runners[name]
            t0 = time.perf_counter()
            for _ in range(runs):
                fn()
            samples[name].append((time.perf_counter() - t0) * 1e3 / runs)
    return {k: statistics.median(v) for k, v in samples.items()}


def run_demo(options: DemoOptions) -> DemoResult:
    """Plan, build, check, time and trace the demo's two builds (see the module docstring).

    Progress goes to this module's logger at INFO, one line per step; the builds' messages to
    ``build.log`` in the output directory.

    Parameters
    ----------
    options
        What to build and where.

    Returns
    -------
    DemoResult
        Both builds' checks and latencies, the co-executed placement, the trace and the files.

    Raises
    ------
    CodlError
        A subclass for every expected failure: OpenCL unusable here (:class:`BuildError`), an
        output directory holding other files (:class:`ArtifactError`), a split the model does
        not allow (:class:`PlanError`), a build that fails.
    """
    if options.rounds < 1 or options.runs_per_round < 1:
        raise ArtifactError(
            f"demo timing needs at least one round of one run, got {options.rounds} rounds of "
            f"{options.runs_per_round}"
        )
    model_path = Path(options.model) if options.model is not None else bundled_model_path()
    model = load_onnx(model_path)
    # Checked before anything is built: a bad split is the user's input.
    chain = options.chain if options.chain is not None else str(options.dim).upper() == "H"
    plan = fixed_split_plan(model.mod, options.dim, options.ratio, chain)
    if options.cost_model is not None and not Path(options.cost_model).is_file():
        raise ArtifactError(f"--cost-model {options.cost_model}: no such file")
    if options.trace is not None:
        _check_trace_path(Path(options.trace), options.force)
    created = options.output is None or not Path(options.output).exists()
    out = _prepare_output(options)
    try:
        return _run(options, out, model_path, model, plan)
    except BaseException:
        if created:
            # a directory of our own: a failed run leaves nothing behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _run(
    options: DemoOptions,
    out: Path,
    model_path: Path,
    model,
    plan: PartitionPlan,
) -> DemoResult:
    """:func:`run_demo` once its inputs are checked and its directory is ready."""
    log = logger.info
    log("[1/5] loading the OpenCL runtime (the first run compiles its plugin, about 30 s)")
    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:
        raise BuildError(
            f"OpenCL is not usable here ({exc}); the demo runs on the local OpenCL device and "
            "the CPU (`codl-tvm info` shows the platforms)"
        ) from None
    dev = info.devices[0]
    opencl = f"{info.platform} / {dev.name} ({dev.compute_units} CUs, SVM {info.svm_mode})"
    log(f"      OpenCL: {opencl}")
    with _build_messages_to(out / "build.log"):
        cost = Path(options.cost_model).name if options.cost_model else "the shipped cost model"
        log(
            f"[2/5] planning {model_path.name} with {cost}, building the planned version and "
            "timing it against each processor alone"
        )
        compile_artifact(
            model_path,
            out / "planned",
            CompileOptions(cost_model=options.cost_model, seed=options.seed, force=options.force),
        )
        split = _split_text(plan)
        log(f"[3/5] building a co-executed version: {split}")
        compile_artifact(
            model_path,
            out / "coexec",
            CompileOptions(plan=plan, seed=options.seed, force=options.force),
        )
    planned_art, coexec_art = load_artifact(out / "planned"), load_artifact(out / "coexec")
    log(
        "[4/5] checking both against the unpartitioned model and timing them "
        "(the first run compiles OpenCL kernels)"
    )
    values, expected = coexec_art.reference()
    inputs = [values[s.name] for s in coexec_art.model.inputs]
    checks = {
        "planned": _check_outputs(planned_art, inputs, expected),
        "coexec": _check_outputs(coexec_art, inputs, expected),
    }
    latency = _time_alternating(
        {"planned": planned_art.runner(inputs), "coexec": coexec_art.runner(inputs)},
        options.rounds,
        options.runs_per_round,
    )
    log("[5/5] tracing one co-executed inference")
    trace = _typical_trace(coexec_art, inputs)
    chrome = Path(options.trace) if options.trace else out / "timeline.json"
    png = chrome.with_suffix(".png")
    trace.save_chrome(chrome)
    trace.save_png(png, title=f"{model_path.name}, one co-executed inference ({split}) on {opencl}")
    outcomes = {
        name: BuildOutcome(
            label="planned" if name == "planned" else "co-executed",
            artifact=art.path,
            device=art.device,
            max_abs_diff=checks[name][0],
            ok=checks[name][1],
            latency_ms=latency[name],
        )
        for name, art in (("planned", planned_art), ("coexec", coexec_art))
    }
    on_host = opencl_on_host_cpu(dev.name, info.platform)
    record = planned_art.manifest.get("plan") or {}
    summary = record.get("summary") or {}
    cm_file = (record.get("cost_model") or {}).get("file")
    return DemoResult(
        model=model_path,
        opencl=opencl,
        opencl_on_host_cpu=on_host,
        cost_model=Path(cm_file).name if cm_file else "cost model",
        cost_model_hardware=cost_model_hardware(cm_file),
        predicted={k: summary.get(k, float("nan")) for k in _PREDICTED},
        fallback=record.get("fallback"),
        planned=outcomes["planned"],
        coexec=outcomes["coexec"],
        split=split,
        placement=operator_placement(model.mod, plan),
        trace=trace,
        timeline_png=png,
        chrome_trace=chrome,
        why=_why(
            outcomes["planned"],
            outcomes["coexec"],
            trace,
            f"{info.platform} on {dev.name}" if on_host else dev.name,
            on_host,
        ),
        output=out,
    )


_PREDICTED = ("predicted_ms", "cpu_only_ms", "gpu_only_ms")

# The hardware each shipped cost model was fitted on (codl_tvm.cost_model.defaults), by the
# start of its file name; any other model describes whatever its data was measured on.
_FITTED_ON = {
    "emulated-soc": "an emulated SoC (8 Xeon cores as the GPU through PoCL, 8 as the CPU)",
    "device-h100": "an H100 with a 16-core Xeon",
}


def cost_model_hardware(file_name: str | None) -> str:
    """The hardware a cost model's predictions describe, in words, from its file name."""
    stem = Path(file_name).stem if file_name else ""
    for prefix, hardware in _FITTED_ON.items():
        if stem.startswith(prefix):
            return hardware
    return "the hardware its data was measured on"


class _BuildLog(logging.FileHandler):
    """The builds' messages into ``build.log``; their warnings reach the console as well."""

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            logging.getLogger("codl_tvm").handle(record)


@contextlib.contextmanager
def _build_messages_to(path: Path) -> Iterator[None]:
    """Inside the block, the messages of every codl_tvm package but the demo go to ``path``
    instead of the console (the demo's summary stays on one screen)."""
    handler = _BuildLog(path, mode="w")
    handler.setFormatter(logging.Formatter("%(message)s"))
    names = [
        f"codl_tvm.{m.name}"
        for m in pkgutil.iter_modules(codl_tvm.__path__)
        if m.name not in ("demo", "cli")
    ]
    saved = []
    for name in names:
        log = logging.getLogger(name)
        saved.append((log, log.propagate, log.level))
        log.addHandler(handler)
        log.propagate = False
        log.setLevel(min(log.getEffectiveLevel(), logging.INFO))
    try:
        yield
    finally:
        for log, propagate, level in saved:
            log.removeHandler(handler)
            log.propagate = propagate
            log.setLevel(level)
        handler.close()


def _typical_trace(art: Artifact, inputs: list[np.ndarray], n: int = 3) -> Trace:
    """The trace of median span among ``n`` warm inferences (one inference on a busy machine
    may catch a pause that is not the build's)."""
    traces = sorted((trace_inference(art, inputs, warmup=1) for _ in range(n)), key=_span)
    return traces[len(traces) // 2]


def _span(trace: Trace) -> float:
    return trace.span_us()
