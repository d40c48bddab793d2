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
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from codl_tvm.build.cache import Libraries
from codl_tvm.objectives.measure import gpu_data_measurement
from codl_tvm.options import CompileOptions
from codl_tvm.runtime.artifact import PROCESSOR_NAMES, Manifest

__all__ = [
    "IMAGE_CANDIDATE",
    "kept_gpu_data",
    "planner_channels",
    "prepare_coexec_gpu_data",
    "record_coexec_gpu_data",
]

logger = logging.getLogger(__name__)

#: The library name of the primary plan built with its GPU parts on images (its buffer build
#: is ``"coexec"``).
IMAGE_CANDIDATE = "coexec:image"


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
    ``auto`` where the device has them), so OC cuts give the GPU whole pixels; else 1."""
    images = libraries.gpu_data["data_type"] == "image" or libraries.measure_images
    return 4 if libraries.gpu_data_device == "coexec" and images else 1
