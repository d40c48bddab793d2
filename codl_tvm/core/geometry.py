"""Row and channel geometry of split operators and chains: halo spans (pure Python, no TVM).

Everything here works on one axis of an NCHW tensor and on half-open spans ``[start, stop)``.

Height (H) partitioning
    A conv or pool is a :class:`SlidingWindow` on the H axis. For output rows ``[o0, o1)`` it
    reads input rows ``start = o0*S - pad_before`` to ``end = (o1-1)*S + D*(F-1) + 1 - pad_before``;
    the span is clamped to the image and the clamped amounts become the part's own padding
    (CoDL Eq. 1: a part of ``H_O`` rows needs ``P = S*(H_O-1) - H_I + F`` rows of padding/halo
    around its ``H_I`` own rows). Elementwise operators are ``None`` (rows map to themselves).
    :func:`chain_row_spans` walks a chain backwards from the rows a processor produces at the end
    of the chain to the rows it must read at the chain's entry (CoDL Fig. 12: the halo grows with
    every windowed operator in the chain, and the overlap is computed by both processors).

Output-channel (OC) partitioning
    A :class:`ChannelMap` says which input channels an output channel reads: a conv with
    ``groups`` groups reads the input channels of its groups (``groups=1``: all of them, as does a
    dense/matmul), a depthwise conv, a pool or an elementwise operator reads the same channel.
    Parts of a grouped conv are made of whole groups (:meth:`ChannelMap.aligned`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MATMUL_OC_ALIGN",
    "ChannelMap",
    "PartSpan",
    "SlidingWindow",
    "Span",
    "aligned_granularity",
    "chain_channel_spans",
    "chain_row_spans",
    "oc_granularity",
    "split_point",
]


@dataclass(frozen=True)
class Span:
    """A half-open index range ``[start, stop)`` on one axis."""

    start: int
    stop: int

    def __post_init__(self):
        if self.stop < self.start:
            raise ValueError(f"span [{self.start}, {self.stop}) has negative length")

    def __len__(self) -> int:
        return self.stop - self.start

    def as_tuple(self) -> tuple[int, int]:
        return (self.start, self.stop)


@dataclass(frozen=True)
class PartSpan:
    """What one part of one operator computes and reads on the partitioned axis.

    Attributes
    ----------
    out
        The output rows/channels the part produces.
    inp
        The input rows/channels it reads (already clamped to the input).
    pad_before, pad_after
        The part's own padding on that axis (H only; 0 for channels).
    ceil_mode
        Whether the part keeps the pool's ``ceil_mode`` (only the part holding the last row).
    computed
        What the part computes before trimming to ``out`` (differs from ``out`` only for grouped
        convs, whose parts are made of whole groups).
    """

    out: Span
    inp: Span
    pad_before: int = 0
    pad_after: int = 0
    ceil_mode: bool = False
    computed: Span | None = None


@dataclass(frozen=True)
class SlidingWindow:
    """The H axis of a conv2d or pool2d: extent of its input, kernel F, stride S, dilation D."""

    in_extent: int
    kernel: int
    stride: int = 1
    dilation: int = 1
    pad_before: int = 0
    pad_after: int = 0
    ceil_mode: bool = False

    def __post_init__(self):
        for name in ("in_extent", "kernel", "stride", "dilation"):
            if getattr(self, name) < 1:
                raise ValueError(f"sliding window: {name} must be >= 1, got {getattr(self, name)}")
        if self.pad_before < 0 or self.pad_after < 0:
            raise ValueError(
                f"sliding window: negative padding ({self.pad_before}, {self.pad_after})"
            )
        if self.out_extent < 1:
            raise ValueError(f"sliding window {self} produces no output rows")

    @property
    def effective_kernel(self) -> int:
        return self.dilation * (self.kernel - 1) + 1

    @property
    def out_extent(self) -> int:
        span = self.in_extent + self.pad_before + self.pad_after - self.effective_kernel
        if self.ceil_mode:
            return -(-span // self.stride) + 1
        return span // self.stride + 1

    def input_span(self, out: Span) -> PartSpan:
        """Input rows (clamped) and own padding of the part producing output rows ``out``."""
        if not 0 <= out.start < out.stop <= self.out_extent:
            raise ValueError(
                f"output rows [{out.start}, {out.stop}) outside [0, {self.out_extent}) of {self}"
            )
        start = out.start * self.stride - self.pad_before
        end = (out.stop - 1) * self.stride + self.effective_kernel - self.pad_before
        lo, hi = max(start, 0), min(end, self.in_extent)
        if hi <= lo:
            raise ValueError(
                f"output rows [{out.start}, {out.stop}) of {self} read only padding; "
                "such a part cannot be cut out of the input"
            )
        pad_before, pad_after = lo - start, end - hi
        ceil_mode = False
        if self.ceil_mode and out.stop == self.out_extent:
            # The last part keeps the pool's own ceil_mode and bottom padding, so its last window
            # is cut exactly as in the whole operator.
            ceil_mode, pad_after = True, self.pad_after
        return PartSpan(out, Span(lo, hi), pad_before, pad_after, ceil_mode, out)


@dataclass(frozen=True)
class ChannelMap:
    """How the output channels of an operator read its input channels.

    ``groups`` groups of ``out_channels // groups`` outputs, each reading ``in_channels // groups``
    inputs: ``groups=1`` is a dense conv or matmul (every input), ``groups == in_channels ==
    out_channels`` an elementwise operator, a pool or a depthwise conv with multiplier 1.
    """

    in_channels: int
    out_channels: int
    groups: int = 1

    def __post_init__(self):
        if self.groups < 1 or self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(
                f"channel map: {self.in_channels} inputs and {self.out_channels} "
                f"outputs cannot form {self.groups} groups"
            )

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def granularity(self) -> int:
        """Channels a part must be made of: whole groups, or any channel for one group."""
        return 1 if self.groups == 1 else self.out_per_group

    def aligned(self, out: Span) -> Span:
        """The smallest span of whole units (see :attr:`granularity`) that covers ``out``."""
        g = self.granularity
        return Span(out.start // g * g, -(-out.stop // g) * g)

    def part_groups(self, computed: Span) -> int:
        """The ``groups`` attribute of the part conv computing the aligned span ``computed``."""
        return 1 if self.groups == 1 else len(computed) // self.out_per_group

    def input_span(self, out: Span) -> PartSpan:
        """Input channels read (and channels computed) by the part producing channels ``out``."""
        if not 0 <= out.start < out.stop <= self.out_channels:
            raise ValueError(
                f"output channels [{out.start}, {out.stop}) outside [0, {self.out_channels})"
            )
        comp = self.aligned(out)
        if self.groups == 1:
            return PartSpan(out, Span(0, self.in_channels), computed=comp)
        ipg = self.in_channels // self.groups
        g0, g1 = comp.start // self.out_per_group, comp.stop // self.out_per_group
        return PartSpan(out, Span(g0 * ipg, g1 * ipg), computed=comp)


#: Output features of a matmul's parts are whole multiples of this many (when the extent allows):
#: the CPU matmul vectorises along them, and a part whose width has no vector-sized divisor
#: got a scalar loop (on a 16-core Xeon: a 4096x4096 layer's 2458-feature CPU part took
#: 9.2 ms, the whole layer 1.1 ms). 16 is an AVX-512 register of fp32 and a multiple of every
#: narrower one.
MATMUL_OC_ALIGN = 16


def aligned_granularity(extent: int, granularity: int, align: int) -> int:
    """``granularity`` times the largest power of two up to ``align`` that keeps it a divisor of
    ``extent`` (``extent`` must be a multiple of ``granularity``)."""
    step = max(1, align)
    while step > 1 and extent % (granularity * step):
        step //= 2
    return granularity * step


def oc_granularity(extent: int, granularity: int, matmul: bool, align: int | None = None) -> int:
    """Channels an OC cut of ``extent`` moves in: ``granularity`` (whole groups), and for a
    matmul whole vectors of up to ``align`` (default :data:`MATMUL_OC_ALIGN`) features."""
    if not matmul:
        return granularity
    return aligned_granularity(extent, granularity, MATMUL_OC_ALIGN if align is None else align)


def split_point(extent: int, ratio: float, granularity: int = 1) -> int:
    """Where the GPU part (the first ``ratio`` of ``extent``) ends, in whole ``granularity`` units.

    Rounds half up to the nearest unit: ratio 0 gives 0 (CPU only), ratio 1 gives ``extent``.
    """
    if not 0.0 <= ratio <= 1.0 or math.isnan(ratio):
        raise ValueError(f"ratio {ratio} is outside [0, 1]")
    if granularity < 1 or extent % granularity:
        raise ValueError(f"extent {extent} is not a multiple of granularity {granularity}")
    units = extent // granularity
    return min(units, math.floor(ratio * units + 0.5)) * granularity


def _as_span(out: Span | tuple[int, int]) -> Span:
    return out if isinstance(out, Span) else Span(*out)


def chain_row_spans(
    ops: Sequence[SlidingWindow | None], out: Span | tuple[int, int]
) -> list[PartSpan]:
    """Rows each operator of an H-partitioned chain must compute and read.

    Parameters
    ----------
    ops
        The chain's operators in data-flow order: a :class:`SlidingWindow` for a conv/pool, or
        ``None`` for an elementwise operator.
    out
        The rows of the chain's last output that this processor produces.

    Returns
    -------
    list[PartSpan]
        One per operator, in data-flow order; ``result[0].inp`` is what the processor reads at
        the chain entry and ``result[k].inp == result[k-1].out``. Rows outside the processor's own
        share are the halo it recomputes redundantly (CoDL Eq. 1 and Fig. 12).
    """
    return _chain_spans(ops, out)


def chain_channel_spans(
    ops: Sequence[ChannelMap | None], out: Span | tuple[int, int]
) -> list[PartSpan]:
    """Channels each operator of an OC-partitioned chain must compute and read.

    Like :func:`chain_row_spans` for channels; ``None`` is an elementwise operator. A grouped conv
    computes whole groups (``computed``) and its output is trimmed to ``out``.
    """
    return _chain_spans(ops, out)


def _chain_spans(ops: Sequence, out: Span | tuple[int, int]) -> list[PartSpan]:
    """Walk a chain backwards from the last operator's ``out``: each operator's span from the
    next one's input (``None``: elementwise, reads what it writes)."""
    span = _as_span(out)
    result: list[PartSpan] = []
    for op in reversed(ops):
        part = PartSpan(span, span, computed=span) if op is None else op.input_span(span)
        result.append(part)
        span = part.inp
    result.reverse()
    return result
