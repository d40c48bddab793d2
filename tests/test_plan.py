"""PartitionPlan: JSON round trip, validation errors, operator naming and uniform plans."""

from __future__ import annotations

import json

import pytest
from tvm import relax

from codl_tvm.core.plan import (
    PLAN_VERSION,
    ChainPlan,
    OpPartition,
    PartitionDim,
    PartitionPlan,
    PlanError,
    model_fingerprint,
    partitionable_ops,
    uniform_plan,
)
from tests.test_passes_split import conv, make_module, rand


def _net(bb, x):
    y = bb.emit(relax.op.nn.relu(conv(bb, x, 4, 3, 1, 1)))
    y = bb.emit(relax.op.nn.max_pool2d(y, 2, 2))
    y = conv(bb, y, 4, 3, 2, 1, seed=2)
    y = bb.emit(relax.op.reshape(y, (1, 16)))
    return bb.emit(relax.op.matmul(y, relax.const(rand((16, 5), 3))))


@pytest.fixture(scope="module")
def mod():
    return make_module((1, 3, 8, 8), _net)


def _plan():
    return PartitionPlan(
        ops=(OpPartition("conv2d_0", "H", 0.5), OpPartition("matmul_3", PartitionDim.OC, 1)),
        chains=(ChainPlan(("max_pool2d_1", "conv2d_2"), "oc", 0.25),),
        model_fingerprint="abc",
    )


def test_json_round_trip(tmp_path):
    plan = _plan()
    text = plan.to_json()
    data = json.loads(text)
    assert data == {
        "version": PLAN_VERSION,
        "model_fingerprint": "abc",
        "home": "gpu",
        "ops": [
            {"op": "conv2d_0", "dim": "H", "ratio": 0.5},
            {"op": "matmul_3", "dim": "OC", "ratio": 1.0},
        ],
        "chains": [{"ops": ["max_pool2d_1", "conv2d_2"], "dim": "OC", "ratio": 0.25}],
    }
    assert PartitionPlan.from_json(text) == plan
    path = tmp_path / "plan.json"
    plan.save(path)
    assert PartitionPlan.load(path) == plan
    assert PartitionPlan.from_json('{"version": 1}') == PartitionPlan()
    # home: optional (plans written before it run their unplanned kernels on the GPU)
    cpu_home = PartitionPlan.from_json('{"version": 1, "home": "cpu"}')
    assert cpu_home.home == "cpu" and PartitionPlan.from_json(cpu_home.to_json()) == cpu_home
    with pytest.raises(PlanError, match="home must be 'gpu' or 'cpu', got 'npu'"):
        PartitionPlan.from_json('{"version": 1, "home": "npu"}')
    # entries(): every partition as a chain
    assert [(c.ops, c.dim, c.ratio) for c in plan.entries()] == [
        (("conv2d_0",), PartitionDim.H, 0.5),
        (("matmul_3",), PartitionDim.OC, 1.0),
        (("max_pool2d_1", "conv2d_2"), PartitionDim.OC, 0.25),
    ]


@pytest.mark.parametrize("ratio", [-0.1, 1.5, float("nan"), "0.5", True, None])
def test_ratio_outside_unit_interval(ratio):
    with pytest.raises(PlanError, match="op conv2d_0: ratio"):
        OpPartition("conv2d_0", "H", ratio)
    with pytest.raises(PlanError, match="ratio"):
        PartitionPlan.from_dict(
            {"version": 1, "chains": [{"ops": ["a"], "dim": "H", "ratio": ratio}]}
        )


def test_unknown_dim():
    with pytest.raises(PlanError, match=r"unknown partition dimension 'W'.*\['H', 'OC'\]"):
        OpPartition("conv2d_0", "W", 0.5)
    with pytest.raises(PlanError, match="chain \\['a', 'b'\\]: unknown partition dimension"):
        PartitionPlan.from_json(
            '{"version": 1, "chains": [{"ops": ["a", "b"], "dim": "IC", "ratio": 0.5}]}'
        )


def test_version_mismatch_and_malformed_json(tmp_path):
    with pytest.raises(PlanError, match=r"plan version 2 is not supported .*reads version 1"):
        PartitionPlan.from_json('{"version": 2, "ops": []}')
    with pytest.raises(PlanError, match="plan version 0"):
        PartitionPlan(version=0)
    with pytest.raises(PlanError, match="missing 'version'"):
        PartitionPlan.from_json('{"ops": []}')
    with pytest.raises(PlanError, match="not valid JSON"):
        PartitionPlan.from_json("{version: 1")
    with pytest.raises(PlanError, match=r"unknown field\(s\) \['opps'\]"):
        PartitionPlan.from_json('{"version": 1, "opps": []}')
    with pytest.raises(PlanError, match=r"ops\[0\] .*missing \['ratio'\]"):
        PartitionPlan.from_json('{"version": 1, "ops": [{"op": "x", "dim": "H"}]}')
    with pytest.raises(PlanError, match="no such plan file"):
        PartitionPlan.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 3}')
    with pytest.raises(PlanError, match=r"bad.json: plan version 3"):
        PartitionPlan.load(bad)


def test_operator_partitioned_twice_or_empty_chain():
    with pytest.raises(PlanError, match="conv2d_0 is already partitioned by op conv2d_0"):
        PartitionPlan(
            ops=(OpPartition("conv2d_0", "H", 0.5),),
            chains=(ChainPlan(("conv2d_0", "conv2d_2"), "H", 0.5),),
        )
    with pytest.raises(PlanError, match="needs a non-empty list"):
        ChainPlan((), "H", 0.5)
    with pytest.raises(PlanError, match="appears twice"):
        ChainPlan(("a", "a"), "H", 0.5)


def test_operator_names_and_validation(mod):
    infos = partitionable_ops(mod)
    assert [(i.name, i.index, i.kind) for i in infos] == [
        ("conv2d_0", 0, "conv2d"),
        ("max_pool2d_1", 1, "max_pool2d"),
        ("conv2d_2", 2, "conv2d"),
        ("matmul_3", 3, "matmul"),
    ]
    assert infos[2].input_shape == (1, 4, 4, 4) and infos[2].weight_shape == (4, 4, 3, 3)
    assert infos[2].output_shape == (1, 4, 2, 2)
    assert infos[2].attrs == {
        "strides": [2, 2],
        "padding": [1, 1, 1, 1],
        "dilation": [1, 1],
        "groups": 1,
    }
    ok = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5),))
    assert set(ok.validate(mod)) == {i.name for i in infos}
    with pytest.raises(
        PlanError,
        match=r"op conv2d_9: the module has no partitionable operator "
        r"'conv2d_9' \(it has: conv2d_0, max_pool2d_1",
    ):
        PartitionPlan(ops=(OpPartition("conv2d_9", "H", 0.5),)).validate(mod)
    with pytest.raises(
        PlanError,
        match=r"matmul_3 \(matmul, input \(1, 16\)\) cannot be split "
        "along H",
    ):
        PartitionPlan(ops=(OpPartition("matmul_3", "H", 0.5),)).validate(mod)
    with pytest.raises(PlanError, match="model fingerprint abc, this module has"):
        _plan().validate(mod)


def test_uniform_plan(mod):
    plan_h = uniform_plan(mod, "H", 0.4)
    assert [(p.op, p.dim, p.ratio) for p in plan_h.ops] == [
        ("conv2d_0", PartitionDim.H, 0.4),
        ("max_pool2d_1", PartitionDim.H, 0.4),
        ("conv2d_2", PartitionDim.H, 0.4),
    ]  # matmul has no H split: left unsplit
    assert plan_h.model_fingerprint == model_fingerprint(mod)
    plan_h.validate(mod)
    plan_oc = uniform_plan(mod, PartitionDim.OC, 1.0)
    assert [p.op for p in plan_oc.ops][-1] == "matmul_3"
    assert PartitionPlan.from_json(plan_oc.to_json()) == plan_oc
    with pytest.raises(PlanError, match="ratio 2 is outside"):
        uniform_plan(mod, "H", 2)


def test_fingerprint_changes_with_shapes(mod):
    other = make_module(
        (1, 3, 10, 8), lambda bb, x: bb.emit(relax.op.nn.relu(conv(bb, x, 4, 3, 1, 1)))
    )
    assert model_fingerprint(other) != model_fingerprint(mod)
    assert model_fingerprint(mod) == model_fingerprint(make_module((1, 3, 8, 8), _net))
