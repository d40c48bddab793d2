"""``gpu_data_type="auto"`` in a co-executed compile: the GPU parts' data type chosen by
measuring, as CoDL chooses it per device.

A co-executed compile that measures (:func:`codl_tvm.objectives.measure.measurement`) times the
plan against each processor alone (:func:`codl_tvm.objectives.verify.verify`). With ``auto``,
where the device has images, the plan is built twice: ``coexec`` with its GPU parts in buffers
and ``coexec:image`` with them on images (built in a worker process beside the buffer build,
:meth:`~codl_tvm.build.cache.Libraries.start_image_variant`); the image build is one more
candidate of the same round-robin, so one timing decides both the processors and the data type.
Other co-executed candidates (``--verify-modes``, calibrated and refined plans) keep buffers.
The manifest's ``gpu`` record gets the pair's medians as a GPU-alone ``auto`` records its own
(:func:`codl_tvm.objectives.verify.gpu_data_auto`). Where the compile cannot measure, the
device's capability decides, recorded as ``unchecked``.

A compile that asks no data type (``gpu_data_type=None``, ``compile`` without
``--gpu-data-type``) follows the cost model's profile (:func:`prepare_gpu_data`): where the
cost model it uses carries a ``meta["gpu_data_type"]`` record
(:mod:`codl_tvm.profiling.data_type`, ``codl-tvm profile --data-type``) measured on the device
the compile builds for, the GPU alone and the GPU parts of co-executed builds get its data
type (images where the model's tensors fit them, as ``auto`` decides by capability); a record
of another device, or none, keeps buffers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from codl_tvm.build.cache import Libraries
from codl_tvm.build.targets import TargetPreset
from codl_tvm.core.errors import CodlError
from codl_tvm.cost_model.defaults import cost_model_path
from codl_tvm.cost_model.fitted_device import describe_device, device_mismatch, local_device
from codl_tvm.objectives.measure import LOCAL_PRESETS, gpu_data_measurement
from codl_tvm.options import CompileOptions
from codl_tvm.profiling.data_type import META_KEY, DataTypeRecord
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest

__all__ = [
    "IMAGE_CANDIDATE",
    "ProfiledDataType",
    "kept_gpu_data",
    "planner_channels",
    "prepare_coexec_gpu_data",
    "prepare_gpu_data",
    "profiled_data_type",
    "record_coexec_gpu_data",
]

logger = logging.getLogger(__name__)

#: The library name of the primary plan built with its GPU parts on images (its buffer build
#: is ``"coexec"``).
IMAGE_CANDIDATE = "coexec:image"


@dataclass(frozen=True)
class ProfiledDataType:
    """The GPU data type a compile that asks none gets from its cost model's profile.

    Attributes
    ----------
    data_type
        ``"image"`` or ``"buffer"``: the profile's choice where it was measured on the
        compile's device, else ``"buffer"``.
    record
        The cost model's ``meta["gpu_data_type"]`` (None: it has none).
    note
        Why the record does not apply (another device, or one that cannot be checked), else
        None.
    """

    data_type: str = "buffer"
    record: DataTypeRecord | None = None
    note: str | None = None

    def manifest_record(self) -> dict[str, Any]:
        """What the manifest's ``gpu`` record adds: where the choice came from."""
        if self.record is None:
            return {}
        if self.note is not None:
            return {"source": "default", "profile_note": self.note}
        profile = {"data_type": self.record.data_type, "ratio": self.record.ratio}
        profile["device"] = self.record.describe_device()
        return {"asked": self.data_type, "source": "profile", "profile": profile}


def profiled_data_type(
    cost_model: str | Path | None, preset: TargetPreset, remote: bool = False
) -> ProfiledDataType:
    """The data type the profile in ``cost_model`` (a file, a shipped model's name, or None for
    ``preset``'s shipped model) gives a compile for ``preset`` (``remote``: timed on a tracker's
    device), logged in one line where the cost model has a profile.

    The record applies where it was measured on the device the compile builds for: a preset of
    this machine (``opencl``, ``host``, ``pocl``), not timed through a tracker, whose OpenCL
    device, platform and compute units match the record's
    (:func:`~codl_tvm.cost_model.fitted_device.device_mismatch`). A cost model that cannot be
    found or read has no record here (the compile's planning reports it where it needs it).

    Raises
    ------
    ModelFileError
        The record in the cost model is malformed.
    """
    try:
        path = cost_model_path(cost_model, preset.name)
        meta = json.loads(path.read_text(encoding="utf-8")).get("meta") or {}
    except (CodlError, OSError, ValueError, AttributeError):
        return ProfiledDataType()
    if META_KEY not in meta:
        return ProfiledDataType()
    record = DataTypeRecord.from_json(meta[META_KEY], f"{path} (meta.{META_KEY})")
    where = record.describe_device()
    here = None if preset.name not in LOCAL_PRESETS or remote else local_device()
    if here is None:
        target = "a tracker's device" if remote else f"preset {preset.name!r}'s device"
        if preset.name in LOCAL_PRESETS and not remote:
            target = "this machine, which has no usable OpenCL device"
        note = f"profiled on {where}; the compile builds for {target}, not checked against it"
    elif device_mismatch(record.device, here) is not None:
        gpu = {k: v for k, v in here.items() if k != "cpu_threads"}  # the GPU's choice
        note = f"profiled on {where}, not on {describe_device(gpu)}"
    else:
        if record.ratio is None:
            logger.info(
                "GPU data type: %s (profiled on %s: %s)", record.data_type, where, record.reason
            )
        else:
            logger.info(
                "GPU data type: %s (profiled on %s: images %.2gx the buffers' time)",
                record.data_type,
                where,
                record.ratio,
            )
        return ProfiledDataType(record.data_type, record)
    logger.info(
        "note: the cost model's profiled GPU data type (%s) is for another device (%s); "
        "keeping buffers",
        record.data_type,
        note,
    )
    return ProfiledDataType("buffer", record, note)


def prepare_gpu_data(options: CompileOptions, libraries: Libraries) -> dict[str, Any] | None:
    """Decide the GPU data type of a compile's builds before anything is built
    (:meth:`~codl_tvm.build.cache.Libraries.set_gpu_data`) and return the record for the
    manifest's ``gpu`` (None where there is none).

    ``options.gpu_data_type`` where given; else the cost model's profile
    (:func:`profiled_data_type`): its ``"image"`` is asked as ``auto`` is decided by
    capability (images where the device can hold the model's tensors, never timed again), the
    record saying ``"source": "profile"``; otherwise buffers, as without a profile. A
    co-executed ``auto`` then prepares its timing (:func:`prepare_coexec_gpu_data`)."""
    asked, extra = options.gpu_data_type, {}
    if asked is None:
        asked = "buffer"
        if options.device != "cpu":
            profiled = profiled_data_type(
                options.cost_model, libraries.preset, options.remote is not None
            )
            asked = "auto" if profiled.data_type == "image" else "buffer"
            extra = profiled.manifest_record()
    gpu = libraries.set_gpu_data(asked, options.gpu_dtype, options.device)
    if gpu is not None:
        gpu.update(extra)
    prepare_coexec_gpu_data(options, libraries)  # auto: images timed, or unchecked
    return gpu


def prepare_coexec_gpu_data(options: CompileOptions, libraries: Libraries) -> None:
    """Before anything is built: for a co-executed compile that asks ``auto``, whether the
    image build of the plan is timed (``libraries.measure_images``; the co-executed builds then
    keep buffers until the timing decides) or the capability rule stands unchecked
    (``libraries.gpu_data["unchecked"]``: why it could not measure)."""
    gpu = libraries.gpu_data
    if options.device != "coexec" or options.gpu_data_type != "auto":
        return
    rounds, why = gpu_data_measurement(options, libraries.preset)
    if not rounds:
        if why is not None:
            gpu["unchecked"] = why
        return
    if gpu["data_type"] == "image":
        gpu["data_type"] = "buffer"
        libraries.measure_images = True


def record_coexec_gpu_data(
    manifest: Manifest,
    libraries: Libraries,
    samples: dict[str, list[float]],
    where: str,
    rounds: int,
    chosen: str,
    dropped: dict[str, str],
) -> None:
    """After verify's timing (``samples`` by library, taken on ``where`` in ``rounds``
    rounds; ``chosen`` the fastest library, ``dropped`` the candidates dropped with their
    reasons): record in ``manifest.extra["gpu"]`` the medians of the plan's buffer and image
    builds (``measured_ms``, ``samples_ms``, ``measured_on``, ``rounds``; ``dropped`` for an
    image build that failed), the kept build's data type and its VM's devices, and say in one
    line what was compared and kept. Nothing for a compile that is not co-executed ``auto``;
    where the plan was not timed co-executed (it splits nothing), ``why`` says so."""
    gpu = libraries.gpu_data
    if libraries.gpu_data_device != "coexec" or gpu.get("asked") != "auto":
        return
    names = {"buffer": "coexec", "image": IMAGE_CANDIDATE}
    samples_ms = {t: list(samples[n]) for t, n in names.items() if n in samples}
    if IMAGE_CANDIDATE in dropped:
        gpu["dropped"] = {"image": dropped[IMAGE_CANDIDATE]}
    if not samples_ms:
        note = "the co-executed plan was not timed (it splits nothing, or its builds failed)"
        gpu["why"] = f"{gpu['why']}; {note}" if gpu.get("why") else note
        return
    ms = {t: float(np.median(v)) for t, v in samples_ms.items()}
    gpu.update(measured_ms=ms, samples_ms=samples_ms, measured_on=where)
    gpu["rounds"] = rounds
    gpu["data_type"] = "image" if chosen == IMAGE_CANDIDATE else "buffer"
    if gpu["data_type"] == "buffer":
        gpu["dtype"] = "float32"  # float16 GPU parts exist only on images
    if chosen in names.values():
        manifest.vm_devices = libraries.gpu_vm_devices()
        kept = f"keeping {gpu['data_type']}s"
    else:
        kept = f"the {PROCESSOR_NAMES[chosen]} alone is kept, faster than both"
    images = "" if "image" in ms else f" (images not timed: {gpu.get('why') or 'dropped'})"
    # gpu_data_auto's line for the GPU alone, in the same words
    logger.info(
        "GPU data type of the co-executed plan measured on %s (median of %d rounds): %s; %s%s",
        where,
        rounds,
        ", ".join(f"{t}s {v:.3f} ms" for t, v in ms.items()),
        kept,
        images,
    )


def kept_gpu_data(manifest: Manifest, libraries: Libraries, built: Path) -> None:
    """Make a co-executed compile's ``gpu`` record describe the library it keeps (``built``):
    where that is a build for one processor (a fallback), its buffers, and why."""
    gpu = manifest.extra.get("gpu")
    if gpu is None or libraries.gpu_data_device != "coexec":
        return
    device = libraries.specs[libraries.name_of(built)].device
    if device == "coexec" or gpu["data_type"] == "buffer":
        return
    gpu["data_type"] = "buffer"
    note = (
        f"the artifact runs on the {PROCESSOR_NAMES[device]} alone, built with buffers in a "
        "co-executed compile"
    )
    gpu["why"] = f"{gpu['why']}; {note}" if gpu.get("why") else note


def planner_channels(libraries: Libraries) -> int:
    """The planner's ``gpu_channels`` for a compile (:class:`~codl_tvm.planner.PlannerConfig`):
    4, one RGBA pixel, where co-executed GPU parts may compute on images (``image`` asked, or
    ``auto`` where the device has them), so OC cuts give the GPU whole pixels; else 1. The
    planner then also charges each GPU part its image conversions
    (``PlannerConfig.gpu_images``, on where ``gpu_channels > 1``), predicted by the conversion
    fit of the cost model's profile (``codl-tvm profile --data-type``) where it has one."""
    images = libraries.gpu_data["data_type"] == "image" or libraries.measure_images
    return 4 if libraries.gpu_data_device == "coexec" and images else 1
