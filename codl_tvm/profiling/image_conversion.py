"""The image conversions of CoDL's hybrid data type, timed alone on this machine's OpenCL device.

A GPU part that computes on OpenCL images (:class:`~codl_tvm.passes.texture_parts.PackGpuParts`)
runs a conversion kernel at each end: one packs the shared NCHW float32 buffer (or the slice
of it the part reads) into an NCHW4c image, another unpacks the part's result back. The
planner charges them to the GPU parts of a plan on images, as the cost model's sharing kinds
``image_pack`` and ``image_unpack`` (:data:`~codl_tvm.cost_model.base.IMAGE_SHARING_KINDS`).

:func:`measure_conversions` times them: one GPU-alone image build (the build path of
``compile --device opencl --gpu-data-type image``) of a model with one input per size of
:data:`CONVERSION_SIZES`, each through a depthwise 1x1 conv of unit weights, which the texture
layout packs, convolves on the image and unpacks, three kernels per size; every kernel's device
time is read from its OpenCL event (:func:`codl_tvm.runtime.record_kernels`), so the
conversions are timed without the conv between them. A line ``intercept + slope * bytes`` per
direction (non-negative least squares, as the cost model fits a linear sharing kind:
:meth:`~codl_tvm.cost_model.base.SharingModel.fit_samples`) is what
:class:`ConversionTiming` records (``codl-tvm profile --data-type``'s record, its
``"conversion"``, :mod:`codl_tvm.profiling.data_type`).

Building needs TVM's compiler and the ``onnx`` package (imported inside the functions that
build); reading records needs neither.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.cache import BuildSpec, build_library
from codl_tvm.build.targets import TargetPreset
from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.base import IMAGE_CONVERSION_KINDS, SharingModel

__all__ = [
    "CONVERSION_SIZES",
    "ConversionTiming",
    "conversion_model",
    "gpu_alone_spec",
    "measure_conversions",
]

logger = logging.getLogger(__name__)

#: The NCHW tensors (channels, height, width; batch 1, float32) whose conversions are timed:
#: 64 KB, 512 KB, 2 MB and 8 MB, whole pixels of channels (no padding channel converted).
CONVERSION_SIZES: tuple[tuple[int, int, int], ...] = (
    (16, 32, 32),
    (32, 64, 64),
    (32, 128, 128),
    (128, 128, 128),
)

#: The name of the conversion kernels TVM generates (``te_layout_transform*_kernel``).
_CONVERSION_KERNEL = "layout_transform"


@dataclass(frozen=True)
class ConversionTiming:
    """The image conversions timed alone: per tensor size, the median device time of packing
    it into an image and of unpacking it back.

    Attributes
    ----------
    samples
        ``(nbytes, pack_ms, unpack_ms)`` per size (``nbytes``: the NCHW float32 buffer's).
    """

    samples: tuple[tuple[int, float, float], ...]

    def fits(self) -> dict[str, dict[str, float]]:
        """Each direction's line (``pack``, ``unpack``: ``intercept_ms``, ``ms_per_byte``,
        ``n``), fitted as the cost model fits a linear sharing kind."""
        pairs = {
            IMAGE_CONVERSION_KINDS[d]: [(s[0], s[1 + i]) for s in self.samples]
            for i, d in enumerate(("pack", "unpack"))
        }
        linear = SharingModel.fit_samples(pairs).to_json()["linear"]
        return {d: linear[kind] for d, kind in IMAGE_CONVERSION_KINDS.items()}

    def to_json(self) -> dict[str, Any]:
        """``{"pack": fit, "unpack": fit, "samples": [...]}``: a data-type record's
        ``"conversion"`` (:meth:`~codl_tvm.cost_model.base.SharingModel.with_conversion`
        reads the fits)."""
        out: dict[str, Any] = self.fits()
        out["samples"] = [{"nbytes": b, "pack_ms": p, "unpack_ms": u} for b, p, u in self.samples]
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ConversionTiming:
        """The timing :meth:`to_json` wrote (ValueError, KeyError or TypeError where not)."""
        samples = tuple(
            (int(r["nbytes"]), float(r["pack_ms"]), float(r["unpack_ms"])) for r in obj["samples"]
        )
        if not samples:
            raise ValueError("a conversion record without samples")
        return cls(samples)


def gpu_alone_spec(model: bytes, preset: TargetPreset, data_type: str) -> BuildSpec:
    """The spec of a build of the serialized ONNX ``model`` for ``preset``'s GPU alone, its
    tensors in ``data_type`` (``"buffer"`` or ``"image"``), the preset's defaults otherwise:
    what the data-type profilers build (here and :mod:`codl_tvm.profiling.data_type`)."""
    return BuildSpec(
        device="opencl",
        plan=None,
        model_sha256=hashlib.sha256(model).hexdigest(),
        preset=preset.name,
        cpu_target=str(preset.target("cpu")),
        gpu_target=str(preset.target("gpu")),
        gpu_data_type=data_type,
    )


def conversion_model(sizes: Sequence[tuple[int, int, int]]) -> Any:
    """An ONNX model (``onnx.ModelProto``) with one input per ``(channels, height, width)``
    of ``sizes``, each through a depthwise 1x1 conv of unit weights (on images: pack, conv,
    unpack)."""
    # deferred: onnx is needed only to build (never to read records)
    from onnx import TensorProto, helper

    nodes, inits, inputs, outputs = [], [], [], []
    for i, (c, h, w) in enumerate(sizes):
        shape = (1, c, h, w)
        ones = np.ones((c, 1, 1, 1), dtype="float32")
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, ones.shape, ones.ravel()))
        nodes.append(
            helper.make_node("Conv", [f"x{i}", f"w{i}"], [f"y{i}"], kernel_shape=[1, 1], group=c)
        )
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, shape))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, shape))
    graph = helper.make_graph(nodes, "conversions", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _image_vm(
    sizes: tuple[tuple[int, int, int], ...], preset: TargetPreset, folder: Path
) -> tuple[VirtualMachine, Any]:
    """Build :func:`conversion_model` of ``sizes`` for the GPU alone on images; its VM (the
    OpenCL device once per VM slot) and device."""
    # deferred: importing ONNX and the texture build need TVM's compiler
    from codl_tvm.build.texture import VM_DEVICE_SLOTS
    from codl_tvm.frontend.importer import load_onnx

    proto = conversion_model(sizes)
    spec = gpu_alone_spec(proto.SerializeToString(), preset, "image")
    path = folder / "conversions-image.so"
    build_library(path, spec, load_onnx(proto).mod, preset)
    dev = tvm.opencl(0)
    vm = VirtualMachine(tvm.runtime.load_module(str(path)), [dev] * VM_DEVICE_SLOTS)
    return vm, dev


def measure_conversions(
    sizes: Sequence[tuple[int, int, int]], rounds: int, preset: TargetPreset, folder: Path
) -> ConversionTiming:
    """Time the image conversions alone on this machine's OpenCL device (see the module
    docstring): the build runs once to warm up, then ``rounds`` times; per size, its first
    conversion kernel packs and its second unpacks; the medians are kept.

    Parameters
    ----------
    sizes
        ``(channels, height, width)`` of each NCHW tensor, channels a multiple of 4.
    rounds
        Runs timed (>= 1).
    preset
        A target preset of this machine with a GPU.
    folder
        Where the library is built.

    Raises
    ------
    ProfileError
        A size without whole pixels of channels, a build or run that fails, or a run whose
        conversion kernels are not two per size (a tensor no image of the device holds).
    """
    sizes = tuple(tuple(int(v) for v in size) for size in sizes)
    if not sizes or any(len(s) != 3 or s[0] % 4 or min(s) < 1 for s in sizes) or rounds < 1:
        raise ProfileError(
            "image conversions: sizes (channels, height, width) with channels a multiple of 4, "
            f"and rounds >= 1; got {list(sizes)}, {rounds!r}"
        )
    runtime.load()
    try:
        vm, dev = _image_vm(sizes, preset, folder)
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.standard_normal((1, *s), "float32"), dev) for s in sizes]
        vm["main"](*args)  # warm-up: kernels compiled, images allocated
    except Exception as exc:  # a device the conversions do not build or run on
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ProfileError(f"image conversions: the build failed: {first}") from exc
    runs: list[list[float]] = []
    for _ in range(rounds):
        with runtime.record_kernels() as events:
            vm["main"](*args)
        times = [e.duration_ms for e in events if _CONVERSION_KERNEL in e.name]
        if len(times) != 2 * len(sizes):
            raise ProfileError(
                f"image conversions: {len(times)} conversion kernels ran for {len(sizes)} "
                "sizes, not two each (a tensor no image of the device holds stays a buffer)"
            )
        runs.append(times)
    medians = [float(statistics.median(column)) for column in zip(*runs, strict=True)]
    samples = tuple(
        (4 * c * h * w, medians[2 * i], medians[2 * i + 1]) for i, (c, h, w) in enumerate(sizes)
    )
    for nbytes, pack, unpack in samples:
        logger.info(
            "image conversions of %d KB: pack %.4f ms, unpack %.4f ms", nbytes // 1024, pack, unpack
        )
    return ConversionTiming(samples)
