"""Operator chains: halo geometry (hand-worked cases) and chained splits against the unsplit model.

Numerics: fp32, rtol=1e-5, atol=1e-5 against the unpartitioned llvm build.
"""

from __future__ import annotations

import pytest
from codl_tvm.passes import (
    ChannelMap,
    PartitionOperators,
    Processor,
    SlidingWindow,
    Span,
    chain_channel_spans,
    chain_row_spans,
    collect_parts,
    split_point,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

from codl_tvm.core.plan import (
    ChainPlan,
    OpPartition,
    PartitionDim,
    PartitionPlan,
    PlanError,
    partitionable_ops,
)
from tests.test_passes_split import check, check_records, conv, make_module, ops_in, rand, run

H, OC = PartitionDim.H, PartitionDim.OC


# -- pure geometry, worked by hand -----------------------------------------------------------


def _rows(spans):
    return [(s.inp.as_tuple(), s.pad_before, s.pad_after, s.out.as_tuple()) for s in spans]


def test_two_same_convs_halo_grows_backwards():
    conv3 = SlidingWindow(8, 3, 1, 1, 1, 1)
    # GPU: output rows [0, 4). conv2 needs [-1, 5) -> [0, 5) + 1 top pad; conv1 for [0, 5)
    # needs [-1, 6) -> [0, 6) + 1 top pad: the halo grows by one row per conv.
    assert _rows(chain_row_spans([conv3, conv3], (0, 4))) == [
        ((0, 6), 1, 0, (0, 5)),
        ((0, 5), 1, 0, (0, 4)),
    ]
    # CPU: output rows [4, 8). conv2 needs [3, 9) -> [3, 8) + 1 bottom pad; conv1 [2, 8).
    assert _rows(chain_row_spans([conv3, conv3], Span(4, 8))) == [
        ((2, 8), 0, 1, (3, 8)),
        ((3, 8), 0, 1, (4, 8)),
    ]


def test_stride_two_conv_then_pool():
    conv_s2 = SlidingWindow(8, 3, 2, 1, 1, 1)  # 8 -> 4 rows
    pool = SlidingWindow(4, 2, 2)  # 4 -> 2 rows
    assert conv_s2.out_extent == 4 and pool.out_extent == 2
    # pool row 1 reads conv rows [2, 4); conv rows [2, 4) read input rows 3..7 (2*2-1 to 3*2+1)
    assert _rows(chain_row_spans([conv_s2, None, pool], (1, 2))) == [
        ((3, 8), 0, 0, (2, 4)),
        ((2, 4), 0, 0, (2, 4)),
        ((2, 4), 0, 0, (1, 2)),
    ]
    assert _rows(chain_row_spans([conv_s2, None, pool], (0, 1))) == [
        ((0, 4), 1, 0, (0, 2)),
        ((0, 2), 0, 0, (0, 2)),
        ((0, 2), 0, 0, (0, 1)),
    ]


def test_dilation_and_asymmetric_padding():
    dil = SlidingWindow(6, 3, 1, 2, 2, 0)  # effective kernel 5, pads (2, 0): 6+2-5+1 = 4 rows
    assert dil.out_extent == 4
    # rows [0, 2): start -2, end 1 + 5 - 2 = 4
    assert _rows(chain_row_spans([dil], (0, 2))) == [((0, 4), 2, 0, (0, 2))]
    # rows [2, 4): start 0, end 3 + 5 - 2 = 6
    assert _rows(chain_row_spans([dil], (2, 4))) == [((0, 6), 0, 0, (2, 4))]


@pytest.mark.parametrize(
    "stride,kernel,o0,o1", [(1, 3, 2, 5), (2, 3, 1, 3), (1, 5, 3, 4), (2, 7, 2, 5)]
)
def test_eq1_padding_of_an_interior_part(stride, kernel, o0, o1):
    # CoDL Eq. 1: P = S*(H_O - 1) - H_I + F extra rows beyond the H_I rows the part owns
    win = SlidingWindow(40, kernel, stride, 1, kernel // 2, kernel // 2)
    (span,) = chain_row_spans([win], (o0, o1))
    h_o = o1 - o0
    h_i = stride * h_o  # rows the part owns at stride S
    read = len(span.inp) + span.pad_before + span.pad_after
    assert read - h_i == stride * (h_o - 1) - h_i + kernel


def test_ceil_mode_pool_last_part_keeps_ceil():
    pool = SlidingWindow(7, 3, 2, 1, 0, 0, ceil_mode=True)  # ceil((7-3)/2)+1 = 3 rows
    assert pool.out_extent == 3
    first, last = pool.input_span(Span(0, 2)), pool.input_span(Span(2, 3))
    assert (first.inp.as_tuple(), first.ceil_mode) == ((0, 5), False)
    assert (last.inp.as_tuple(), last.ceil_mode, last.pad_after) == ((4, 7), True, 0)


def test_channel_spans():
    dense = ChannelMap(8, 6, 1)
    dw = ChannelMap(6, 12, 6)  # depthwise, multiplier 2
    # channels [0, 4) of the depthwise conv read inputs [0, 2), which the dense conv computes
    # from all of its 8 inputs
    spans = chain_channel_spans([dense, None, dw], (0, 4))
    assert [(s.inp.as_tuple(), s.out.as_tuple()) for s in spans] == [
        ((0, 8), (0, 2)),
        ((0, 2), (0, 2)),
        ((0, 2), (0, 4)),
    ]
    grouped = ChannelMap(6, 9, 3)  # 3 outputs per group
    part = grouped.input_span(Span(4, 8))  # needs groups 1..2 whole
    assert part.computed.as_tuple() == (3, 9) and part.inp.as_tuple() == (2, 6)
    assert grouped.part_groups(part.computed) == 2


def test_split_point_rounding_and_errors():
    assert [split_point(10, r) for r in (0, 0.04, 0.05, 0.5, 0.96, 1)] == [0, 0, 1, 5, 10, 10]
    assert split_point(12, 0.5, 4) == 8 and split_point(12, 0.3, 4) == 4
    with pytest.raises(ValueError, match=r"ratio 1\.5 is outside"):
        split_point(4, 1.5)
    with pytest.raises(ValueError, match="not a multiple of granularity"):
        split_point(10, 0.5, 4)
    with pytest.raises(ValueError, match=r"output rows \[3, 9\) outside \[0, 8\)"):
        SlidingWindow(8, 3, 1, 1, 1, 1).input_span(Span(3, 9))
    with pytest.raises(ValueError, match="read only padding"):
        SlidingWindow(4, 1, 1, 1, 2, 0).input_span(Span(0, 1))


# -- chains on real modules ------------------------------------------------------------------


def _stack(bb, x):
    """conv3x3+bias+relu, conv3x3 s2, maxpool 2, conv5x5 (dilated), avgpool 3 s1 p1, conv1x1."""
    y = conv(bb, x, 4, 3, 1, 1, seed=1)
    y = bb.emit(relax.op.add(y, relax.const(rand((1, 4, 1, 1), 2))))
    y = bb.emit(relax.op.nn.relu(y))
    y = conv(bb, y, 6, 3, 2, 1, seed=3)
    y = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
    y = conv(bb, y, 6, 3, 1, 2, dil=2, seed=4)
    y = bb.emit(relax.op.nn.avg_pool2d(y, 3, 1, 1, count_include_pad=False))
    return conv(bb, y, 5, 1, seed=5)


X_SHAPE = (1, 3, 20, 12)


@pytest.fixture(scope="module")
def stack():
    mod = make_module(X_SHAPE, _stack)
    x = rand(X_SHAPE, 9)
    return mod, x, run(mod, x), [i.name for i in partitionable_ops(mod)]


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 1.0])
def test_chain_h_lengths(stack, length, ratio):
    mod, x, ref, names = stack
    plan = PartitionPlan(chains=(ChainPlan(tuple(names[:length]), H, ratio),))
    part = check(mod, plan, x, reference=ref)
    (rec,) = check_records(part, H)
    # data is shared only at the chain's entry and exit: one slice of x per part, one concat
    parts = len(rec.parts)
    assert len(ops_in(part, "relax.concat")) == (1 if parts == 2 else 0)
    slices = [
        b
        for b in ops_in(part, "relax.strided_slice")
        if b.value.args[0].same_as(part["main"].params[0])
    ]
    # (a part whose halo reaches over the whole input reads it unsliced)
    assert len(slices) <= (parts if parts == 2 else 0)
    # each part computes every chained op from its own data
    for p in rec.parts:
        kinds = [v.name.split("_", 3)[-1] for v in p.bindings if not v.name.endswith("_in")]
        assert [k for k in kinds if k in ("conv2d", "max_pool2d", "avg_pool2d")] == [
            n.rsplit("_", 1)[0] for n in names[:length]
        ]


def test_chain_ir_slices_match_the_halo_helper(stack):
    mod, _, _, names = stack
    plan = PartitionPlan(chains=(ChainPlan(tuple(names[:4]), H, 0.5),))
    part = PartitionOperators(plan)(mod)
    (rec,) = collect_parts(part)
    windows = [
        SlidingWindow(20, 3, 1, 1, 1, 1),
        None,
        None,
        SlidingWindow(20, 3, 2, 1, 1, 1),
        SlidingWindow(10, 2, 2),
        SlidingWindow(5, 3, 1, 2, 2, 2),
    ]
    for p in rec.parts:
        expected = chain_row_spans(windows, p.region)
        sl = p.bindings[0]
        if not sl.name.endswith("_in"):  # the part reads the whole input: no slice
            assert expected[0].inp.as_tuple() == (0, 20)
            continue
        binding = next(
            b for blk in part["main"].body.blocks for b in blk.bindings if b.var.same_as(sl)
        )
        begin, end = int(binding.value.args[2][0]), int(binding.value.args[3][0])
        assert (begin, end) == expected[0].inp.as_tuple()
        # the halo makes the parts overlap at the chain entry (redundant rows)
    ins = [chain_row_spans(windows, p.region)[0].inp for p in rec.parts]
    assert ins[0].stop > ins[1].start


def test_oc_chain_through_channelwise_ops():
    def body(bb, x):
        y = conv(bb, x, 6, 3, 1, 1, seed=1)  # dense conv: OC split reads all input channels
        y = bb.emit(relax.op.nn.relu(y))
        y = conv(bb, y, 12, 3, 2, 1, groups=6, seed=2)  # depthwise x2: channel-local
        y = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
        return conv(bb, y, 6, 1, groups=3, seed=3)  # grouped: whole groups of 2 outputs

    mod = make_module((1, 4, 12, 12), body)
    x = rand((1, 4, 12, 12), 4)
    ref = run(mod, x)
    names = [i.name for i in partitionable_ops(mod)]
    for ratio in (0.0, 0.2, 0.5, 0.7, 1.0):
        plan = PartitionPlan(chains=(ChainPlan(tuple(names), OC, ratio),))
        part = check(mod, plan, x, reference=ref)
        (rec,) = check_records(part, OC)
        for p in rec.parts:
            assert p.region[0] % 2 == 0 and p.region[1] % 2 == 0


def test_oc_chain_with_dense_convs_recomputes_the_inputs():
    def body(bb, x):
        y = conv(bb, x, 5, 3, 1, 1, seed=1)
        return conv(bb, y, 4, 3, 1, 1, seed=2)

    mod = make_module((1, 3, 6, 6), body)
    x = rand((1, 3, 6, 6), 4)
    plan = PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_1"), OC, 0.5),))
    part = check(mod, plan, x)
    # both processors need all 5 channels of the first conv: it is computed whole on each
    first = [b for b in ops_in(part, "relax.nn.conv2d") if "_0_conv2d" in b.var.name]
    assert [int(b.var.ty.shape[1]) for b in first] == [5, 5]


def test_chain_with_residual_from_outside_and_mixed_plan():
    def body(bb, x):
        y = conv(bb, x, 4, 3, 1, 1, seed=1)
        y = bb.emit(relax.op.nn.relu(y))
        y = conv(bb, y, 4, 3, 1, 1, seed=2)
        y = bb.emit(relax.op.add(y, x))  # residual: x is shared data, sliced per part
        y = bb.emit(relax.op.nn.relu(y))
        return bb.emit(relax.op.nn.max_pool2d(y, 3, 2, 1))

    mod = make_module((1, 4, 10, 8), body)
    x = rand((1, 4, 10, 8), 5)
    ref = run(mod, x)
    for ratio in (0.1, 0.5, 0.9):
        plan = PartitionPlan(
            ops=(OpPartition("max_pool2d_2", OC, 0.5),),
            chains=(ChainPlan(("conv2d_0", "conv2d_1"), H, ratio),),
        )
        part = check(mod, plan, x, reference=ref)
        records = check_records(part, None)
        # records come in the order of main, whatever the order in the plan
        assert [(r.ops, r.dim) for r in records] == [
            (("conv2d_0", "conv2d_1"), H),
            (("max_pool2d_2",), OC),
        ]


def test_chain_errors():
    def body(bb, x):
        a = conv(bb, x, 4, 3, 1, 1, seed=1)
        b = conv(bb, a, 4, 3, 1, 1, seed=2)
        c = bb.emit(relax.op.add(b, a))  # a is used inside and outside the chain
        return conv(bb, c, 4, 3, 1, 1, seed=3)

    mod = make_module((1, 4, 6, 6), body)
    with pytest.raises(PlanError, match=r"output of conv2d_0 .* also used outside the chain"):
        PartitionOperators(PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_1"), H, 0.5),)))(
            mod
        )
    with pytest.raises(PlanError, match="conv2d_2 does not read the output of conv2d_0"):
        PartitionOperators(PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_2"), H, 0.5),)))(
            mod
        )
    with pytest.raises(PlanError, match="not in data-flow order"):
        PartitionOperators(PartitionPlan(chains=(ChainPlan(("conv2d_1", "conv2d_0"), H, 0.5),)))(
            mod
        )


def test_processor_of_each_part():
    mod = make_module(
        (1, 2, 8, 8), lambda bb, x: conv(bb, conv(bb, x, 3, 3, 1, 1), 3, 3, 1, 1, seed=2)
    )
    part = PartitionOperators(
        PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_1"), H, 0.25),))
    )(mod)
    (rec,) = collect_parts(part)
    assert [(p.processor, p.region) for p in rec.parts] == [
        (Processor.GPU, (0, 2)),
        (Processor.CPU, (2, 8)),
    ]
    assert all(v.name.startswith("codl0_gpu") for v in rec.parts[0].bindings)
    assert all(v.name.startswith("codl0_cpu") for v in rec.parts[1].bindings)
    assert rec.ops == ("conv2d_0", "conv2d_1") and rec.name == "conv2d_0..conv2d_1"


# -- property test over chains ---------------------------------------------------------------


@st.composite
def chain_cases(draw):
    n = draw(st.integers(1, 4))
    layers = []
    h = h0 = draw(st.integers(8, 16))
    w = 7
    for _ in range(n):
        kind = draw(st.sampled_from(["conv", "conv", "dw", "max", "avg"]))
        k = (
            draw(st.sampled_from([1, 3, 5]))
            if kind in ("conv", "dw")
            else draw(st.sampled_from([2, 3]))
        )
        stride = draw(st.integers(1, 2))
        pad = draw(st.integers(0, k // 2))
        if (h + 2 * pad - k) // stride + 1 < 2:
            stride, pad = 1, k // 2
        if (h + 2 * pad - k) // stride + 1 < 2 or (w + 2 * pad - k) // stride + 1 < 1:
            break  # the width (7 at the input) must stay non-empty too
        layers.append((kind, k, stride, pad))
        h = (h + 2 * pad - k) // stride + 1
        w = (w + 2 * pad - k) // stride + 1
    dim = draw(st.sampled_from([H, OC]))
    ratio = draw(st.floats(0.0, 1.0))
    return h0, layers, dim, ratio


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_cases())
def test_property_chains_match(case):
    h, layers, dim, ratio = case

    def body(bb, x):
        y = x
        for i, (kind, k, stride, pad) in enumerate(layers):
            if kind == "conv":
                y = conv(bb, y, 4, k, stride, pad, seed=i)
                y = bb.emit(relax.op.nn.relu(y))
            elif kind == "dw":
                y = conv(bb, y, 4, k, stride, pad, groups=4, seed=i)
            elif kind == "max":
                y = bb.emit(relax.op.nn.max_pool2d(y, k, stride, pad))
            else:
                y = bb.emit(relax.op.nn.avg_pool2d(y, k, stride, pad, count_include_pad=True))
        return bb.emit(relax.op.add(y, relax.const(1.0, "float32")))

    mod = make_module((1, 4, h, 7), body)
    names = tuple(i.name for i in partitionable_ops(mod))
    if not names:
        return
    plan = PartitionPlan(chains=(ChainPlan(names, dim, ratio),))
    part = check(mod, plan, rand((1, 4, h, 7), 2), codl_pipeline=True)
    check_records(part, dim)


def test_oc_chain_trims_whole_groups_computed_for_a_partial_need():
    def body(bb, x):
        y = conv(bb, x, 6, 3, 1, 1, seed=1)
        y = conv(bb, y, 4, 3, 1, 1, groups=2, seed=2)  # 2 outputs per group
        return conv(bb, y, 4, 3, 1, 1, groups=4, seed=3)  # depthwise: any channel

    mod = make_module((1, 3, 6, 6), body)
    x = rand((1, 3, 6, 6), 4)
    plan = PartitionPlan(chains=(ChainPlan(("conv2d_0", "conv2d_1", "conv2d_2"), OC, 0.25),))
    part = check(mod, plan, x)
    (rec,) = collect_parts(part)
    assert [p.region for p in rec.parts] == [(0, 1), (1, 4)]
    # the grouped conv computes whole groups ([0, 2) and [0, 4)) and is trimmed to [0, 1), [1, 4)
    trims = [v for p in rec.parts for v in p.bindings if v.name.endswith("_trim")]
    assert [int(v.ty.shape[1]) for v in trims] == [1, 3]
