"""From partitionable operators to cost-model inputs: operator parameters and part shapes.

Single operators follow the cost model's split convention (``features.part_shape``, the same cut
as the partitioning passes). Chains use the passes' own halo geometry
(:func:`codl_tvm.core.geometry.chain_row_spans` /
:func:`~codl_tvm.core.geometry.chain_channel_spans`):
each processor's rows (or channels) of the chain's last output are walked backwards through the
chain, so the input rows of every earlier operator grow by its halo (CoDL Eq. 1 and Fig. 12) and
each operator's part is predicted with its enlarged shape.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from codl_tvm.core.geometry import (
    ChannelMap,
    SlidingWindow,
    Span,
    chain_channel_spans,
    chain_row_spans,
    oc_granularity,
    split_point,
)
from codl_tvm.core.plan import OpInfo, PartitionDim
from codl_tvm.cost_model.features import FeatureError, OpParams, PartShape

__all__ = ["ChainParts", "chain_parts", "op_params"]


def op_params(info: OpInfo) -> OpParams:
    """The cost model's description (``OpParams``) of a partitionable operator.

    Raises
    ------
    FeatureError
        When the operator has no static shape, a batch other than 1, or a non-square
        kernel/stride/dilation (the cost model describes square windows only); the message names
        the operator and the value.
    """
    where = f"{info.name} ({info.kind}, input {info.input_shape})"
    if not info.input_shape or not info.output_shape:
        raise FeatureError(f"{where}: shapes are not static")
    a = info.attrs
    if info.kind == "matmul":
        w = info.weight_shape or ()
        if len(w) != 2:
            raise FeatureError(f"{where}: weight shape {w} is not (K, N)")
        rows = math.prod(info.input_shape[:-1])
        return OpParams("dense", rows, 1, int(w[0]), int(w[1]))
    if len(info.input_shape) != 4 or info.input_shape[0] != 1:
        raise FeatureError(f"{where}: needs an NCHW input with batch 1")

    def square(name: str, values) -> int:
        if len(set(values)) != 1:
            raise FeatureError(f"{where}: {name} {list(values)} is not square")
        return int(values[0])

    _, c, h, w = info.input_shape
    stride = square("strides", a["strides"])
    dilation = square("dilation", a["dilation"])
    pad = tuple(int(p) for p in a["padding"])
    if info.kind == "conv2d":
        oc, _, kh, kw = info.weight_shape
        kernel = square("kernel", (kh, kw))
        return OpParams("conv2d", h, w, c, int(oc), kernel, stride, pad, dilation, int(a["groups"]))
    kernel = square("pool_size", a["pool_size"])
    return OpParams(
        "pool", h, w, c, c, kernel, stride, pad, dilation, ceil_mode=bool(a["ceil_mode"])
    )


def _window(info: OpInfo) -> SlidingWindow:
    a = info.attrs
    kernel = info.weight_shape[2] if info.kind == "conv2d" else a["pool_size"][0]
    pad = a["padding"]
    return SlidingWindow(
        info.input_shape[2],
        int(kernel),
        int(a["strides"][0]),
        int(a["dilation"][0]),
        int(pad[0]),
        int(pad[2]),
        bool(a.get("ceil_mode", False)),
    )


def _channel_map(info: OpInfo) -> ChannelMap | None:
    if info.kind == "conv2d":
        return ChannelMap(info.input_shape[1], info.weight_shape[0], int(info.attrs["groups"]))
    if info.kind == "matmul":
        return ChannelMap(info.input_shape[-1], info.output_shape[-1], 1)
    return None  # pools are channel-wise


@dataclass(frozen=True)
class ChainParts:
    """The parts each processor computes in a chain under one (dim, rho).

    ``gpu``/``cpu`` hold one :class:`PartShape` per operator (``None`` when that processor has
    nothing to do); ``cut`` is where the chain's last output is split.
    """

    cut: int
    extent: int
    gpu: tuple[PartShape, ...] | None
    cpu: tuple[PartShape, ...] | None


def chain_parts(
    infos: Sequence[OpInfo], params: Sequence[OpParams], dim: PartitionDim, ratio: float
) -> ChainParts:
    """Part shapes of every operator of a chain for both processors (see the module docstring).

    Raises ``ValueError`` when a part would read only padding (such a cut cannot be built).
    """
    last = infos[-1]
    if dim == PartitionDim.H:
        geoms = [_window(i) for i in infos]
        extent, gran, spans_of = last.output_shape[2], 1, chain_row_spans
    else:
        geoms = [_channel_map(i) for i in infos]
        axis = len(last.output_shape) - 1 if last.kind == "matmul" else 1
        extent, spans_of = last.output_shape[axis], chain_channel_spans
        tail = next((g for g in reversed(geoms) if g is not None), None)
        gran = tail.granularity if tail is not None else 1
        gran = oc_granularity(extent, gran, last.kind == "matmul")
    cut = split_point(extent, ratio, gran)
    parts: dict[str, tuple[PartShape, ...] | None] = {}
    for proc, span in (("gpu", Span(0, cut)), ("cpu", Span(cut, extent))):
        if len(span) == 0:
            parts[proc] = None
            continue
        spans = spans_of(geoms, span)
        shapes = []
        for info, p, g, s in zip(infos, params, geoms, spans, strict=True):
            if dim == PartitionDim.H:
                shapes.append(
                    PartShape(
                        len(s.out), p.out_w, p.oc, len(s.inp), p.w, p.ic, p.groups, row0=s.out.start
                    )
                )
            else:
                comp = s.computed or s.out
                groups = 1 if g is None else g.part_groups(comp)
                shapes.append(
                    PartShape(
                        p.out_h, p.out_w, len(comp), p.h, p.w, len(s.inp), groups, oc0=comp.start
                    )
                )
        parts[proc] = tuple(shapes)
    return ChainParts(cut, extent, parts["gpu"], parts["cpu"])
