"""Planning policy: which plan a command runs, and when one processor alone is the better build.

:func:`resolve_plan` is the one plan resolution of ``codl-tvm compile`` and ``codl-tvm run
--plan auto`` (and of anything else that turns "a plan file, a uniform split or the planner"
into something to build): it makes or loads the plan and applies the fall-back rule
(:func:`single_processor`), so a model ``compile`` keeps on one processor is run on that
processor by ``run`` too. :func:`planning_context` gives the planner the schedule configs and
CPU kernels the build for a preset will use, so its predictions describe what is built.

The policy reads the IR and the cost model; it never rewrites IR and never builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codl_tvm.build.cache import switch_on  # re-exported: its home before build
from codl_tvm.build.targets import TargetPreset, get_preset
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import PartitionPlan, uniform_plan
from codl_tvm.cost_model.base import ModelFileError, load_model
from codl_tvm.cost_model.defaults import NoDefaultModelError, cost_model_path
from codl_tvm.planner.placement.modes import ALL_MODES, make_plan
from codl_tvm.planner.report import PlanReport
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.predict import covered_impls
from codl_tvm.schedules import (
    cpu_alone_settings,
    cpu_config,
    opencl_config,
)
from codl_tvm.schedules.presets import (
    CPU_ALONE_SETTINGS,
    PACKED_CPU_ALONE,
    WINOGRAD_CPU_ALONE,
)

__all__ = [
    "CALIBRATION_MIN_SHIFT",
    "MIN_PREDICTED_SPEEDUP",
    "PlanChoice",
    "calibrated_plans",
    "candidate_plans",
    "cost_model_cpu_alone",
    "planning_context",
    "resolve_plan",
    "single_processor",
]

# Co-execute only when the plan is predicted at least this much faster than the faster
# processor alone: whole operators placed on the other processor pay syncs and (coarse SVM) map
# and unmap costs the per-operator model does not see, and the model's error on a whole-model
# sum is a few percent (measured: SqueezeNet planned at a predicted 1.006x ran 2.2x slower than
# the H100 alone). The co-executed codl plans measured on the emulated SoC at k = 8 and k = 12
# (scripts/model_level_check.py) were predicted 1.07-1.40x faster and ran 0.92-1.15x: from 1.08
# to 1.10 the margin picks the faster build on six of eight (five at 1.05: VGG16 at 1.07x ran
# 0.96x, PoseNet at k = 12 1.07x ran 0.92x) and their summed latency is lowest.
MIN_PREDICTED_SPEEDUP = 1.08

DEFAULT_PRESET = "opencl"  # this machine's OpenCL device and CPU

logger = logging.getLogger(__name__)


def single_processor(plan, report: PlanReport | None, mode: str) -> tuple[str, str] | None:
    """Where a plan is better run by one processor alone: ``(device, reason)`` or None.

    A plan that keeps every operator whole on one processor, or that the cost model predicts to
    be less than :data:`MIN_PREDICTED_SPEEDUP` times faster than the faster processor alone, is
    built for that processor (CoDL's planner falls back; the uLayer-like baseline does not).
    """
    ratios = {e.ratio for e in plan.entries()}
    if not ratios:  # no conv, pool or matmul: nothing to split or place
        device = "cpu" if plan.home == "cpu" else "opencl"
        return device, (
            f"the plan holds no operator (nothing to split or place); built for its home "
            f"processor, the {'CPU' if device == 'cpu' else 'GPU'}"
        )
    if ratios == {0.0}:
        return "cpu", "the plan keeps every operator whole on the CPU"
    if ratios == {1.0}:
        return "opencl", "the plan keeps every operator whole on the GPU"
    if report is None or mode == "ulayer_like" or report.summary is None:
        return None
    s = report.summary
    best, best_ms = (
        ("cpu", s.cpu_only_ms) if s.cpu_only_ms <= s.gpu_only_ms else ("opencl", s.gpu_only_ms)
    )
    if s.predicted_ms * MIN_PREDICTED_SPEEDUP > best_ms:
        return best, (
            f"predicted {s.predicted_ms:.3f} ms co-executed vs {best_ms:.3f} ms on the "
            f"{'CPU' if best == 'cpu' else 'GPU'} alone (co-execution needs a predicted "
            f"{MIN_PREDICTED_SPEEDUP:.2f}x)"
        )
    return None


@dataclass(frozen=True)
class PlanChoice:
    """What a model is built as: a co-executed plan, or one processor alone and why.

    Attributes
    ----------
    plan
        The plan (validated against the module); also kept when ``device`` is one processor.
    report
        The planner's report, or None for a given or uniform plan.
    device
        ``"coexec"``, or ``"cpu"`` / ``"opencl"`` where :func:`single_processor` falls back.
    reason
        Why one processor alone (None when co-executing).
    source
        ``"planner"``, ``"given"`` (a plan object or file) or ``"uniform"`` (``dim``/``ratio``).
    mode
        The planner mode (None unless ``source`` is ``"planner"``).
    cost_model
        The cost-model file planned with (None unless ``source`` is ``"planner"``).
    cost_model_kind
        Its kind (``CostModel.kind``).
    planning_s
        Seconds the planner took.
    """

    plan: PartitionPlan
    report: PlanReport | None
    device: str
    reason: str | None
    source: str
    mode: str | None = None
    cost_model: Path | None = None
    cost_model_kind: str | None = None
    planning_s: float | None = None


def resolve_plan(
    mod,
    *,
    plan: PartitionPlan | str | Path | None = None,
    dim: str | None = None,
    ratio: float | None = None,
    mode: str = "codl",
    cost_model: str | Path | None = None,
    preset: str | None = None,
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> PlanChoice:
    """The plan to build ``mod`` with, and whether to co-execute it.

    Parameters
    ----------
    mod
        The Relax module as imported.
    plan
        A :class:`~codl_tvm.core.plan.PartitionPlan` or the path of a plan JSON.
    dim, ratio
        A uniform plan instead: every partitionable operator split along ``dim`` (``"H"`` or
        ``"OC"``, default ``"H"``) with GPU share ``ratio`` (default 0.5).
    mode
        Planner mode (``codl_tvm.planner.ALL_MODES``: CoDL's, the placement modes ``hope``,
        ``hope_greedy``, ``starpu``, ``mosaic``, ``codl_hope``, or ``auto``) when neither a plan
        nor ``dim``/``ratio`` is given: the planner then plans with ``cost_model``. The
        fall-back rule applies to every mode's plan alike.
    cost_model
        The cost-model file; default: the shipped model for ``preset``.
    preset
        The target preset the plan is built for (default ``opencl``: this machine).
    config
        Planner settings. Default: :func:`planning_context`'s for ``preset`` (the schedule
        configs and CPU kernels its build uses), entered here for the planning. A caller that
        passes a config has set up the context it needs itself.
    model_name
        Recorded in the planner's report.

    Raises
    ------
    PlannerError
        Both a plan and ``dim``/``ratio``, a plan file that does not exist, an unknown mode.
    codl_tvm.core.errors.PlanError
        The plan does not fit the module.
    codl_tvm.core.errors.ModelFileError, codl_tvm.core.errors.NoDefaultModelError
        The cost model cannot be read, or no shipped model describes the preset.
    """
    if plan is not None and (dim is not None or ratio is not None):
        raise PlannerError("give either plan or dim/ratio, not both")
    if plan is not None or dim is not None or ratio is not None:
        if plan is None:
            plan, source = uniform_plan(mod, dim or "H", 0.5 if ratio is None else ratio), "uniform"
        else:
            if not isinstance(plan, PartitionPlan):
                if not Path(plan).is_file():
                    raise PlannerError(f"plan {plan}: no such file")
                plan = PartitionPlan.load(plan)
            source = "given"
        plan.validate(mod)
        device, reason = single_processor(plan, None, mode) or ("coexec", None)
        return PlanChoice(plan, None, device, reason, source=source)
    if mode not in ALL_MODES:
        raise PlannerError(f"planner mode {mode!r} is not one of {tuple(ALL_MODES)}")
    preset_name = preset or DEFAULT_PRESET
    path = cost_model_path(cost_model, preset)
    cm = load_model(path)
    t0 = time.perf_counter()
    with (
        planning_context(preset_name, cost_model)
        if config is None
        else contextlib.nullcontext(config)
    ) as cfg:
        plan, report = make_plan(mod, cm, mode=mode, config=cfg, model_name=model_name)
    planning_s = time.perf_counter() - t0
    device, reason = single_processor(plan, report, mode) or ("coexec", None)
    return PlanChoice(
        plan,
        report,
        device,
        reason,
        source="planner",
        mode=mode,
        cost_model=path,
        cost_model_kind=cm.kind,
        planning_s=planning_s,
    )


# ---------------------------------------------------------------------------------------------
# The kernels a preset's build uses, so the planner predicts what is built.


def cpu_alone_winograd(preset_obj: TargetPreset) -> bool:
    """Whether the preset's CPU is one where builds for the CPU alone default to Winograd."""
    return cpu_config(preset_obj.target("cpu")).name in WINOGRAD_CPU_ALONE


def cpu_alone_packed(preset_obj: TargetPreset) -> bool:
    """Whether the preset's CPU is one where builds for the CPU alone default to packed convs."""
    return cpu_config(preset_obj.target("cpu")).name in PACKED_CPU_ALONE


def cpu_alone_algorithms(preset_obj: TargetPreset, winograd: bool, packed: bool) -> tuple[str, ...]:
    """Of ``winograd`` and ``packed`` (those asked for), the algorithms the preset's builds for
    the CPU alone use (``WINOGRAD_CPU_ALONE``, ``PACKED_CPU_ALONE``)."""
    return tuple(
        name
        for name, on in (
            ("winograd", winograd and cpu_alone_winograd(preset_obj)),
            ("packed", packed and cpu_alone_packed(preset_obj)),
        )
        if on
    )


def coexec_cpu_algorithms(
    cost_model: str | Path | None, preset_obj: TargetPreset, winograd, packed
) -> tuple[str, ...]:
    """The algorithms co-executed CPU parts use by default: those the preset's builds for the
    CPU alone use (``WINOGRAD_CPU_ALONE``, ``PACKED_CPU_ALONE``) for which the cost model has
    CPU conv data (``codl-tvm profile --winograd/--packed``), so the planner predicts the
    kernels the build makes. An explicit ``winograd``/``packed`` (True or False) decides alone."""
    try:
        path = cost_model_path(cost_model, preset_obj.name)
        covered = covered_impls(load_model(path), "conv2d", "cpu")
    except (ModelFileError, NoDefaultModelError):
        return ()  # planning reports the problem
    alone = cpu_alone_algorithms(preset_obj, winograd is None, packed is None)
    return tuple(name for name in alone if name in covered)


def cost_model_cpu_alone(cost_model: str | Path | None, preset: str | None) -> bool:
    """Whether the planner's cost model (default: the shipped one of ``preset``) was fitted
    with CPU-alone Winograd/packed kernels (``codl-tvm profile --cpu-alone``) for a CPU whose
    builds for the CPU alone have such settings; False where it cannot be read (planning
    reports why)."""
    preset_obj = get_preset(preset or DEFAULT_PRESET)
    if cpu_config(preset_obj.target("cpu")).name not in CPU_ALONE_SETTINGS:
        return False
    try:
        path = cost_model_path(cost_model, preset_obj.name)
        meta = json.loads(path.read_text()).get("meta") or {}  # the header only: no boosters
        return isinstance(meta, dict) and bool(meta.get("cpu_alone_settings"))
    except (OSError, ValueError, AttributeError, NoDefaultModelError):
        return False


def planner_config(preset_obj: TargetPreset) -> PlannerConfig:
    """The planner settings with the schedule configs the build will use for each processor."""
    gpu = preset_obj.target("gpu") if preset_obj.has_gpu else None
    return PlannerConfig(
        cpu=cpu_config(preset_obj.target("cpu")),
        gpu=opencl_config(gpu) if gpu is not None and gpu.kind.name == "opencl" else None,
    )


@contextlib.contextmanager
def planning_context(
    preset: str, cost_model: str | Path | None = None, **settings: Any
) -> Iterator[PlannerConfig]:
    """The planner settings ``compile --device coexec`` plans with for ``preset``, as a context.

    Inside it, the algorithms that co-executed CPU parts get by default (those the cost model has
    data for) are switched on, and it yields the :class:`~codl_tvm.planner.PlannerConfig` with the
    preset's schedule configs (``settings`` override its other fields). Scripts that re-plan
    measured builds use it so their predictions describe the kernels those builds ran."""
    preset_obj = get_preset(preset)
    with contextlib.ExitStack() as stack:
        if cost_model_cpu_alone(cost_model, preset):
            stack.enter_context(cpu_alone_settings(True))
            algos = cpu_alone_algorithms(preset_obj, True, True)
        else:
            algos = coexec_cpu_algorithms(cost_model, preset_obj, None, None)
        switch_on(stack, algos, preset_obj)
        yield dataclasses.replace(planner_config(preset_obj), **settings)


# ---------------------------------------------------------------------------------------------
# More plans for ``compile --verify`` to time.


def candidate_plans(
    mod,
    cost_model: str | Path,
    plan: PartitionPlan,
    mode: str,
    modes,
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> dict[str, tuple[PartitionPlan, PlanReport]]:
    """The plans of ``modes`` that differ from ``plan`` and from each other and co-execute
    (single-processor plans are the CPU and GPU builds timed anyway): ``{"coexec:<mode>":
    (plan, report)}``, made with ``cost_model`` (the file ``plan`` was made with)."""
    cm = load_model(cost_model)
    seen = {plan.to_json()}
    found = {}
    for m in modes:
        if m == mode:
            continue
        cand, report = make_plan(mod, cm, mode=m, config=config, model_name=model_name)
        text = cand.to_json()
        alone = not cand.entries() or single_processor(cand, None, m) is not None
        if text in seen or alone:
            logger.info(
                "verify: the %s plan adds no candidate (same plan, or one processor alone)", m
            )
            continue
        seen.add(text)
        found[f"coexec:{m}"] = (cand, report)
    return found


#: Re-plan with calibrated predictions only when the two processors' measured/predicted
#: ratios differ by more than this factor: equal factors keep the processors' balance (only
#: the weight of the sharing costs would change), not worth another build and timing.
CALIBRATION_MIN_SHIFT = 1.1


def calibrated_plans(
    mod,
    cost_model: str | Path,
    mode: str,
    report: PlanReport,
    measured_ms: dict[str, float],
    seen: set[str],
    config: PlannerConfig | None = None,
    model_name: str | None = None,
) -> tuple[dict[str, tuple[PartitionPlan, PlanReport]], dict | None]:
    """The plan of ``mode`` re-made with each processor's predictions scaled by ``measured /
    predicted`` of the model on it alone (``measured_ms["cpu"]``, ``measured_ms["opencl"]``
    against ``report``'s summary).

    Returns
    -------
    (dict, dict | None)
        ``{"coexec:<mode>:calibrated": (plan, report)}`` if that plan co-executes and differs
        from every plan in ``seen`` (which grows), else ``{}``; and the record of the
        calibration (``cpu_scale``, ``gpu_scale``, ``candidates``), None where the summary has
        no single-processor predictions. One plan, not one per verify mode: each costs a build
        and its first OpenCL compile.
    """
    s = report.summary
    if s is None or not (s.cpu_only_ms > 0 and s.gpu_only_ms > 0):
        return {}, None
    cpu_scale, gpu_scale = measured_ms["cpu"] / s.cpu_only_ms, measured_ms["opencl"] / s.gpu_only_ms
    record: dict[str, Any] = {"cpu_scale": cpu_scale, "gpu_scale": gpu_scale, "candidates": []}
    shift = max(cpu_scale / gpu_scale, gpu_scale / cpu_scale)
    if shift < CALIBRATION_MIN_SHIFT:
        logger.info(
            "verify: measured/predicted CPU x%.2f, GPU x%.2f: within %sx of each other, no "
            "calibrated re-plan",
            cpu_scale,
            gpu_scale,
            CALIBRATION_MIN_SHIFT,
        )
        return {}, record
    config = config or PlannerConfig()
    # The summary predicted with the config's own scales: the calibration multiplies them.
    base_cpu, base_gpu = config.processor_scale
    config = dataclasses.replace(
        config, processor_scale=(base_cpu * cpu_scale, base_gpu * gpu_scale)
    )
    cm = load_model(cost_model)
    found = {}
    cand, rep = make_plan(mod, cm, mode=mode, config=config, model_name=model_name)
    text = cand.to_json()
    if text not in seen and cand.entries() and single_processor(cand, None, mode) is None:
        seen.add(text)
        found[f"coexec:{mode}:calibrated"] = (cand, rep)
        record["candidates"].append(mode)
    logger.info(
        "verify: measured/predicted CPU x%.2f, GPU x%.2f; calibrated re-plans add %d "
        "candidate(s)%s",
        cpu_scale,
        gpu_scale,
        len(found),
        f" ({', '.join(record['candidates'])})" if found else "",
    )
    return found, record
