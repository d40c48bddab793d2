"""codl.PartitionOperators on single operators: numerics against the unpartitioned build (llvm).

Every check builds the module before and after the pass with ``tvm.compile(target=llvm)``, runs
both on ``tvm.cpu()`` and requires fp32 agreement within rtol=1e-5, atol=1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from codl_tvm.passes import PartitionOperators, Processor, collect_parts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from codl_tvm.core.plan import (
    OpPartition,
    PartitionDim,
    PartitionPlan,
    PlanError,
    partitionable_ops,
    uniform_plan,
)

RTOL = ATOL = 1e-5
TARGET = tvm.target.Target({"kind": "llvm"})
H, OC = PartitionDim.H, PartitionDim.OC


# -- helpers shared with test_passes_chain.py ------------------------------------------------


def rand(shape, seed=0, positive=False):
    data = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    return np.abs(data) + 0.5 if positive else data


def make_module(x_shape, body, extra_params=()):
    """A module whose ``main(x, *extra)`` returns ``body(bb, x, *extra)`` (emitted in dataflow)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(tuple(x_shape), "float32"))
    extra = [relax.Var(n, relax.TensorType(tuple(s), "float32")) for n, s in extra_params]
    with bb.function("main", [x, *extra]):
        with bb.dataflow():
            out = body(bb, x, *extra)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def run(mod, *inputs, codl_pipeline=False):
    # codl_pipeline: codl-tvm's single-device pipeline instead of TVM's default, which emits
    # invalid LLVM IR ("Instruction does not dominate all uses") for some unscheduled pools.
    kwargs = {}
    if codl_pipeline:
        from codl_tvm.build.pipeline import single_device_pipeline

        kwargs["relax_pipeline"] = single_device_pipeline(TARGET)
    ex = tvm.compile(mod, target=TARGET, **kwargs)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a, tvm.cpu()) for a in inputs))
    return out.numpy()


def check(mod, plan, *inputs, reference=None, codl_pipeline=False, channel_blocks=False):
    """Apply ``plan``; compare against the unpartitioned build; return the partitioned module."""
    ref = run(mod, *inputs, codl_pipeline=codl_pipeline) if reference is None else reference
    part = PartitionOperators(plan, channel_blocks)(mod)
    relax.analysis.well_formed(part)  # raises on the first violation
    got = run(part, *inputs, codl_pipeline=codl_pipeline)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    return part


def one_op(name, dim, ratio):
    return PartitionPlan(ops=(OpPartition(name, dim, ratio),))


def conv(bb, x, oc, k, stride=1, pad=0, dil=1, groups=1, seed=1, kw=None):
    ic = int(x.ty.shape[1])
    kw = k if kw is None else kw
    w = relax.const(rand((oc, ic // groups, k, kw), seed))
    pads = pad if isinstance(pad, (list, tuple)) else [pad] * 4
    return bb.emit(
        relax.op.nn.conv2d(x, w, strides=stride, padding=pads, dilation=dil, groups=groups)
    )


def ops_in(mod, name):
    return [
        b
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == name
    ]


def check_records(mod, dim):
    """The part record covers the merged output exactly, in GPU-then-CPU order."""
    records = collect_parts(mod)
    for rec in records:
        ext = int(rec.output.ty.shape[rec.axis])
        pos = 0
        for part in rec.parts:
            assert part.region[0] == pos and part.region[1] > pos
            assert int(part.output.ty.shape[rec.axis]) == part.region[1] - part.region[0]
            pos = part.region[1]
        assert pos == ext
        assert dim is None or rec.dim == dim
        if rec.input is not None:
            in_ext = int(rec.input.ty.shape[rec.axis])
            for part in rec.parts:
                assert 0 <= part.input_region[0] < part.input_region[1] <= in_ext
        procs = [p.processor for p in rec.parts]
        assert procs in ([Processor.GPU, Processor.CPU], [Processor.GPU], [Processor.CPU])
    return records


# -- conv2d ----------------------------------------------------------------------------------

RATIOS = [0.0, 1.0, 0.5, 0.3]


@pytest.mark.parametrize("k", [1, 3, 5, 7])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dim", [H, OC])
def test_conv_kernel_stride(k, stride, dim):
    pad = k // 2
    mod = make_module((1, 3, 11, 9), lambda bb, x: conv(bb, x, 6, k, stride, pad))
    x = rand((1, 3, 11, 9), 7)
    ref = run(mod, x)
    for ratio in RATIOS:
        part = check(mod, one_op("conv2d_0", dim, ratio), x, reference=ref)
        check_records(part, dim)


@pytest.mark.parametrize("dim", [H, OC])
def test_conv_one_row_or_channel_each_side(dim):
    # 11 rows (H) / 6 channels (OC) out: ratios that leave exactly one row/channel to one side
    mod = make_module((1, 3, 11, 7), lambda bb, x: conv(bb, x, 6, 3, 1, 1))
    x = rand((1, 3, 11, 7), 3)
    ref = run(mod, x)
    extent = 11 if dim == H else 6
    for ratio in (1 / extent, (extent - 1) / extent):
        part = check(mod, one_op("conv2d_0", dim, ratio), x, reference=ref)
        (rec,) = check_records(part, dim)
        sizes = sorted(p.region[1] - p.region[0] for p in rec.parts)
        assert sizes == [1, extent - 1]


@pytest.mark.parametrize(
    "pad,dil,stride",
    [([2, 0, 1, 1], 1, 1), ([0, 1, 3, 0], 1, 2), (2, 2, 1), (3, 3, 2), (0, 2, 2)],
)
@pytest.mark.parametrize("dim", [H, OC])
def test_conv_padding_dilation(pad, dil, stride, dim):
    mod = make_module((1, 4, 13, 8), lambda bb, x: conv(bb, x, 5, 3, stride, pad, dil))
    x = rand((1, 4, 13, 8), 5)
    ref = run(mod, x)
    for ratio in (0.5, 0.2, 0.9):
        check(mod, one_op("conv2d_0", dim, ratio), x, reference=ref)


@pytest.mark.parametrize("groups,oc", [(2, 6), (3, 3), (6, 6), (6, 12)])
@pytest.mark.parametrize("dim", [H, OC])
def test_conv_groups_and_depthwise(groups, oc, dim):
    mod = make_module((1, 6, 9, 9), lambda bb, x: conv(bb, x, oc, 3, 1, 1, groups=groups))
    x = rand((1, 6, 9, 9), 11)
    ref = run(mod, x)
    for ratio in (0.0, 0.4, 0.5, 0.75, 1.0):
        part = check(mod, one_op("conv2d_0", dim, ratio), x, reference=ref)
        if dim == OC:
            (rec,) = collect_parts(part)
            per_group = oc // groups
            for p in rec.parts:  # whole groups only
                assert p.region[0] % per_group == 0 and p.region[1] % per_group == 0
            for b in ops_in(part, "relax.nn.conv2d"):
                w = [int(v) for v in b.value.args[1].ty.shape]
                assert w[0] // per_group == int(b.value.attrs.groups)


def test_conv_rectangular_kernel_and_batch():
    mod = make_module((2, 3, 10, 8), lambda bb, x: conv(bb, x, 4, 5, (2, 1), [2, 1, 2, 1], kw=3))
    x = rand((2, 3, 10, 8), 2)
    ref = run(mod, x)
    for dim in (H, OC):
        check(mod, one_op("conv2d_0", dim, 0.6), x, reference=ref)


# -- followers -------------------------------------------------------------------------------


def _conv_block(bb, x):
    y = conv(bb, x, 4, 3, 1, 1)
    bias = bb.emit(relax.op.reshape(relax.const(rand((4,), 3)), (1, 4, 1, 1)))
    y = bb.emit(relax.op.add(y, bias))
    bn = bb.emit(
        relax.op.nn.batch_norm(
            y,
            relax.const(rand((4,), 4)),
            relax.const(rand((4,), 5)),
            relax.const(rand((4,), 6)),
            relax.const(rand((4,), 7, positive=True)),
            axis=1,
            training=False,
        )
    )
    y = bb.emit(relax.TupleGetItem(bn, 0))
    bb.emit(relax.TupleGetItem(bn, 1))  # unused side outputs, as the ONNX importer emits
    y = bb.emit(relax.op.clip(y, -0.5, 1.5))
    y = bb.emit(relax.op.add(y, x))  # residual from outside the split
    return bb.emit(relax.op.nn.relu(y))


@pytest.mark.parametrize("dim", [H, OC])
def test_followers_follow_the_split(dim):
    mod = make_module((1, 4, 8, 6), _conv_block)
    x = rand((1, 4, 8, 6), 1)
    ref = run(mod, x)
    for ratio in (0.25, 0.5, 1.0):
        part = check(mod, one_op("conv2d_0", dim, ratio), x, reference=ref)
        (rec,) = collect_parts(part)
        # bias add, batch_norm, clip, residual add, relu all live inside each part
        for p in rec.parts:
            names = [v.name for v in p.bindings]
            for kind in ("conv2d", "add", "batch_norm", "clip", "relu"):
                assert any(n.endswith(kind) for n in names), (kind, names)
        assert not ops_in(part, "relax.nn.batch_norm") or all(
            b.var.name.startswith("codl") for b in ops_in(part, "relax.nn.batch_norm")
        )


def test_follower_with_other_use_stays_outside():
    def body(bb, x):
        y = conv(bb, x, 4, 3, 1, 1)
        r = bb.emit(relax.op.nn.relu(y))
        s = bb.emit(relax.op.sigmoid(y))  # y has two users: the split ends at the conv
        return bb.emit(relax.op.add(r, s))

    mod = make_module((1, 4, 8, 6), body)
    x = rand((1, 4, 8, 6), 1)
    part = check(mod, one_op("conv2d_0", H, 0.5), x)
    (rec,) = collect_parts(part)
    assert [v.name.rsplit("_", 1)[-1] for v in rec.parts[0].bindings] == ["in", "conv2d"]


# -- pooling ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,size,stride,pad,ceil,incl",
    [
        ("max", 2, 2, 0, False, False),
        ("max", 3, 2, 1, False, False),
        ("max", 3, 2, 1, True, False),
        ("avg", 3, 1, 1, False, False),
        ("avg", 3, 1, 1, False, True),
        ("avg", 3, 2, 1, True, True),
        ("avg", 3, 2, 1, True, False),
        ("avg", 2, 2, 0, False, False),
    ],
)
@pytest.mark.parametrize("dim", [H, OC])
def test_pooling(kind, size, stride, pad, ceil, incl, dim):
    pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    mod = make_module(
        (1, 3, 10, 7),
        lambda bb, x: bb.emit(pool(x, size, stride, pad, ceil_mode=ceil, count_include_pad=incl)),
    )
    x = rand((1, 3, 10, 7), 9)
    ref = run(mod, x)
    name = partitionable_ops(mod)[0].name
    for ratio in (0.0, 0.2, 0.5, 0.8, 1.0):
        part = check(mod, one_op(name, dim, ratio), x, reference=ref)
        check_records(part, dim)


# -- dense / matmul --------------------------------------------------------------------------


def test_matmul_constant_weight_is_split_at_compile_time():
    def body(bb, x):
        # as the ONNX importer emits Gemm: permute_dims of a constant, matmul, add bias
        wt = bb.emit(relax.op.permute_dims(relax.const(rand((7, 12), 2)), [1, 0]))
        y = bb.emit(relax.op.matmul(x, wt))
        y = bb.emit(relax.op.add(y, relax.const(rand((7,), 3))))
        return bb.emit(relax.op.nn.relu(y))

    mod = make_module((2, 12), body)
    x = rand((2, 12), 1)
    ref = run(mod, x)
    for ratio in (0.0, 1 / 7, 0.5, 6 / 7, 1.0):
        part = check(mod, one_op("matmul_0", OC, ratio), x, reference=ref)
        (rec,) = check_records(part, OC)
        assert rec.axis == 1
        assert not ops_in(part, "relax.strided_slice")  # no runtime slice of weight or input
        if len(rec.parts) == 2:  # the weight slices became constants
            for b in ops_in(part, "relax.matmul"):
                assert isinstance(b.value.args[1], tvm.ir.Constant)


@pytest.mark.parametrize(
    ("features", "ratio", "cut"),
    [
        (64, 0.4, 32),  # 25.6 features -> 2 of the 4 vector-wide units
        (4096, 0.4, 1632),  # 2458 would leave the CPU's part without a vector-sized divisor
        (40, 0.3, 16),  # 40 = 5 x 8: units of 8
        (7, 0.5, 4),  # odd: any feature (rounds half up)
    ],
)
def test_matmul_oc_parts_are_whole_vectors(features, ratio, cut):
    """Matmul OC cuts fall on MATMUL_OC_ALIGN features (or the largest power of two that divides
    the features), in the pass and in the planner's part geometry alike."""
    from codl_tvm.core.geometry import MATMUL_OC_ALIGN, aligned_granularity
    from codl_tvm.planner.split.part_shapes import chain_parts, op_params

    assert MATMUL_OC_ALIGN == 16
    assert aligned_granularity(features, 1, MATMUL_OC_ALIGN) in (1, 2, 4, 8, 16)
    k = 24
    weight = relax.const(rand((k, features)))
    mod = make_module((2, k), lambda bb, x: bb.emit(relax.op.matmul(x, weight)))
    x = rand((2, k), 1)
    part = check(mod, one_op("matmul_0", OC, ratio), x)
    (rec,) = check_records(part, OC)
    assert rec.parts[0].region == (0, cut)
    (info,) = partitionable_ops(mod)
    geometry = chain_parts([info], [op_params(info)], OC, ratio)
    assert geometry.cut == cut


def test_matmul_weight_parameter_is_sliced_in_ir():
    mod = make_module(
        (3, 8), lambda bb, x, w: bb.emit(relax.op.matmul(x, w)), extra_params=[("w", (8, 5))]
    )
    x, w = rand((3, 8), 1), rand((8, 5), 2)
    part = check(mod, one_op("matmul_0", OC, 0.4), x, w)
    assert len(ops_in(part, "relax.strided_slice")) == 2  # one weight slice per part


def test_matmul_has_no_h_split():
    mod = make_module((3, 8), lambda bb, x: bb.emit(relax.op.matmul(x, relax.const(rand((8, 5))))))
    with pytest.raises(PlanError, match=r"matmul_0 .*cannot be split along H"):
        PartitionOperators(one_op("matmul_0", H, 0.5))(mod)
    assert [o.name for o in uniform_plan(mod, "H", 0.5).ops] == []


# -- structure -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ratio,proc",
    [(0.0, Processor.CPU), (0.1, Processor.CPU), (1.0, Processor.GPU), (0.95, Processor.GPU)],
)
def test_empty_part_is_not_created(ratio, proc):
    # 4 output rows: 0.1 * 4 rounds to 0 rows, 0.95 * 4 to all 4 rows
    mod = make_module((1, 2, 8, 8), lambda bb, x: conv(bb, x, 3, 3, 2, 1))
    x = rand((1, 2, 8, 8), 4)
    part = check(mod, one_op("conv2d_0", H, ratio), x)
    (rec,) = collect_parts(part)
    assert [p.processor for p in rec.parts] == [proc]
    assert rec.parts[0].region == (0, 4)
    assert not ops_in(part, "relax.concat")
    assert not ops_in(part, "relax.strided_slice")  # the whole input: no slice either
    assert len(ops_in(part, "relax.nn.conv2d")) == 1
    other = "gpu" if proc == Processor.CPU else "cpu"
    assert not any(other in b.var.name for blk in part["main"].body.blocks for b in blk.bindings)


def test_emitted_ir_shape_h_split():
    mod = make_module(
        (1, 2, 8, 8), lambda bb, x: bb.emit(relax.op.nn.relu(conv(bb, x, 3, 3, 1, 1)))
    )
    part = PartitionOperators(one_op("conv2d_0", H, 0.5))(mod)
    names = [b.var.name for blk in part["main"].body.blocks for b in blk.bindings]
    assert names == [
        "codl0_gpu_in",
        "codl0_gpu_0_conv2d",
        "codl0_gpu_1_relu",
        "codl0_cpu_in",
        "codl0_cpu_0_conv2d",
        "codl0_cpu_1_relu",
        "codl0_out",
        "gv",
    ]
    convs = ops_in(part, "relax.nn.conv2d")
    assert [[int(p) for p in b.value.attrs.padding] for b in convs] == [[1, 1, 0, 1], [0, 1, 1, 1]]
    slices = ops_in(part, "relax.strided_slice")
    assert [(int(b.value.args[2][0]), int(b.value.args[3][0])) for b in slices] in (
        [(0, 5), (3, 8)],
    )
    (rec,) = collect_parts(part)
    assert rec.output.name == "codl0_out" and rec.axis == 2
    assert [(p.processor, p.region, p.input_region) for p in rec.parts] == [
        (Processor.GPU, (0, 4), (0, 5)),
        (Processor.CPU, (4, 8), (3, 8)),
    ]
    assert rec.input.same_as(part["main"].params[0])


@pytest.mark.parametrize("ratio", [0.5, 0.0])
def test_split_of_a_dataflow_block_output(ratio):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(
                relax.op.nn.conv2d(x, relax.const(rand((3, 2, 3, 3))), padding=[1, 1, 1, 1])
            )
        bb.emit_func_output(gv)
    mod = bb.get()
    part = check(mod, one_op("conv2d_0", OC, ratio), rand((1, 2, 6, 6), 2))
    (rec,) = collect_parts(part)
    assert not isinstance(rec.output, relax.DataflowVar)  # still the block's output


def test_uniform_plan_on_every_op_and_stale_record_detection():
    def body(bb, x):
        y = bb.emit(relax.op.nn.relu(conv(bb, x, 4, 3, 1, 1)))
        y = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
        return conv(bb, y, 6, 3, 2, 1, seed=3)

    mod = make_module((1, 3, 12, 12), body)
    x = rand((1, 3, 12, 12), 8)
    ref = run(mod, x)
    for dim in (H, OC):
        part = check(mod, uniform_plan(mod, dim, 0.5), x, reference=ref)
        assert len(check_records(part, dim)) == 3
    cleaned = relax.transform.DeadCodeElimination()(part)
    assert len(collect_parts(cleaned)) == 3  # names survive dead-code elimination
    # CanonicalizeBindings folds `gv = codl2_out` into one variable named gv: the record is
    # stale and collect_parts says so instead of returning wrong variables
    renamed = relax.transform.CanonicalizeBindings()(part)
    with pytest.raises(ValueError, match="'codl2_out' is no longer bound"):
        collect_parts(renamed)


def test_plan_errors_are_raised_by_the_pass():
    mod = make_module((1, 2, 6, 6), lambda bb, x: conv(bb, x, 3, 3, 1, 1))
    with pytest.raises(PlanError, match="no partitionable operator 'conv2d_7'"):
        PartitionOperators(one_op("conv2d_7", H, 0.5))(mod)
    with pytest.raises(TypeError, match="needs a PartitionPlan"):
        PartitionOperators({"ops": []})
    assert PartitionOperators(PartitionPlan())(mod).same_as(mod)


# -- property test ---------------------------------------------------------------------------


@st.composite
def conv_cases(draw):
    k = draw(st.sampled_from([1, 2, 3, 5]))
    dil = draw(st.integers(1, 2))
    eff = dil * (k - 1) + 1
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, eff - 1)) for _ in range(4)]
    groups = draw(st.sampled_from([1, 2]))
    ic = groups * draw(st.integers(1, 3))
    oc = groups * draw(st.integers(1, 3))
    h_min = max(eff - pads[0] - pads[2], 1)
    w_min = max(eff - pads[1] - pads[3], 1)
    h = draw(st.integers(h_min, h_min + 8))
    w = draw(st.integers(w_min, w_min + 3))
    dim = draw(st.sampled_from([H, OC]))
    ratio = draw(st.floats(0.0, 1.0))
    return (ic, oc, k, stride, pads, dil, groups, h, w, dim, ratio)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_property_conv_split_matches(case):
    ic, oc, k, stride, pads, dil, groups, h, w, dim, ratio = case
    mod = make_module(
        (1, ic, h, w),
        lambda bb, x: bb.emit(relax.op.nn.relu(conv(bb, x, oc, k, stride, pads, dil, groups))),
    )
    part = check(mod, one_op("conv2d_0", dim, ratio), rand((1, ic, h, w), 1))
    check_records(part, dim)


@st.composite
def pool_cases(draw):
    k = draw(st.integers(1, 4))
    stride = draw(st.integers(1, 3))
    pads = [draw(st.integers(0, k // 2)) for _ in range(4)]
    h = draw(st.integers(k, 11))
    return (
        draw(st.sampled_from(["max", "avg"])),
        k,
        stride,
        pads,
        draw(st.booleans()),
        draw(st.booleans()),
        h,
        draw(st.sampled_from([H, OC])),
        draw(st.floats(0.0, 1.0)),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_cases())
def test_property_pool_split_matches(case):
    kind, k, stride, pads, ceil, incl, h, dim, ratio = case
    pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    mod = make_module(
        (1, 2, h, 5),
        lambda bb, x: bb.emit(pool(x, k, stride, pads, ceil_mode=ceil, count_include_pad=incl)),
    )
    name = partitionable_ops(mod)[0].name
    try:
        part = check(mod, one_op(name, dim, ratio), rand((1, 2, h, 5), 3))
    except PlanError as exc:
        # The one documented refusal: avg pool counting padding, ceil_mode width rounding up.
        assert kind == "avg" and incl and ceil and "cannot be split along H" in str(exc)
        return
    check_records(part, dim)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_ceil_mode_pool_h_split_keeps_the_rounded_up_width(kind):
    # Width 5, kernel 3, stride 2, right pad 1: ceil_mode gives 3 columns, floor 2.
    pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    mod = make_module(
        (1, 2, 4, 5),
        lambda bb, x: bb.emit(pool(x, 3, 2, [0, 0, 0, 1], ceil_mode=True, count_include_pad=False)),
    )
    name = partitionable_ops(mod)[0].name
    part = check(mod, one_op(name, H, 0.5), rand((1, 2, 4, 5), 3))
    check_records(part, H)


def test_part_reading_only_padding_is_a_plan_error():
    # a 1x1 conv with 2 rows of top padding: its first output rows see padding only
    mod = make_module((1, 2, 6, 6), lambda bb, x: conv(bb, x, 3, 1, 1, [2, 0, 0, 0]))
    with pytest.raises(PlanError, match=r"op conv2d_0, gpu part \(0, 1\): .*read only padding"):
        PartitionOperators(one_op("conv2d_0", H, 1 / 8))(mod)
    check(mod, one_op("conv2d_0", H, 0.5), rand((1, 2, 6, 6)))  # 0.5 is fine


# -- exact IR (TVMScript Before/Expected) ----------------------------------------------------


@I.ir_module
class _ConvRelu:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")
    ) -> R.Tensor((1, 3, 8, 8), "float32"):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            gv = R.nn.relu(y)
            R.output(gv)
        return gv


@I.ir_module
class _ConvReluH:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")
    ) -> R.Tensor((1, 3, 8, 8), "float32"):
        with R.dataflow():
            # GPU: output rows [0, 3) read input rows [0, 4) with 1 row of own top padding
            a = R.strided_slice(x, axes=[2], begin=[0], end=[4], assume_inbound=True)
            b = R.nn.conv2d(a, w, padding=[1, 1, 0, 1])
            c = R.nn.relu(b)
            # CPU: output rows [3, 8) read input rows [2, 8) with 1 row of own bottom padding
            d = R.strided_slice(x, axes=[2], begin=[2], end=[8], assume_inbound=True)
            e = R.nn.conv2d(d, w, padding=[0, 1, 1, 1])
            f = R.nn.relu(e)
            gv = R.concat((c, f), axis=2)
            R.output(gv)
        return gv


@I.ir_module
class _ConvReluOC:
    @R.function
    def main(
        x: R.Tensor((1, 2, 8, 8), "float32"), w: R.Tensor((3, 2, 3, 3), "float32")
    ) -> R.Tensor((1, 3, 8, 8), "float32"):
        with R.dataflow():
            # GPU: output channel [0, 1) (round(0.4 * 3) = 1); the input is read whole
            w0 = R.strided_slice(w, axes=[0], begin=[0], end=[1], assume_inbound=True)
            b = R.nn.conv2d(x, w0, padding=[1, 1, 1, 1])
            c = R.nn.relu(b)
            w1 = R.strided_slice(w, axes=[0], begin=[1], end=[3], assume_inbound=True)
            e = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            f = R.nn.relu(e)
            gv = R.concat((c, f), axis=1)
            R.output(gv)
        return gv


@pytest.mark.parametrize("dim,ratio,expected", [(H, 0.4, _ConvReluH), (OC, 0.4, _ConvReluOC)])
def test_exact_ir(dim, ratio, expected):
    after = PartitionOperators(one_op("conv2d_0", dim, ratio))(_ConvRelu)
    main = after["main"].without_attr("codl_parts")
    tvm.ir.assert_structural_equal(main, expected["main"])
    x, w = rand((1, 2, 8, 8), 1), rand((3, 2, 3, 3), 2)
    np.testing.assert_allclose(run(after, x, w), run(_ConvRelu, x, w), rtol=RTOL, atol=ATOL)


def test_second_application_is_refused():
    once = PartitionOperators(one_op("conv2d_0", H, 0.5))(_ConvRelu)
    with pytest.raises(PlanError, match="already partitioned"):
        PartitionOperators(one_op("conv2d_0", H, 0.5))(once)


# -- channel-local blocks (InstanceNorm) -----------------------------------------------------


def _instance_norm(bb, y, axes=(2, 3), keepdims=True, residual=None):
    """InstanceNorm as TVM's ONNX frontend imports it: mean, variance, elementwise, affine
    (reshaped constants bound after the statistics), then relu or a residual add."""
    c = int(y.ty.shape[1])
    mean = bb.emit(relax.op.mean(y, axis=list(axes), keepdims=keepdims))
    centred = bb.emit(relax.op.subtract(y, mean))
    var = bb.emit(relax.op.variance(y, axis=list(axes), keepdims=keepdims))
    std = bb.emit(relax.op.sqrt(bb.emit(relax.op.add(var, relax.const(1e-5, "float32")))))
    norm = bb.emit(relax.op.divide(centred, std))
    scale = bb.emit(relax.op.reshape(relax.const(rand((c,), 11)), (c, 1, 1)))
    shift = bb.emit(relax.op.reshape(relax.const(rand((c,), 12)), (c, 1, 1)))
    out = bb.emit(relax.op.add(bb.emit(relax.op.multiply(norm, scale)), shift))
    if residual is not None:
        return bb.emit(relax.op.add(out, residual))
    return bb.emit(relax.op.nn.relu(out))


def _conv_in_conv(bb, x):
    y = _instance_norm(bb, conv(bb, x, 6, 3, 1, 1), residual=None)
    y = _instance_norm(bb, conv(bb, y, 4, 3, 1, 1, seed=2), residual=x)
    return conv(bb, y, 4, 1, seed=3)


@pytest.mark.parametrize("dim", [H, OC])
@pytest.mark.parametrize("ratio", [0.3, 0.5])
def test_instance_norm_is_split_on_channels_after_a_split(dim, ratio):
    """Both processors normalise a share of the channels (at the split's ratio) instead of one
    of them normalising all while the other waits; the residual operand is sliced too."""
    mod = make_module((1, 4, 9, 7), _conv_in_conv)
    x = rand((1, 4, 9, 7), 1)
    ref = run(mod, x)
    plan = uniform_plan(mod, dim, ratio)
    part = check(mod, plan, x, reference=ref, channel_blocks=True)
    records = check_records(part, None)
    names = [r.name for r in records]
    assert names == ["conv2d_0", "conv2d_0+channels", "conv2d_1", "conv2d_1+channels", "conv2d_2"]
    for conv_rec, block in zip(records[0:4:2], records[1:4:2]):
        assert block.dim == OC and block.axis == 1 and block.ratio == ratio
        assert block.input.same_as(conv_rec.output)
        assert [p.processor for p in block.parts] == [Processor.GPU, Processor.CPU]
        for p in block.parts:
            kinds = [v.name.rsplit("_", 1)[-1] for v in p.bindings]
            assert {"mean", "variance", "sqrt", "divide", "multiply"} <= set(kinds)
            assert p.input_region == p.region  # a channel reads only its own channel
    # the residual add of the second block reads its part's channels of x
    cpu_add = [v for v in records[3].parts[1].bindings if v.name.endswith("_arg1")]
    assert len(cpu_add) == 1 and int(cpu_add[0].ty.shape[1]) == 4 - records[3].parts[0].region[1]


def test_instance_norm_is_split_by_default_unless_asked():
    mod = make_module((1, 4, 9, 7), _conv_in_conv)
    plan = uniform_plan(mod, H, 0.5)
    part = PartitionOperators(plan, channel_blocks=False)(mod)
    assert [r.name for r in collect_parts(part)] == ["conv2d_0", "conv2d_1", "conv2d_2"]
    part = PartitionOperators(plan)(mod)
    assert len(collect_parts(part)) == 5


@pytest.mark.parametrize(
    "axes,keepdims", [((1,), True), ((1, 2, 3), True), ((2, 3), False)], ids=["C", "CHW", "flat"]
)
def test_norm_over_channels_is_not_split_on_channels(axes, keepdims):
    """A reduction over the channel axis (LayerNorm over C), or one that drops axes, mixes or
    moves channels: the block stays whole, and the model still computes the same."""

    def body(bb, x):
        y = conv(bb, x, 6, 3, 1, 1)
        mean = bb.emit(relax.op.mean(y, axis=list(axes), keepdims=keepdims))
        if not keepdims:
            mean = bb.emit(relax.op.reshape(mean, (1, 6, 1, 1)))
        return bb.emit(relax.op.subtract(y, mean))

    mod = make_module((1, 4, 9, 7), body)
    x = rand((1, 4, 9, 7), 1)
    part = check(mod, uniform_plan(mod, OC, 0.5), x, channel_blocks=True)
    assert [r.name for r in collect_parts(part)] == ["conv2d_0"]


def test_block_with_two_outputs_is_not_split():
    def body(bb, x):
        y = conv(bb, x, 6, 3, 1, 1)
        centred = bb.emit(
            relax.op.subtract(y, bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True)))
        )
        a = bb.emit(relax.op.nn.relu(centred))
        b = bb.emit(relax.op.sigmoid(centred))
        return bb.emit(relax.op.concat([conv(bb, a, 2, 1, seed=4), conv(bb, b, 2, 1, seed=5)], 1))

    mod = make_module((1, 4, 9, 7), body)
    part = check(mod, one_op("conv2d_0", H, 0.5), rand((1, 4, 9, 7), 1), channel_blocks=True)
    assert [r.name for r in collect_parts(part)] == ["conv2d_0"]


def test_instance_norm_takes_the_plans_block_ratio():
    """The planner's ``block_ratio`` (whole-model balance) sets the blocks' GPU share; after an
    operator kept whole on one processor its block stays whole there."""
    mod = make_module((1, 4, 9, 7), _conv_in_conv)
    x = rand((1, 4, 9, 7), 1)
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", H, 0.5), OpPartition("conv2d_1", OC, 0.0)),
        block_ratio=0.7,
    )
    part = check(mod, plan, x, channel_blocks=True)
    records = check_records(part, None)
    assert [r.name for r in records] == ["conv2d_0", "conv2d_0+channels", "conv2d_1"]
    block = records[1]
    assert block.ratio == 0.7
    assert [p.region for p in block.parts] == [(0, 4), (4, 6)]  # round(0.7 * 6) channels
    assert PartitionPlan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError, match=r"block_ratio.*outside"):
        PartitionPlan(block_ratio=1.5)
