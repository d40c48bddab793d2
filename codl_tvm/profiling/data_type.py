"""The GPU data type of a device, chosen by measuring common operators, as CoDL chooses it.

CoDL profiles common operators on each device and keeps the GPU's tensors in OpenCL images
where those are faster than buffers. :func:`profile_data_type` does that on this machine's
OpenCL device: each operator of :data:`OPERATORS` (3x3, 1x1 and depthwise convs with their
bias and ReLU, a conv with a max pool, at typical mobile-CNN shapes) is built for the GPU
alone twice, with buffers and with images (:func:`codl_tvm.build.cache.build_library`, the
build path of ``compile --device opencl``), the image build's output is checked against the
buffer build's, and the builds are timed round-robin (each build once per round, so drift
favours none; the median of the rounds is kept). An image build's time includes its layout
conversions at the operator's ends, which a whole model pays only at its chains' ends: the
measurement leans towards buffers. :func:`choose_data_type` is the rule: images only where
their geometric-mean time over the operators is clearly below the buffers'
(:data:`IMAGE_THRESHOLD`). A device without image support gets buffers, with the reason, and
nothing is built.

Where images are timed, the conversions between the two layouts are timed alone too
(:func:`codl_tvm.profiling.image_conversion.measure_conversions`: packing an NCHW float32
buffer into an NCHW4c image and unpacking it back, at a few sizes, a line fitted to each
direction): the record's ``"conversion"``, which the planner charges to the GPU parts of a
plan on images (:func:`codl_tvm.planner.split.predict.calibrated_model`).

The result, a :class:`DataTypeRecord`, goes into a copy of a cost model file, as its
``meta["gpu_data_type"]`` beside ``meta["device"]`` (:func:`write_with_record`), or a file of
its own (:func:`write_record`); a compile whose cost model carries one measured on its device
builds with that data type (:func:`codl_tvm.objectives.gpu_data.prepare_gpu_data`).

Building needs TVM's compiler and the ``onnx`` package (imported inside the functions that
build); reading and writing records needs neither.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm import runtime
from codl_tvm.build.cache import build_library
from codl_tvm.build.targets import TargetPreset, cpu_record, get_preset
from codl_tvm.core.errors import ModelFileError, ProfileError
from codl_tvm.cost_model.base import GPU_DATA_TYPE_META, CostModel
from codl_tvm.cost_model.fitted_device import describe_device, local_device
from codl_tvm.profiling.image_conversion import (
    CONVERSION_SIZES,
    ConversionTiming,
    gpu_alone_spec,
    measure_conversions,
)
from codl_tvm.profiling.timing import TimingConfig, runs_per_sample
from codl_tvm.runtime.cpu_features import missing_cpu_features
from codl_tvm.runtime.images import image_caps

__all__ = [
    "DEFAULT_ROUNDS",
    "IMAGE_THRESHOLD",
    "META_KEY",
    "OPERATORS",
    "ConversionTiming",
    "DataTypeOp",
    "DataTypeRecord",
    "OperatorTiming",
    "choose_data_type",
    "operators_named",
    "profile_data_type",
    "write_record",
    "write_with_record",
]

logger = logging.getLogger(__name__)

#: The key of the record in a cost model file's ``meta``.
META_KEY = GPU_DATA_TYPE_META

#: Images are chosen only where their geometric-mean time over the operators is below this
#: fraction of the buffers': a tie (within the run-to-run noise of a few percent) keeps
#: buffers, the layout every build supports.
IMAGE_THRESHOLD = 0.95

#: Rounds of timing: each round times every build once (the median of the rounds is kept).
DEFAULT_ROUNDS = 5

#: The record's format version.
RECORD_VERSION = 1

#: An image build whose output differs from the buffer build's by more than this (relative to
#: the output's largest magnitude) is dropped: a wrong kernel is not a faster one.
_MAX_RELATIVE_ERROR = 1e-3

#: How each timed sample is sized: enough runs to last 2 ms (as the part profiler's default).
_TIMING = TimingConfig()


@dataclass(frozen=True)
class DataTypeOp:
    """One operator the data-type profile builds: a conv (with bias and ReLU), a depthwise
    conv (likewise), or a conv followed by a 2x2 max pool of stride 2 (``"conv_pool"``: a
    pool computes on images only behind a producer that does,
    :class:`~codl_tvm.passes.texture_layout.ToTextureLayout`), on a square NCHW input of
    batch 1.

    Attributes
    ----------
    name
        The operator's name in the record.
    kind
        ``"conv"``, ``"depthwise"`` or ``"conv_pool"``.
    channels, size
        Input channels and height (= width).
    out_channels
        Output channels of a ``"conv"`` (the others keep ``channels``).
    kernel, stride
        The conv's window and stride (its padding keeps ``size / stride``).
    """

    name: str
    kind: str
    channels: int
    size: int
    out_channels: int = 0
    kernel: int = 3
    stride: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("conv", "depthwise", "conv_pool"):
            raise ValueError(f"DataTypeOp.kind: conv, depthwise or conv_pool, not {self.kind!r}")

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        """The NCHW input shape."""
        return (1, self.channels, self.size, self.size)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """The NCHW output shape."""
        out = self.out_channels if self.kind == "conv" else self.channels
        pad = self.kernel // 2
        side = (self.size + 2 * pad - self.kernel) // self.stride + 1
        side = side // 2 if self.kind == "conv_pool" else side
        return (1, out, side, side)

    def describe(self) -> str:
        """``conv 3x3/1 32->32 @56x56``."""
        out = self.out_channels if self.kind == "conv" else self.channels
        k = f"{self.kernel}x{self.kernel}/{self.stride}"
        kind = "conv" if self.kind == "conv_pool" else self.kind
        pool = " + maxpool 2x2/2" if self.kind == "conv_pool" else ""
        return f"{kind} {k}{pool} {self.channels}->{out} @{self.size}x{self.size}"

    def onnx_model(self, seed: int = 0):
        """The operator as an ONNX model (``onnx.ModelProto``; seeded weights)."""
        # deferred: onnx is needed only to build the operators (never to read records)
        from onnx import TensorProto, helper

        rng = np.random.default_rng(seed)
        pad = self.kernel // 2
        group = self.channels if self.kind == "depthwise" else 1
        out = self.out_channels if self.kind == "conv" else self.channels
        w = rng.standard_normal((out, self.channels // group, self.kernel, self.kernel))
        w /= math.sqrt(w[0].size)
        inits = []
        for name, value in (("w", w), ("b", rng.standard_normal(out))):
            value = value.astype("float32")
            inits.append(helper.make_tensor(name, TensorProto.FLOAT, value.shape, value.ravel()))
        conv = helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            kernel_shape=[self.kernel] * 2,
            strides=[self.stride] * 2,
            pads=[pad] * 4,
            group=group,
        )
        pooled = self.kind == "conv_pool"
        nodes = [conv, helper.make_node("Relu", ["c"], ["r" if pooled else "y"])]
        if pooled:
            nodes.append(
                helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
            )
        graph = helper.make_graph(
            nodes,
            self.name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, self.input_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, self.output_shape)],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        return model


#: The operators of the data-type profile: the common layers of mobile CNNs at a couple of
#: typical shapes each (kept small: two builds per operator).
OPERATORS: tuple[DataTypeOp, ...] = (
    DataTypeOp("conv3x3", "conv", 32, 56, 32),
    DataTypeOp("conv3x3_s2", "conv", 64, 28, 128, stride=2),
    DataTypeOp("conv1x1", "conv", 64, 28, 64, kernel=1),
    DataTypeOp("conv1x1_deep", "conv", 256, 14, 256, kernel=1),
    DataTypeOp("depthwise3x3", "depthwise", 64, 56),
    DataTypeOp("depthwise3x3_s2", "depthwise", 128, 28, stride=2),
    DataTypeOp("conv3x3_pool", "conv_pool", 32, 56),
)


def operators_named(names: Sequence[str]) -> tuple[DataTypeOp, ...]:
    """The operators of :data:`OPERATORS` called ``names``, in that order.

    Raises
    ------
    ProfileError
        A name that is not one of them (the message lists them).
    """
    known = {op.name: op for op in OPERATORS}
    bad = [n for n in names if n not in known]
    if bad or not names:
        got = ", ".join(names) or "none"
        raise ProfileError(f"data-type operators must be among {', '.join(known)}; got {got}")
    return tuple(known[n] for n in names)


@dataclass(frozen=True)
class OperatorTiming:
    """One operator's medians: ``image_ms`` None where its image build was dropped
    (``dropped`` says why)."""

    name: str
    op: str
    buffer_ms: float
    image_ms: float | None
    dropped: str | None = None

    @property
    def ratio(self) -> float | None:
        """Image time over buffer time (None without an image time)."""
        return None if self.image_ms is None else self.image_ms / self.buffer_ms

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "op": self.op, "buffer_ms": self.buffer_ms}
        out["image_ms"] = self.image_ms
        out["ratio"] = self.ratio
        if self.dropped:
            out["dropped"] = self.dropped
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> OperatorTiming:
        image = obj.get("image_ms")
        return cls(
            str(obj["name"]),
            str(obj.get("op", "")),
            float(obj["buffer_ms"]),
            None if image is None else float(image),
            obj.get("dropped"),
        )


def choose_data_type(
    timings: Sequence[OperatorTiming], threshold: float = IMAGE_THRESHOLD
) -> tuple[str, float | None, str]:
    """The rule: ``(data_type, ratio, reason)`` for the operators' medians.

    ``ratio`` is the geometric mean of each operator's image/buffer time over the operators
    with both (None: none has both); ``"image"`` where it is below ``threshold``, else
    ``"buffer"``. ``reason`` says so in words.
    """
    ratios = [t.ratio for t in timings if t.ratio is not None and t.ratio > 0]
    if not ratios:
        return "buffer", None, "no operator's image build could be timed: buffers"
    ratio = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    words = f"images {ratio:.2f}x the buffers' time (geometric mean of {len(ratios)} operators)"
    if ratio < threshold:
        return "image", ratio, f"{words}, below {threshold:g}: images"
    return "buffer", ratio, f"{words}, not below {threshold:g}: buffers"


@dataclass(frozen=True)
class DataTypeRecord:
    """What :func:`profile_data_type` measured and chose (``meta["gpu_data_type"]``).

    Attributes
    ----------
    data_type
        ``"image"`` or ``"buffer"``.
    reason
        Why, in words.
    device
        The OpenCL device it was measured on (:func:`~codl_tvm.cost_model.fitted_device.
        local_device`'s keys, the CPU's threads left out: they do not move the GPU's choice).
    ratio
        Geometric-mean image/buffer time (None where nothing was timed).
    threshold
        The ratio images had to be below.
    operators
        Each operator's medians.
    rounds
        Rounds of timing.
    conversion
        The image conversions timed alone (None: not timed, a device without images or a
        conversion build that failed).
    """

    data_type: str
    reason: str
    device: dict[str, Any]
    ratio: float | None = None
    threshold: float = IMAGE_THRESHOLD
    operators: tuple[OperatorTiming, ...] = ()
    rounds: int = 0
    conversion: ConversionTiming | None = None
    version: int = field(default=RECORD_VERSION)

    def describe_device(self) -> str:
        """The device in one line (:func:`~codl_tvm.cost_model.fitted_device.describe_device`)."""
        return describe_device(self.device)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "data_type": self.data_type,
            "reason": self.reason,
            "ratio": self.ratio,
            "threshold": self.threshold,
            "device": dict(self.device),
            "device_description": self.describe_device(),
            "rounds": self.rounds,
            "operators": [t.to_json() for t in self.operators],
            **({} if self.conversion is None else {"conversion": self.conversion.to_json()}),
        }

    @classmethod
    def from_json(cls, obj: Any, source: str = "<record>") -> DataTypeRecord:
        """The record of ``obj`` (raises :class:`~codl_tvm.core.errors.ModelFileError` naming
        ``source`` where it is not one)."""
        try:
            if obj.get("version") != RECORD_VERSION:
                raise ValueError(f"version {obj.get('version')!r}, not {RECORD_VERSION}")
            if obj["data_type"] not in ("image", "buffer") or not isinstance(obj["device"], dict):
                raise ValueError("data_type must be image or buffer, with a device")
            ratio = obj.get("ratio")
            return cls(
                obj["data_type"],
                str(obj.get("reason", "")),
                dict(obj["device"]),
                None if ratio is None else float(ratio),
                float(obj.get("threshold", IMAGE_THRESHOLD)),
                tuple(OperatorTiming.from_json(t) for t in obj.get("operators", ())),
                int(obj.get("rounds", 0)),
                None
                if obj.get("conversion") is None
                else ConversionTiming.from_json(obj["conversion"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ModelFileError(f"{source}: not a GPU data-type record ({what})") from None


def profile_data_type(
    operators: Sequence[DataTypeOp] = OPERATORS,
    rounds: int = DEFAULT_ROUNDS,
    preset: str | TargetPreset = "opencl",
    work_dir: str | Path | None = None,
    conversion_sizes: Sequence[tuple[int, int, int]] = CONVERSION_SIZES,
) -> DataTypeRecord:
    """Measure buffers against images for ``operators`` on this machine's OpenCL device (the
    one the runtime selects: ``CODL_OPENCL_PLATFORM``, ``CODL_OPENCL_DEVICE``) and choose;
    time the image conversions alone at ``conversion_sizes``
    (:func:`~codl_tvm.profiling.image_conversion.measure_conversions`).

    Parameters
    ----------
    operators
        The operators to build and time (default :data:`OPERATORS`).
    rounds
        Rounds of timing (each times every build once; the median is kept).
    preset
        A target preset of this machine with a GPU (``opencl``, ``pocl``).
    work_dir
        Where the libraries are built (default: a temporary folder, removed).
    conversion_sizes
        The NCHW ``(channels, height, width)`` tensors whose conversions are timed (default
        :data:`~codl_tvm.profiling.image_conversion.CONVERSION_SIZES`; empty: none, the
        record has no ``"conversion"``).

    Returns
    -------
    DataTypeRecord
        Each operator's medians, the choice (:func:`choose_data_type`) and the conversions'
        medians and fits; on a device without images, ``"buffer"`` and why, nothing built.

    Raises
    ------
    ProfileError
        ``preset`` cross-compiles, this machine has no usable OpenCL device, ``rounds`` < 1,
        or a buffer build fails.
    """
    preset_obj = get_preset(preset)
    if preset_obj.is_cross or not preset_obj.has_gpu:
        what = "cross-compiles for another device" if preset_obj.is_cross else "has no GPU"
        raise ProfileError(
            f"the GPU data type is measured on this machine's OpenCL device, but preset "
            f"{preset_obj.name!r} {what} (use opencl or pocl)"
        )
    arch, missing_features = missing_cpu_features(cpu_record(preset_obj.target("cpu")))
    if arch is not None or missing_features:
        what = f"this machine is {arch}" if arch else f"it lacks {', '.join(missing_features)}"
        raise ProfileError(
            f"preset {preset_obj.name!r} builds for another CPU than this machine's ({what}); "
            "the GPU data type is measured with a preset of this machine (opencl, pocl)"
        )
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ProfileError(f"rounds must be a whole number >= 1, got {rounds!r}")
    here = local_device()
    if here is None:
        raise ProfileError(
            "the GPU data type is measured on this machine's OpenCL device, and it has none "
            "usable (`codl-tvm info` says why)"
        )
    device = {k: v for k, v in here.items() if k != "cpu_threads"}
    # deferred: the texture module needs TVM's compiler
    from codl_tvm.build.texture import missing_image_support

    missing = missing_image_support(image_caps())
    if missing:
        logger.info("GPU data type: buffers (%s)", missing)
        return DataTypeRecord("buffer", f"{missing}: buffers", device)
    with tempfile.TemporaryDirectory(prefix="codl-data-type-") as tmp:
        folder = Path(work_dir) if work_dir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        timings = _measure(tuple(operators), rounds, preset_obj, folder)
        conversion = None
        if conversion_sizes:
            try:
                conversion = measure_conversions(conversion_sizes, rounds, preset_obj, folder)
            except ProfileError as exc:  # the choice stands without them
                logger.warning("GPU data type: image conversions not timed: %s", exc)
    data_type, ratio, reason = choose_data_type(timings)
    record = DataTypeRecord(
        data_type, reason, device, ratio, IMAGE_THRESHOLD, timings, rounds, conversion
    )
    logger.info("GPU data type on %s: %s", record.describe_device(), reason)
    return record


def _build(op: DataTypeOp, data_type: str, preset: TargetPreset, folder: Path) -> Path:
    """Build ``op`` for the GPU alone on ``data_type`` tensors; its library's path."""
    # deferred: importing ONNX needs TVM's compiler
    from codl_tvm.frontend.importer import load_onnx

    proto = op.onnx_model()
    spec = gpu_alone_spec(proto.SerializeToString(), preset, data_type)
    path = folder / f"{op.name}-{data_type}.so"
    build_library(path, spec, load_onnx(proto).mod, preset)
    return path


def _vm(path: Path, data_type: str) -> tuple[VirtualMachine, Any]:
    """The VM of a built library: an image build gets the OpenCL device once per VM slot."""
    # deferred: the texture module needs TVM's compiler
    from codl_tvm.build.texture import VM_DEVICE_SLOTS

    dev = tvm.opencl(0)
    slots = VM_DEVICE_SLOTS if data_type == "image" else 1
    return VirtualMachine(tvm.runtime.load_module(str(path)), [dev] * slots), dev


def _measure(
    operators: tuple[DataTypeOp, ...], rounds: int, preset: TargetPreset, folder: Path
) -> tuple[OperatorTiming, ...]:
    """Build every operator both ways, check the images' outputs, time round-robin."""
    runtime.load()
    builds: dict[tuple[str, str], tuple[VirtualMachine, Any, list, int]] = {}
    dropped: dict[str, str] = {}
    for i, op in enumerate(operators):
        x = np.random.default_rng(i).standard_normal(op.input_shape).astype("float32")
        for data_type in ("buffer", "image"):
            try:
                vm, dev = _vm(_build(op, data_type, preset, folder), data_type)
                args = [tvm.runtime.tensor(x, dev)]
                out = vm["main"](*args).numpy()
            except Exception as exc:  # an operator images do not build or run: buffers can
                if data_type == "buffer":
                    raise ProfileError(f"{op.name} ({op.describe()}) on buffers: {exc}") from exc
                dropped[op.name] = f"its image build failed: {str(exc).splitlines()[0][:200]}"
                continue
            if data_type == "buffer":
                reference = out
            else:
                error = float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-6))
                if error > _MAX_RELATIVE_ERROR:
                    dropped[op.name] = f"its image output differs from the buffers' by {error:.2g}"
                    continue
            # one sample sizes the others (enough runs to last TimingConfig's min_repeat_ms)
            probe = vm.time_evaluator("main", dev, number=1, repeat=1)(*args)
            number = runs_per_sample(float(probe.results[0]) * 1e3, _TIMING)
            builds[op.name, data_type] = (vm, dev, args, number)
    for name, why in dropped.items():
        logger.warning("GPU data type: %s: %s; only its buffers are timed", name, why)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in builds}
    for _ in range(rounds):  # round-robin: each build once per round
        for key, (vm, dev, args, number) in builds.items():
            res = vm.time_evaluator("main", dev, number=number, repeat=1)(*args)
            samples[key].append(float(res.results[0]) * 1e3)
    timings = []
    for op in operators:
        image = samples.get((op.name, "image"))
        timings.append(
            OperatorTiming(
                op.name,
                op.describe(),
                float(statistics.median(samples[op.name, "buffer"])),
                None if image is None else float(statistics.median(image)),
                dropped.get(op.name),
            )
        )
    return tuple(timings)


def _refuse_existing(out: Path) -> None:
    if out.exists():
        raise ProfileError(f"{out} exists; give a new file (the record never overwrites one)")


def _write_json(out: Path, obj: Any) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n", "utf-8")
    os.replace(tmp, out)


def write_record(record: DataTypeRecord, out: str | Path) -> Path:
    """Write ``record`` as a JSON file of its own at ``out`` (a new file).

    Raises
    ------
    ProfileError
        ``out`` exists.
    """
    out = Path(out)
    _refuse_existing(out)
    _write_json(out, record.to_json())
    return out


def write_with_record(cost_model: str | Path, record: DataTypeRecord, out: str | Path) -> Path:
    """Copy the cost model file ``cost_model`` to ``out`` (a new file) with ``record`` in its
    ``meta["gpu_data_type"]``; nothing else of the file changes, and ``cost_model`` is never
    written.

    Raises
    ------
    ProfileError
        ``out`` exists.
    ModelFileError
        ``cost_model`` is not a readable cost model file.
    """
    out = Path(out)
    _refuse_existing(out)
    obj = _cost_model_json(Path(cost_model))
    obj.setdefault("meta", {})[META_KEY] = record.to_json()
    _write_json(out, obj)
    return out


def _cost_model_json(path: Path) -> dict[str, Any]:
    """The JSON of the cost model file at ``path``, checked to be one (the file as written,
    not re-serialised from the loaded model, so the fitted model stays byte for byte)."""
    CostModel.load(path)  # raises ModelFileError naming the file
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: cannot read the cost model file ({exc})") from None
