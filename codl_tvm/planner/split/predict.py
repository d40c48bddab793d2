"""The CoDL split planner's predictions: one cost model's latencies for one module's operators.

Owns the per-operator estimates (:class:`OpEstimate`: the operator, its parameters, the
implementation each processor's build uses and its whole-operator latencies), a split's or a
chain's predicted latency (:class:`SplitEstimate`, CoDL Eq. 2), the cached
:class:`Predictor` over a cost model, the implementation choice the schedules make
(:func:`expected_impl`, :func:`covered_impls`) and the calibration every planner mode applies
(:func:`calibrated_model`).

Where the GPU parts compute on images (``PlannerConfig.images``), a GPU part pays the image
conversions at its ends (:meth:`Predictor.conversion_ms`, CoDL's hybrid data type): they are
part of its split's (or chain's) sharing cost, :attr:`SplitEstimate.conversion_ms` saying how
much.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import OpInfo, PartitionDim
from codl_tvm.cost_model.base import (
    GPU_DATA_TYPE_META,
    IMAGE_CONVERSION_KINDS,
    IMAGE_SHARING_KINDS,
    CostModel,
    SharingModel,
)
from codl_tvm.cost_model.features import OpParams, Partition, PartShape, op_features, part_shape
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.part_shapes import chain_parts
from codl_tvm.runtime.images import PIXEL_CHANNELS

__all__ = [
    "SPLIT_SHARING_KINDS",
    "OpEstimate",
    "Predictor",
    "SplitEstimate",
    "calibrated_model",
    "covered_impls",
    "expected_impl",
    "flops_model",
    "image_conversion_model",
    "on_images",
]

# The data-sharing costs a split pays at its boundaries (the cost model's unmap and postsync
# are part of these measurements' other kinds on the shipped models).
SPLIT_SHARING_KINDS = ("transform", "map", "presync")


@dataclass
class OpEstimate:
    """One operator as the planner sees it: ``params`` None (with ``problem`` saying why) when
    the cost model cannot predict it; ``impl`` the implementation predicted per processor,
    ``cpu_ms``/``gpu_ms`` the whole operator's predicted latency on each and ``novel`` why it
    lies outside the cost model's data (:meth:`~codl_tvm.planner.split.margin.Uncertainty.\
novelty`; empty inside)."""

    info: OpInfo
    params: OpParams | None
    problem: str = ""
    impl: dict[str, str] = field(default_factory=dict)
    cpu_ms: float = 0.0
    gpu_ms: float = 0.0
    novel: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class SplitEstimate:
    """A split's (or a chain's) predicted latency: ``total_ms`` is the sharing plus the slower
    processor's parts (CoDL Eq. 2); ``conversion_ms``, the part of ``sharing_ms`` that is the
    GPU part's image conversions (None: the GPU parts are on buffers)."""

    dim: str
    ratio: float
    total_ms: float
    cpu_ms: float
    gpu_ms: float
    sharing_ms: float
    conversion_ms: float | None = None


def on_images(params: OpParams, part: PartShape | None = None) -> bool:
    """Whether an operator's GPU part computes on images where the GPU parts are on images:
    a conv, dense or depthwise (:class:`~codl_tvm.passes.texture_parts.PackGpuParts`' full
    coverage) of whole pixels, and with ``part`` (the GPU's part) one of whole pixels: a conv
    or an OC part whose channel count is not a multiple of 4 stays in buffers, so it converts
    nothing."""
    if params.op != "conv2d" or params.oc % PIXEL_CHANNELS:
        # the texture layout packs only convs writing whole pixels (a padded pixel's zero
        # channels would reach every consumer)
        return False
    if not (params.groups == 1 or params.groups == params.ic == params.oc):
        return False
    return part is None or part.oc % PIXEL_CHANNELS == 0


def covered_impls(model: CostModel, op: str, proc: str) -> list[str]:
    """The implementations ``model`` has data for on operator kind ``op`` and processor
    ``proc`` (its per-implementation groups or boosters), sorted."""
    keys = getattr(model, "groups", None) or getattr(model, "boosters", None) or {}
    return sorted({k[2] for k in keys if isinstance(k, tuple) and k[:2] == (op, proc)})


def expected_impl(params: OpParams, processor: str, config=None) -> str:
    """The implementation codl-tvm's schedule rules give an operator on a processor.

    The same choice the built kernels record (``codl_tvm.cost_model.dispatch``): a conv that
    :func:`codl_tvm.schedules.winograd_reason` accepts under the processor's ``config`` (a
    :class:`~codl_tvm.schedules.CPUConfig` or ``OpenCLConfig``; None: no Winograd) is
    ``winograd`` (the build rewrites it when its weight is a constant, as in imported models);
    a CPU conv that :func:`codl_tvm.schedules.packed_reason` accepts is ``packed`` (on in no
    preset by default; the shipped cost models have no such group);
    otherwise on the CPU a depthwise conv gets the depthwise rule, a 1x1 stride-1 conv the GEMM
    rule, others the direct rule; OpenCL convs are direct; dense is a matmul, or a reduction
    (GEMV) on the GPU below ``dense_gemm_min_m`` rows (the cost-model groups of the OpenCL dense
    rule's ``gemm`` / ``gemv``); pooling is pooling. The planner predicts that kernel, never a
    faster-looking one the build would not produce. The choice is made for the whole operator;
    a co-execution part whose own shape falls below the config's thresholds (e.g. an OC part
    with fewer than ``winograd_min_channels`` channels) is built with the direct rule.
    """
    if params.op == "pool":
        return "pool"
    if params.op == "dense":
        # OpenCLDense records gemv / gemm; the cost model groups them as reduction / matmul
        # (codl_tvm.cost_model.features.IMPL_GROUPS). Deferred: the schedules package needs
        # TVM's compiler, which `import codl_tvm.planner` does not load.
        from codl_tvm.schedules.presets import OPENCL_GENERIC

        min_m = 2  # dlight: GEMV / Reduction for one row
        if getattr(config, "dense", False):
            min_m = getattr(config, "dense_gemm_min_m", None) or OPENCL_GENERIC.dense_gemm_min_m
        return "reduction" if processor == "gpu" and params.h < min_m else "matmul"
    if config is not None and params.op == "conv2d":
        # deferred: the schedules need TVM's compiler, which `import codl_tvm.planner` does
        # not load (tests/test_hope.py imports the planner on a runtime-only TVM)
        from codl_tvm.schedules.packed import packed_reason
        from codl_tvm.schedules.winograd import conv2d_shape_info, winograd_reason

        try:
            info = conv2d_shape_info(
                (1, params.ic, params.h, params.w),
                (params.oc, params.ic // max(1, params.groups), params.kernel, params.kernel),
                (params.stride, params.stride),
                params.padding,
                (params.dilation, params.dilation),
                params.groups,
            )
        except ValueError:
            info = None
        if info is not None and winograd_reason(info, config) is None:
            return "winograd"
        if info is not None and processor == "cpu" and packed_reason(info, config) is None:
            return "packed"
    if processor == "gpu":
        return "direct"
    if params.groups > 1 and params.groups == params.ic == params.oc:
        return "depthwise"
    if params.kernel == 1 and params.stride == 1 and params.groups == 1:
        return "gemm"
    return "direct"


class Predictor:
    """Cached predictions of one cost model for the operators of one module."""

    def __init__(self, model: CostModel, config: PlannerConfig):
        self.model = model
        self.config = config
        self._parts: dict[tuple, float] = {}
        self._splits: dict[tuple, SplitEstimate | None] = {}
        self._chains: dict[tuple, SplitEstimate | None] = {}

    def part_ms(self, op: OpEstimate, proc: str, partition: Partition, shape: PartShape) -> float:
        if shape.empty:
            return 0.0
        key = (op.name, proc, op.impl[proc], partition, shape)
        hit = self._parts.get(key)
        if hit is None:
            feats = op_features(op.params, proc, op.impl[proc], partition, part=shape, name=op.name)
            hit = self._parts[key] = self.model.predict(feats)
        return hit

    def whole(self, op: OpEstimate, proc: str) -> float:
        part = Partition("none", 1.0 if proc == "gpu" else 0.0)
        return self.part_ms(op, proc, part, part_shape(op.params, part, proc))

    def sharing_ms(self, nbytes: int) -> float:
        return sum(self.model.predict_sharing(k, nbytes) for k in SPLIT_SHARING_KINDS)

    def conversion_ms(
        self, ops: Sequence[OpEstimate], gpu_parts: Sequence[PartShape]
    ) -> float | None:
        """The image conversions of the GPU part of ``ops`` (one operator, or a chain's in
        order) whose parts are ``gpu_parts``: None where the GPU parts are on buffers
        (``config.images`` off); 0 where none of ``ops`` computes on images (:func:`on_images`);
        else the pack of the input of the first operator that does (the texture layout packs
        from there on: pools and elementwise operators behind it too) and the unpack of the
        last part's output, each predicted from its bytes by the cost model's ``image_pack`` /
        ``image_unpack`` kinds (0 where not measured)."""
        if not self.config.images:
            return None
        first = next(
            (s for o, s in zip(ops, gpu_parts, strict=True) if on_images(o.params, s)), None
        )
        if first is None:
            return 0.0
        last, b = gpu_parts[-1], self.config.dtype_bytes
        pack, unpack = IMAGE_SHARING_KINDS
        return self.model.predict_sharing(
            pack, b * first.in_h * first.in_w * first.ic
        ) + self.model.predict_sharing(unpack, b * last.out_h * last.out_w * last.oc)

    def whole_conversion_ms(self, op: OpEstimate) -> float | None:
        """:meth:`conversion_ms` of ``op`` run whole on the GPU."""
        return self.conversion_ms([op], [part_shape(op.params, Partition("none", 1.0), "gpu")])

    def split(self, op: OpEstimate, dim: str, ratio: float) -> SplitEstimate | None:
        """Eq. 2 of one operator split alone (None when one processor gets nothing)."""
        key = (op.name, dim, ratio)
        if key not in self._splits:
            self.prefetch_splits(op, [(dim, ratio)])
        return self._splits[key]

    def prefetch_splits(self, op: OpEstimate, candidates: Sequence[tuple[str, float]]) -> None:
        """Predict every ``(dim, ratio)`` split of ``op`` not cached yet, in one model call."""
        todo = []
        for dim, ratio in candidates:
            if (op.name, dim, ratio) in self._splits:
                continue
            partition = Partition(dim, ratio)
            if any(part_shape(op.params, partition, p).empty for p in ("cpu", "gpu")):
                self._splits[(op.name, dim, ratio)] = None
            else:
                todo.append(partition)
        if not todo:
            return
        lats = self.model.predict_coexec_many(
            op.params,
            todo,
            op.impl,
            chained=False,
            name=op.name,
            dtype_bytes=self.config.dtype_bytes,
        )
        for partition, lat in zip(todo, lats, strict=True):
            conversion = self.conversion_ms([op], [part_shape(op.params, partition, "gpu")])
            share = lat.transform_ms + lat.map_ms + lat.presync_ms + (conversion or 0.0)
            self._splits[(op.name, partition.dim, partition.ratio)] = SplitEstimate(
                partition.dim,
                partition.ratio,
                lat.total_ms + (conversion or 0.0),
                lat.cpu_ms,
                lat.gpu_ms,
                share,
                conversion,
            )

    def prefetch_parts(
        self, requests: Sequence[tuple[OpEstimate, str, Partition, PartShape]]
    ) -> None:
        """Predict the ``(op, processor, partition, part shape)`` parts not cached yet, in one
        model call (a chain candidate's parts on both processors)."""
        keys, feats = [], []
        for op, proc, partition, shape in requests:
            key = (op.name, proc, op.impl[proc], partition, shape)
            if shape.empty or key in self._parts or key in keys:
                continue
            keys.append(key)
            feats.append(
                op_features(op.params, proc, op.impl[proc], partition, part=shape, name=op.name)
            )
        if feats:
            for key, ms in zip(keys, self.model.predict_many(feats), strict=True):
                self._parts[key] = float(ms)

    def chain(self, ops: Sequence[OpEstimate], dim: str, ratio: float) -> SplitEstimate | None:
        """A chain's latency (None when a cut is empty or reads only padding)."""
        key = (tuple(o.name for o in ops), dim, ratio)
        if key in self._chains:
            return self._chains[key]
        result = None
        try:
            parts = chain_parts(
                [o.info for o in ops], [o.params for o in ops], PartitionDim(dim), ratio
            )
        except ValueError:
            parts = None
        if parts is not None and parts.gpu is not None and parts.cpu is not None:
            partition = Partition(dim, ratio)
            self.prefetch_parts(
                [
                    (o, proc, partition, shape)
                    for proc, shapes in (("cpu", parts.cpu), ("gpu", parts.gpu))
                    for o, shape in zip(ops, shapes, strict=True)
                ]
            )
            sums = {}
            for proc, shapes in (("cpu", parts.cpu), ("gpu", parts.gpu)):
                sums[proc] = sum(
                    self.part_ms(o, proc, partition, s) for o, s in zip(ops, shapes, strict=True)
                )
            first, last = parts.cpu[0], parts.cpu[-1]
            nbytes = self.config.dtype_bytes * (
                first.in_h * first.in_w * first.ic + last.out_h * last.out_w * last.oc
            )
            # a chain's GPU part converts at its ends only
            conversion = self.conversion_ms(ops, parts.gpu)
            share = self.sharing_ms(nbytes) + (conversion or 0.0)
            total = share + max(sums["cpu"], sums["gpu"])
            result = SplitEstimate(dim, ratio, total, sums["cpu"], sums["gpu"], share, conversion)
        self._chains[key] = result
        return result


def flops_model(model: CostModel) -> CostModel:
    """``model``'s FLOPs-linear model (itself, or its embedded fallback): what the uLayer-like
    baseline chooses its splits with.

    Raises
    ------
    PlannerError
        ``model`` is not FLOPs-linear and embeds no FLOPs fallback.
    """
    if model.kind == "flops":
        return model
    if model.fallback is not None and model.fallback.kind == "flops":
        return model.fallback
    raise PlannerError(
        f"ulayer_like needs a FLOPs-linear model: the {model.kind} cost model has no embedded "
        "FLOPs fallback (fit it with CostModel.fit, which adds one)"
    )


def calibrated_model(cost_model: CostModel, config: PlannerConfig) -> tuple[CostModel, list[str]]:
    """``cost_model`` with ``config``'s processor scales and weight-streaming floors applied,
    its tuned operators' measurements in place of predictions (``config.tuned_parts``), and the
    report notes that say so (shared by every planner mode)."""
    notes: list[str] = []
    if tuple(config.processor_scale) != (1.0, 1.0):
        cpu_scale, gpu_scale = config.processor_scale
        try:
            cost_model = cost_model.scaled(cpu=cpu_scale, gpu=gpu_scale)
        except ValueError as exc:
            raise PlannerError(f"PlannerConfig.processor_scale: {exc}") from None
        notes.append(
            f"predictions calibrated: CPU x{cpu_scale:.3g}, GPU x{gpu_scale:.3g} (measured / "
            "predicted latency of the model on each processor alone)"
        )
    if config.weight_gbps is not None:  # checked by PlannerConfig
        cost_model = cost_model.streaming(*config.weight_gbps)
        notes.append(
            f"parts predicted no faster than their weights stream: CPU "
            f"{config.weight_gbps[0]:g} GB/s, GPU {config.weight_gbps[1]:g} GB/s"
        )
    if config.tuned_parts is not None:
        # after the calibrations: a measurement on the target needs none
        cost_model = cost_model.with_measurements(config.tuned_parts)
        notes.append(
            "operators tuned on this device (--tune) are planned on their measured "
            "parts: whole, or split at a measured share, never in a chain"
        )
    if config.images:
        cost_model, note = image_conversion_model(cost_model)
        notes.append(note)
    return cost_model, notes


def image_conversion_model(cost_model: CostModel) -> tuple[CostModel, str]:
    """``cost_model`` able to predict the image conversions (the sharing kinds ``image_pack``
    and ``image_unpack``) where it can, and a report note saying where from: its own sharing
    model's kinds where it has them, else the conversion fit of its ``meta["gpu_data_type"]``
    record (``codl-tvm profile --data-type``; a shallow copy with them added, ``cost_model``
    unchanged), else none: the conversions are predicted 0 ms.

    Raises
    ------
    PlannerError
        The record's conversion fit is malformed.
    """
    sharing = cost_model.sharing
    words = "GPU parts on images pay their image conversions"
    if sharing is not None and all(k in sharing.linear for k in IMAGE_SHARING_KINDS):
        return cost_model, f"{words} ({_describe_conversion(sharing)}, the cost model's)"
    record = cost_model.meta.get(GPU_DATA_TYPE_META)
    conversion = record.get("conversion") if isinstance(record, dict) else None
    if not isinstance(conversion, dict):
        return cost_model, (
            f"{words}, but the cost model has no measurement of them (codl-tvm profile "
            "--data-type measures them): predicted 0 ms"
        )
    try:
        sharing = (sharing or SharingModel()).with_conversion(conversion)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlannerError(
            f"the cost model's meta.{GPU_DATA_TYPE_META}.conversion is malformed ({exc})"
        ) from None
    model = copy.copy(cost_model)
    model.sharing = sharing
    return model, f"{words} ({_describe_conversion(sharing)}, profiled with --data-type)"


def _describe_conversion(sharing: SharingModel) -> str:
    """``pack 0.010 ms + 0.80 ms/MB, unpack ...``."""
    return ", ".join(
        f"{direction} {line.intercept_ms:.3f} ms + {line.ms_per_byte * 1e6:.3g} ms/MB"
        for direction, kind in IMAGE_CONVERSION_KINDS.items()
        if (line := sharing.linear.get(kind)) is not None
    )
