"""Whether a compile measures its candidate builds, and where.

codl-tvm's promise is an artifact never slower than the best single processor. The cost model
cannot keep it alone: it may describe another device, and on operators it never saw it errs by
up to 2x. So a co-executed compile that plans builds the plan and each processor alone and
times the three on the target (:func:`codl_tvm.objectives.verify.verify`), wherever the target
can be reached: this machine, or a device behind a TVM RPC tracker. Where it cannot, the compile
says why and records the choice as unchecked.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from codl_tvm import runtime
from codl_tvm.build.targets import TargetPreset, cpu_record
from codl_tvm.cost_model.fitted_device import device_mismatch, fitted_device, local_device
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.cpu_features import missing_cpu_features
from codl_tvm.runtime.warm_up import worth_warming

__all__ = [
    "LOCAL_PRESETS",
    "MEASURE_ROUNDS",
    "cost_model_mismatch",
    "gpu_data_measurement",
    "measurement",
    "unreachable",
    "warms_up",
]

logger = logging.getLogger(__name__)

#: Presets that build for this machine's own OpenCL device and CPU.
LOCAL_PRESETS = ("opencl", "host", "pocl")

#: Rounds of timing when ``compile`` measures by default (each round times every build twice,
#: round-robin, so drift does not favour one; the median decides).
MEASURE_ROUNDS = 3


def measurement(options: CompileOptions, preset: TargetPreset) -> tuple[int, str | None]:
    """Rounds of timing this compile does, and why it could not measure where it would have.

    ``verify`` asks for its rounds; otherwise a co-executed compile that plans (no given plan)
    measures :data:`MEASURE_ROUNDS` rounds where the target is reachable: on this machine, a
    preset that runs here (not cross-compiled, an OpenCL device present, the CPU's instruction
    set), or on the device behind ``tracker``.
    """
    if options.verify:
        return options.verify, None
    if options.device != "coexec" or options.plan is not None:
        return 0, None
    if not options.measure:
        why = "not measured: measuring was switched off"
        logger.warning("%s; the cost model's choice stands, unchecked", why)
        return 0, why
    why = None if options.remote is not None else unreachable(preset)
    if why is None:
        return MEASURE_ROUNDS, None
    logger.warning(
        "cannot measure the builds: %s; co-execution is chosen by the cost model's predictions "
        "alone (unchecked)",
        why,
    )
    return 0, why


def gpu_data_measurement(options: CompileOptions, preset: TargetPreset) -> tuple[int, str | None]:
    """Rounds of timing that choose the GPU's data type, and why it could not measure where it
    would have.

    A compile that asks ``gpu_data_type="auto"``, for the GPU alone (``device="opencl"``: its
    buffer and image builds) or co-executed (``"coexec"``: the plan with its GPU parts in
    buffers and on images, beside :func:`measurement`'s candidates), times them where the
    target is reachable, as :func:`measurement` says: on the device behind ``tracker`` (whose
    VM gets the OpenCL device once per VM slot of an image build), or on this machine where it
    runs the preset (:func:`unreachable`); ``verify``'s rounds, else :data:`MEASURE_ROUNDS`. A
    co-executed compile with a given plan measures only with ``verify``. Otherwise (``measure``
    off, the target out of reach) the device's capability decides, unchecked.
    """
    if options.device not in ("opencl", "coexec") or options.gpu_data_type != "auto":
        return 0, None
    if not options.measure and not options.verify:
        why = "not measured: measuring was switched off"
    elif options.device == "coexec" and options.plan is not None and not options.verify:
        why = "not measured: the plan was given (verify measures it)"
    elif options.remote is not None:
        return options.verify or MEASURE_ROUNDS, None
    else:
        reason = unreachable(preset)
        if reason is None:
            return options.verify or MEASURE_ROUNDS, None
        why = f"not measured: {reason}"
    logger.warning(
        "%s; gpu_data_type 'auto' takes images wherever the device can hold them (unchecked)",
        why,
    )
    return 0, why


def warms_up(options: CompileOptions) -> bool:
    """Whether the OpenCL builds a compile times on this machine are first run in parallel
    warm-up processes (:func:`~codl_tvm.runtime.warm_up.warm_up`): where the platform compiles
    serially within a process (PoCL), so their first timed run does not compile every kernel
    one after the other; builds timed through a tracker are not (their device compiles)."""
    return options.remote is None and worth_warming()


def unreachable(preset: TargetPreset) -> str | None:
    """Why this machine cannot run ``preset``'s builds (None: it can)."""
    if preset.is_cross:
        return f"preset {preset.name!r} cross-compiles for {preset.triple} (give a tracker and key)"
    record = cpu_record(preset.target("cpu"))
    arch, missing = missing_cpu_features(record)
    if arch is not None:
        return f"preset {preset.name!r} builds for {record.get('arch')}, this machine is {arch}"
    if missing:
        return f"this machine's CPU lacks {', '.join(missing)}, which preset {preset.name!r} needs"
    if not runtime.is_available():
        return "this machine has no usable OpenCL device (`codl-tvm info` says why)"
    return None


def cost_model_mismatch(
    path: Path, preset: TargetPreset, options: CompileOptions, measured: bool
) -> str | None:
    """Why the cost model at ``path`` does not describe the device a compile for ``preset``
    runs on here (None: it does, or the build is for another machine), logged once."""
    if preset.name not in LOCAL_PRESETS or options.remote is not None:
        return None  # built for another machine: its device is not this one's
    here = local_device()
    meta = json.loads(path.read_text()).get("meta", {})
    why = None if here is None else device_mismatch(fitted_device(meta), here)
    if why is not None:
        checked = "its choice is checked by measuring the builds" if measured else "unchecked"
        logger.warning(
            "the cost model %s describes another device: %s; %s", path.name, why, checked
        )
    return why
