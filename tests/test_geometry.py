"""Property tests of the split geometry (codl_tvm.core.geometry) over odd shapes.

Images smaller than the kernel's reach, strides and dilations that leave rows unread, ceil-mode
pools, grouped and depthwise convs, output channels that are no multiple of the vector width:
every part must compute exactly its own rows or channels from an input span inside the tensor,
the parts of a cut must cover the output once, and a chain's spans must be its operators'
single-op spans composed.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codl_tvm.core.geometry import (
    MATMUL_OC_ALIGN,
    ChannelMap,
    PartSpan,
    SlidingWindow,
    Span,
    chain_channel_spans,
    chain_row_spans,
    oc_granularity,
    split_point,
)

ratios = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@st.composite
def windows(draw, in_extent: int | None = None) -> SlidingWindow:
    """A valid conv/pool H axis; the image may be smaller than the kernel's reach."""
    h = draw(st.integers(1, 24)) if in_extent is None else in_extent
    kernel = draw(st.integers(1, 7))
    dilation = draw(st.integers(1, 3))
    reach = dilation * (kernel - 1) + 1
    stride = draw(st.integers(1, 4))
    pad_before = draw(st.integers(0, reach - 1))
    pad_after = draw(st.integers(0, reach - 1))
    ceil_mode = draw(st.booleans())
    assume(h + pad_before + pad_after >= reach)
    return SlidingWindow(h, kernel, stride, dilation, pad_before, pad_after, ceil_mode)


def two_parts(extent: int, cut: int) -> list[Span]:
    return [s for s in (Span(0, cut), Span(cut, extent)) if len(s)]


def part_or_none(op: SlidingWindow, out: Span) -> PartSpan | None:
    """The part, or None when its rows read only padding (which the pass refuses as a plan
    error; checked to be true)."""
    try:
        return op.input_span(out)
    except ValueError as exc:
        assert "read only padding" in str(exc)
        first = out.start * op.stride - op.pad_before
        last = (out.stop - 1) * op.stride + op.effective_kernel - op.pad_before
        assert last <= 0 or first >= op.in_extent
        return None


# -- split points ----------------------------------------------------------------------------


@given(st.integers(1, 64), st.integers(1, 8), ratios)
def test_split_point_is_a_whole_unit_inside_the_extent(units, granularity, ratio):
    extent = units * granularity
    cut = split_point(extent, ratio, granularity)
    assert 0 <= cut <= extent and cut % granularity == 0
    assert split_point(extent, 0.0, granularity) == 0
    assert split_point(extent, 1.0, granularity) == extent
    # the nearest unit to the ratio (half up)
    assert abs(cut - ratio * extent) <= granularity / 2


@given(st.integers(1, 64), ratios, ratios)
def test_split_point_is_monotone(extent, r0, r1):
    lo, hi = sorted((r0, r1))
    assert split_point(extent, lo) <= split_point(extent, hi)


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan")])
def test_split_point_refuses_a_ratio_outside_0_1(ratio):
    with pytest.raises(ValueError, match="outside"):
        split_point(8, ratio)


# -- height (H) parts ------------------------------------------------------------------------


@settings(max_examples=300)
@given(windows(), ratios)
def test_h_parts_compute_exactly_their_rows(op, ratio):
    """Each part, run as the same window with its own padding on its input rows, produces
    exactly its output rows; its input rows lie inside the image, its first window starts
    where the whole operator's does, and the parts cover the output once."""
    out_extent = op.out_extent
    cut = split_point(out_extent, ratio)
    covered = []
    for out in two_parts(out_extent, cut):
        part = part_or_none(op, out)
        if part is None:
            continue
        assert part.out == out and part.computed == out
        assert 0 <= part.inp.start < part.inp.stop <= op.in_extent
        assert 0 <= part.pad_before <= op.pad_before
        assert part.inp.start - part.pad_before == out.start * op.stride - op.pad_before
        as_conv = SlidingWindow(
            len(part.inp),
            op.kernel,
            op.stride,
            op.dilation,
            part.pad_before,
            part.pad_after,
            part.ceil_mode,
        )
        assert as_conv.out_extent == len(out)
        # only the part holding the last row keeps ceil_mode
        assert part.ceil_mode == (op.ceil_mode and out.stop == out_extent)
        covered.extend(range(out.start, out.stop))
    if all(part_or_none(op, s) is not None for s in two_parts(out_extent, cut)):
        assert covered == list(range(out_extent))


@given(windows())
def test_one_part_for_the_whole_output_is_the_operator(op):
    """The whole output as one part: the operator itself, minus bottom rows no window reads."""
    part = op.input_span(Span(0, op.out_extent))
    assert part.inp.start == 0 and part.pad_before == op.pad_before
    assert part.ceil_mode == op.ceil_mode
    if op.ceil_mode:
        assert part.pad_after == op.pad_after and part.inp.stop == op.in_extent
    else:
        assert part.pad_after <= op.pad_after
        assert part.inp.stop == op.in_extent or part.pad_after == 0


@given(windows(), st.data())
def test_rows_outside_the_output_are_refused(op, data):
    start = data.draw(st.integers(0, op.out_extent))
    with pytest.raises(ValueError):
        op.input_span(Span(start, op.out_extent + data.draw(st.integers(1, 3))))


# -- output-channel (OC) parts ---------------------------------------------------------------


@st.composite
def channel_maps(draw) -> ChannelMap:
    groups = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise"]))
    if kind == "dense":
        return ChannelMap(draw(st.integers(1, 48)), draw(st.integers(1, 48)), 1)
    if kind == "depthwise":
        channels = groups * draw(st.integers(1, 4))
        return ChannelMap(channels, channels, channels)
    return ChannelMap(groups * draw(st.integers(1, 6)), groups * draw(st.integers(1, 6)), groups)


@settings(max_examples=300)
@given(channel_maps(), ratios)
def test_oc_parts_are_whole_groups_reading_their_groups_inputs(cmap, ratio):
    cut = split_point(cmap.out_channels, ratio, cmap.granularity)
    covered = []
    groups = 0
    for out in two_parts(cmap.out_channels, cut):
        part = cmap.input_span(out)
        # cut on whole groups: nothing computed beyond the part's own channels
        assert part.computed == out
        assert len(part.computed) % cmap.granularity == 0
        n = cmap.part_groups(part.computed)
        groups += n if cmap.groups > 1 else 0
        if cmap.groups == 1:
            assert part.inp == Span(0, cmap.in_channels) and n == 1
        else:
            ipg = cmap.in_channels // cmap.groups
            g0 = out.start // cmap.out_per_group
            assert part.inp == Span(g0 * ipg, (g0 + n) * ipg)
            assert n * cmap.out_per_group == len(out)
        assert 0 <= part.inp.start < part.inp.stop <= cmap.in_channels
        covered.extend(range(out.start, out.stop))
    assert covered == list(range(cmap.out_channels))
    assert cmap.groups == 1 or groups == cmap.groups


@given(channel_maps(), st.data())
def test_an_unaligned_oc_part_computes_its_whole_groups(cmap, data):
    """A part not on a group boundary computes the groups it touches (trimmed later)."""
    start = data.draw(st.integers(0, cmap.out_channels - 1))
    stop = data.draw(st.integers(start + 1, cmap.out_channels))
    part = cmap.input_span(Span(start, stop))
    comp = part.computed
    assert comp.start <= start and stop <= comp.stop <= cmap.out_channels
    assert comp.start % cmap.granularity == 0 and comp.stop % cmap.granularity == 0
    assert comp.start > start - cmap.granularity and comp.stop < stop + cmap.granularity


@given(st.integers(1, 512), st.sampled_from([1, 2, 3, 4, 8]), st.booleans())
def test_matmul_oc_unit_is_a_vector_that_divides_the_features(units, granularity, matmul):
    """Features no multiple of the vector width get the largest power-of-two vector that
    divides them; convs keep their group granularity."""
    extent = units * granularity
    unit = oc_granularity(extent, granularity, matmul)
    assert extent % unit == 0 and unit % granularity == 0
    if not matmul:
        assert unit == granularity
        return
    step = unit // granularity
    assert step & (step - 1) == 0 and step <= MATMUL_OC_ALIGN
    if step < MATMUL_OC_ALIGN:
        assert extent % (unit * 2)  # no wider vector divides the features


# -- chains ----------------------------------------------------------------------------------


@st.composite
def chains(draw) -> list[SlidingWindow | None]:
    """A chain of windows and elementwise ops (None), each reading the previous output."""
    extent = draw(st.integers(1, 32))
    ops: list[SlidingWindow | None] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()) and ops:
            ops.append(None)
            continue
        op = draw(windows(in_extent=extent))
        ops.append(op)
        extent = op.out_extent
    return ops


def out_extent(ops) -> int:
    return next(op.out_extent for op in reversed(ops) if op is not None)


@settings(max_examples=300)
@given(chains(), ratios)
def test_chain_spans_are_single_op_spans_composed(ops, ratio):
    """Walking back from a part of the chain's output gives, for every operator, its own
    single-op part of the rows the next operator reads; each processor's entry rows lie inside
    the chain's input, and together they cover it (the overlap is the redundant halo)."""
    extent = out_extent(ops)
    cut = split_point(extent, ratio)
    entries = []
    for out in two_parts(extent, cut):
        try:
            spans = chain_row_spans(ops, out)
        except ValueError as exc:
            assert "read only padding" in str(exc)
            continue
        assert spans[-1].out == out
        for k, (op, span) in enumerate(zip(ops, spans, strict=True)):
            if op is None:
                assert span.inp == span.out  # elementwise: rows map to themselves
            else:
                assert span == op.input_span(span.out)
            if k:
                assert span.inp == spans[k - 1].out
        entries.append(spans[0].inp)
    first = next(op for op in ops if op is not None)
    for span in entries:
        assert 0 <= span.start < span.stop <= first.in_extent
    if len(entries) == 2:
        gpu, cpu = entries
        assert gpu.start <= cpu.start and gpu.stop <= cpu.stop
        assert chain_row_spans(ops, Span(0, extent))[0].inp == Span(gpu.start, cpu.stop)


@given(st.lists(st.one_of(st.none(), channel_maps()), min_size=1, max_size=3), ratios)
def test_channel_chain_spans_are_single_op_spans_composed(maps, ratio):
    # make the chain consistent: each map reads the previous one's channels
    ops: list[ChannelMap | None] = []
    channels = None
    for m in maps:
        if m is None:
            ops.append(None)
            continue
        if channels is not None:
            if channels % m.groups:
                continue
            m = ChannelMap(channels, m.out_channels, m.groups)
        ops.append(m)
        channels = m.out_channels
    assume(any(op is not None for op in ops))
    extent = next(op.out_channels for op in reversed(ops) if op is not None)
    last = next(op for op in reversed(ops) if op is not None)
    cut = split_point(extent, ratio, last.granularity)
    for out in two_parts(extent, cut):
        spans = chain_channel_spans(ops, out)
        assert spans[-1].out == out
        for k, (op, span) in enumerate(zip(ops, spans, strict=True)):
            assert span == (
                PartSpan(span.out, span.out, computed=span.out)
                if op is None
                else op.input_span(span.out)
            )
            if k:
                assert span.inp == spans[k - 1].out


def test_chain_halo_grows_with_every_window():
    """A worked case (CoDL Fig. 12): two 3x3 stride-1 convs with padding 1 on 8 rows; the GPU
    computes output rows [0, 4) and needs input rows [0, 6): one halo row per conv."""
    conv = SlidingWindow(8, 3, 1, 1, 1, 1)
    spans = chain_row_spans([conv, None, conv], Span(0, 4))
    assert [s.inp.as_tuple() for s in spans] == [(0, 6), (0, 5), (0, 5)]
    assert [s.out.as_tuple() for s in spans] == [(0, 5), (0, 5), (0, 4)]
    assert (spans[0].pad_before, spans[0].pad_after) == (1, 0)
