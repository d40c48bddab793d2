"""Named-field features of one partitioned operator on one processor.

Conventions (shared with the dataset format and every cost model):

- Layout NCHW with batch 1. ``OpParams.h``/``w`` are the *input* height/width; the output
  size follows from kernel, stride, padding and dilation (``out_h``/``out_w``).
- ``dense`` (matmul with weights) is described as ``h`` = rows (M), ``w`` = 1, ``ic`` = K,
  ``oc`` = N, kernel/stride 1, no padding. ``pool`` has ``ic == oc`` (channels).
- A ``Partition`` names the dimension (``"H"``: output rows, ``"OC"``: output channels, or
  ``"none"``: the processor runs the whole operator) and the GPU ratio ``rho`` in [0, 1]
  (0 = CPU only, 1 = GPU only), as in the partition plan of the co-execution passes.
- Split of an extent ``n`` by ``rho`` (``split_extent``): the GPU gets ``floor(rho * n + 0.5)``
  (round half up) rows or channels, the CPU the rest, exactly as the partitioning passes cut
  (``codl_tvm.core.geometry.split_point``). The GPU takes the *first* rows or channels. An H part
  reads its input rows plus the halo the filter needs, clamped to the input (padding rows are not
  read). Grouped convolutions are split in whole groups, depthwise ones per channel.
- ``pool`` may have ``ceil_mode`` (output size rounded up, as the passes compute it).

Nothing here measures or guesses dispatch: ``DispatchFeatures`` carries what the profiler read
from the built kernel (OpenCL work-group size and count; CPU parallel blocks, vector width,
threads); every field may be ``None`` when unknown.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from codl_tvm.core.errors import FeatureError
from codl_tvm.core.geometry import oc_granularity

__all__ = [
    "DIMS",
    "IMPL_GROUPS",
    "OP_KINDS",
    "PROCESSORS",
    "DispatchFeatures",
    "FeatureError",
    "OpFeatures",
    "OpParams",
    "PartShape",
    "Partition",
    "op_features",
    "op_flops",
    "part_shape",
    "split_extent",
    "weight_bytes",
    "weight_floor_ms",
]

OP_KINDS: tuple[str, ...] = ("conv2d", "dense", "pool")
PROCESSORS: tuple[str, ...] = ("cpu", "gpu")
DIMS: tuple[str, ...] = ("H", "OC", "none")


def _pos_int(value, what: str, ctx: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FeatureError(f"{ctx}: {what} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class OpParams:
    """Hyper-parameters of one operator (NCHW, batch 1).

    Parameters
    ----------
    op : str
        ``"conv2d"``, ``"dense"`` or ``"pool"``.
    h, w : int
        Input height and width (``dense``: rows M and 1).
    ic, oc : int
        Input and output channels (``dense``: K and N; ``pool``: equal).
    kernel : int
        Square filter/window size F.
    stride : int
        Stride S (both axes).
    padding : tuple[int, int, int, int]
        (top, left, bottom, right).
    dilation : int
        Dilation (both axes).
    groups : int
        Convolution groups (``ic`` for depthwise).
    ceil_mode : bool
        Pooling only: round the output size up.
    """

    op: str
    h: int
    w: int
    ic: int
    oc: int
    kernel: int = 1
    stride: int = 1
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: int = 1
    groups: int = 1
    ceil_mode: bool = False

    def __post_init__(self) -> None:
        if self.op not in OP_KINDS:
            raise FeatureError(f"operator kind {self.op!r} is not one of {OP_KINDS}")
        pad = self.padding
        if isinstance(pad, int) and not isinstance(pad, bool):
            pad = (pad, pad, pad, pad)
        if not isinstance(pad, tuple | list) or len(pad) != 4:
            raise FeatureError(
                f"{self.op}: padding must be 4 integers (top, left, bottom, "
                f"right), got {self.padding!r}"
            )
        object.__setattr__(self, "padding", tuple(pad))
        ctx = self.describe()
        for name in ("h", "w", "ic", "oc", "kernel", "stride", "dilation", "groups"):
            _pos_int(getattr(self, name), name, ctx)
        for p in pad:
            _pos_int(p, "padding", ctx, minimum=0)
        if self.ic % self.groups or self.oc % self.groups:
            raise FeatureError(
                f"{ctx}: groups={self.groups} must divide IC={self.ic} and OC={self.oc}"
            )
        if not isinstance(self.ceil_mode, bool) or (self.ceil_mode and self.op != "pool"):
            raise FeatureError(
                f"{ctx}: ceil_mode must be a bool and is only for pool, got {self.ceil_mode!r}"
            )
        if self.op == "pool" and self.ic != self.oc:
            raise FeatureError(f"{ctx}: pooling needs IC == OC, got IC={self.ic} OC={self.oc}")
        if self.op == "dense" and (
            self.w != 1
            or self.kernel != 1
            or self.stride != 1
            or any(pad)
            or self.dilation != 1
            or self.groups != 1
        ):
            raise FeatureError(
                f"{ctx}: dense is described with w=1, kernel=1, stride=1, no "
                "padding, dilation=1, groups=1"
            )
        if self.out_h < 1 or self.out_w < 1:
            raise FeatureError(f"{ctx}: empty output ({self.out_h}x{self.out_w})")

    @property
    def span(self) -> int:
        """Extent of the dilated filter, ``(F - 1) * dilation + 1``."""
        return (self.kernel - 1) * self.dilation + 1

    @property
    def out_h(self) -> int:
        return self._out(self.h + self.padding[0] + self.padding[2])

    @property
    def out_w(self) -> int:
        return self._out(self.w + self.padding[1] + self.padding[3])

    def _out(self, padded: int) -> int:
        if self.ceil_mode:
            return -(-(padded - self.span) // self.stride) + 1
        return (padded - self.span) // self.stride + 1

    def describe(self) -> str:
        """Short human-readable description used in error and warning messages."""
        return (
            f"{self.op}(H={self.h} W={self.w} IC={self.ic} OC={self.oc} F={self.kernel} "
            f"S={self.stride} P={list(self.padding)} "
            f"D={self.dilation} G={self.groups})"
        )

    def to_json(self) -> dict:
        out = {
            "h": self.h,
            "w": self.w,
            "ic": self.ic,
            "oc": self.oc,
            "kernel": self.kernel,
            "stride": self.stride,
            "padding": list(self.padding),
            "dilation": self.dilation,
            "groups": self.groups,
        }
        if self.ceil_mode:
            out["ceil_mode"] = True
        return out


@dataclass(frozen=True)
class Partition:
    """Partition dimension and GPU ratio ``rho`` (0 = CPU only, 1 = GPU only)."""

    dim: str = "none"
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.dim not in DIMS:
            raise FeatureError(f"partition dim {self.dim!r} is not one of {DIMS}")
        r = self.ratio
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0.0 <= r <= 1.0:
            raise FeatureError(f"partition ratio must be a number in [0, 1], got {r!r}")
        object.__setattr__(self, "ratio", float(r))

    def to_json(self) -> dict:
        return {"dim": self.dim, "ratio": self.ratio}


def split_extent(n: int, ratio: float) -> tuple[int, int]:
    """Split ``n`` rows/channels/groups into ``(gpu, cpu)``; the GPU gets ``floor(rho*n + 0.5)``."""
    gpu = min(n, max(0, math.floor(ratio * n + 0.5)))
    return gpu, n - gpu


@dataclass(frozen=True)
class PartShape:
    """The part of an operator one processor computes.

    ``out_h``/``out_w``/``oc`` are the part's output extents, ``in_h``/``in_w``/``ic`` the input
    extents it reads (H split: rows plus halo, clipped to the input), ``groups`` its group count,
    ``row0``/``oc0`` the first output row/channel of the part in the full output.
    """

    out_h: int
    out_w: int
    oc: int
    in_h: int
    in_w: int
    ic: int
    groups: int = 1
    row0: int = 0
    oc0: int = 0

    @property
    def empty(self) -> bool:
        return self.out_h == 0 or self.out_w == 0 or self.oc == 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _input_rows(params: OpParams, row0: int, rows: int) -> int:
    """Input rows that output rows ``[row0, row0 + rows)`` read (halo included, pads excluded)."""
    if rows == 0:
        return 0
    first = row0 * params.stride - params.padding[0]
    last = (row0 + rows - 1) * params.stride - params.padding[0] + params.span - 1
    return max(0, min(params.h - 1, last) - max(0, first) + 1)


def part_shape(
    params: OpParams, partition: Partition, processor: str, matmul_align: int | None = None
) -> PartShape:
    """Shape of the part ``processor`` computes under ``partition`` (see module docstring).

    ``matmul_align``: dense (matmul) OC parts are whole multiples of the largest power of two up
    to this that divides the features; default ``MATMUL_OC_ALIGN``, as ``PartitionOperators``
    cuts them. Datasets read records without a stored part with 1 (:data:`RECORD_MATMUL_ALIGN`),
    the cut they were first measured with.
    """
    if processor not in PROCESSORS:
        raise FeatureError(
            f"{params.describe()}: processor {processor!r} is not one of {PROCESSORS}"
        )
    full = PartShape(
        params.out_h, params.out_w, params.oc, params.h, params.w, params.ic, params.groups
    )
    if partition.dim == "none":
        return full
    on_gpu = processor == "gpu"
    if partition.dim == "H":
        gpu, cpu = split_extent(params.out_h, partition.ratio)
        row0, rows = (0, gpu) if on_gpu else (gpu, cpu)
        return PartShape(
            rows,
            params.out_w,
            params.oc,
            _input_rows(params, row0, rows),
            params.w,
            params.ic,
            params.groups,
            row0=row0,
        )
    # OC split.
    if params.op == "pool" or (params.groups > 1 and params.groups == params.ic == params.oc):
        # Channel-wise ops: the input channels follow the output channels.
        gpu, cpu = split_extent(params.oc, partition.ratio)
        oc0, oc = (0, gpu) if on_gpu else (gpu, cpu)
        return PartShape(
            params.out_h,
            params.out_w,
            oc,
            params.h,
            params.w,
            oc,
            oc if params.groups > 1 else 1,
            oc0=oc0,
        )
    if params.groups > 1:
        gpu, cpu = split_extent(params.groups, partition.ratio)
        g0, g = (0, gpu) if on_gpu else (gpu, cpu)
        opg, ipg = params.oc // params.groups, params.ic // params.groups
        return PartShape(
            params.out_h, params.out_w, g * opg, params.h, params.w, g * ipg, g, oc0=g0 * opg
        )
    # matmul parts are whole vectors of features, as PartitionOperators cuts them
    unit = oc_granularity(params.oc, 1, params.op == "dense", matmul_align)
    gpu, cpu = (unit * n for n in split_extent(params.oc // unit, partition.ratio))
    oc0, oc = (0, gpu) if on_gpu else (gpu, cpu)
    return PartShape(params.out_h, params.out_w, oc, params.h, params.w, params.ic, 1, oc0=oc0)


#: The ``matmul_align`` of a dataset record's default part (a record stores its part only where
#: it differs): the unaligned cut that the first datasets (before the build aligned matmul cuts)
#: were measured with.
RECORD_MATMUL_ALIGN = 1


def op_flops(op: str, part: PartShape, kernel: int) -> float:
    """Floating-point operations of a part (multiply-add = 2; pooling: one per window element)."""
    out = part.out_h * part.out_w * part.oc
    if op == "pool":
        return float(out * kernel * kernel)
    return 2.0 * out * (part.ic // max(part.groups, 1)) * kernel * kernel


def weight_bytes(op: str, part: PartShape, kernel: int, dtype_bytes: int = 4) -> int:
    """Bytes of the weights a part reads (its output channels' filters; 0 for pooling)."""
    if op == "pool":
        return 0
    return part.oc * (part.ic // max(part.groups, 1)) * kernel * kernel * dtype_bytes


def weight_floor_ms(nbytes: float, gbps: float) -> float:
    """Milliseconds to stream ``nbytes`` of weights at ``gbps`` GB/s (1e-6 ms per byte at
    1 GB/s): the least a part can take inside a model (:meth:`CostModel.streaming`)."""
    return nbytes / (gbps * 1e6)


@dataclass(frozen=True)
class DispatchFeatures:
    """What the built kernel really does; ``None`` where the profiler could not read it.

    Parameters
    ----------
    wg_size : int | None
        OpenCL work-group size (product of the local sizes) of the main kernel.
    wg_count : int | None
        Number of work-groups of the main kernel (product of global / local).
    cpu_parallel_blocks : int | None
        Iterations of the outermost parallel loop of the CPU kernel.
    vector_width : int | None
        SIMD lanes of the CPU kernel's vectorized loop (fp32 lanes).
    threads : int | None
        Threads of the CPU thread pool that ran the kernel.
    num_kernels : int | None
        Kernels launched for this operator (e.g. 3 for Winograd).
    """

    wg_size: int | None = None
    wg_count: int | None = None
    cpu_parallel_blocks: int | None = None
    vector_width: int | None = None
    threads: int | None = None
    num_kernels: int | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                _pos_int(value, f.name, "dispatch features")

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class OpFeatures:
    """Everything a cost model may use to predict one part's latency on one processor."""

    op: str
    processor: str
    impl: str
    params: OpParams
    partition: Partition
    part: PartShape
    flops: float
    dispatch: DispatchFeatures = field(default_factory=DispatchFeatures)
    name: str | None = None

    def describe(self) -> str:
        """Names the operator for messages: name, shape, processor, implementation."""
        label = f"{self.name!r} " if self.name else ""
        return (
            f"{label}{self.params.describe()} on {self.processor} impl {self.impl!r} "
            f"partition {self.partition.dim}:{self.partition.ratio:g}"
        )

    def numeric(self) -> dict[str, float]:
        """Named numeric features (NaN for unknown dispatch features), e.g. for GBDT."""
        p, q, d = self.params, self.part, self.dispatch
        nan = float("nan")

        def opt(v):
            return nan if v is None else float(v)

        return {
            "h": float(p.h),
            "w": float(p.w),
            "ic": float(p.ic),
            "oc": float(p.oc),
            "kernel": float(p.kernel),
            "stride": float(p.stride),
            "pad_h": float(p.padding[0] + p.padding[2]),
            "pad_w": float(p.padding[1] + p.padding[3]),
            "dilation": float(p.dilation),
            "groups": float(p.groups),
            "dim_h": 1.0 if self.partition.dim == "H" else 0.0,
            "dim_oc": 1.0 if self.partition.dim == "OC" else 0.0,
            "ratio": self.partition.ratio,
            "part_out_h": float(q.out_h),
            "part_out_w": float(q.out_w),
            "part_oc": float(q.oc),
            "part_in_h": float(q.in_h),
            "part_ic": float(q.ic),
            "part_groups": float(q.groups),
            "flops": float(self.flops),
            "wg_size": opt(d.wg_size),
            "wg_count": opt(d.wg_count),
            "cpu_parallel_blocks": opt(d.cpu_parallel_blocks),
            "vector_width": opt(d.vector_width),
            "threads": opt(d.threads),
            "num_kernels": opt(d.num_kernels),
        }


#: Kernel algorithms (``codl.algorithm``) that share a cost-model group with an older name: the
#: OpenCL dense rule's ``gemv`` / ``gemm`` kernels replaced dlight's reduction / matmul ones
#: that the shipped models were trained on. Keys are (operator kind, processor, recorded name).
IMPL_GROUPS: dict[tuple[str, str, str], str] = {
    ("dense", "gpu", "gemv"): "reduction",
    ("dense", "gpu", "gemm"): "matmul",
}


def impl_group(op: str, processor: str, impl: str) -> str:
    """The cost-model group of an implementation name (itself unless :data:`IMPL_GROUPS` maps
    it)."""
    return IMPL_GROUPS.get((op, processor, impl), impl)


def op_features(
    params: OpParams,
    processor: str,
    impl: str,
    partition: Partition | None = None,
    dispatch: DispatchFeatures | None = None,
    part: PartShape | None = None,
    name: str | None = None,
) -> OpFeatures:
    """Features of the part of ``params`` that ``processor`` runs with ``impl``.

    ``part`` overrides the split convention (the profiler records the shape it really built).
    """
    partition = partition or Partition()
    if not isinstance(impl, str) or not impl:
        raise FeatureError(
            f"{params.describe()}: implementation must be a non-empty string, got {impl!r}"
        )
    impl = impl_group(params.op, processor, impl)
    if part is None:
        part = part_shape(params, partition, processor)
    elif processor not in PROCESSORS:
        raise FeatureError(
            f"{params.describe()}: processor {processor!r} is not one of {PROCESSORS}"
        )
    return OpFeatures(
        params.op,
        processor,
        impl,
        params,
        partition,
        part,
        op_flops(params.op, part, params.kernel),
        dispatch or DispatchFeatures(),
        name,
    )
