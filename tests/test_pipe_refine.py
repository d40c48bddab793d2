"""Planning on measured stages: a table's measured stages replace the sums of their layers in
every search, and :func:`refine_with_stages` ends in the optimum of the stages' true times
where the sums underestimate them (a stage of many layers evicting its own weights)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codl_tvm.core.errors import PlannerError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.planner.stages.refine import refine_with_stages
from codl_tvm.planner.stages.search import (
    HandOff,
    LatencyTable,
    ProcessorGroup,
    exhaustive_pipeline,
    optimal_pipeline,
    recost_plan,
    search_pipeline,
)
from codl_tvm.profiling.layers import build_layer_libraries, measure_layers, stage_timer
from tests.test_transform_stages import _residual_cnn

GROUPS = (ProcessorGroup("big", "cpu", (0, 1)), ProcessorGroup("little", "cpu", (2, 3)))
CORES = [0, 1, 2, 3]


def _table(seed: int = 0, n: int = 8) -> LatencyTable:
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.0, 4.0, n)
    ms = {}
    for name, slow in (("big", 1.0), ("little", 2.5)):
        for c in (1, 2):
            ms[(name, c)] = base * slow / (0.9 * c)
    return LatencyTable(ms)


def _true_ms(table: LatencyTable, group: str, cores: int, first: int, stop: int) -> float:
    """A stage's "true" time: the sum of its layers, 12 % more per layer beyond the first
    (never below the sum, as a stage of many layers evicting its own weights)."""
    layers = stop - first
    return float(np.sum(table[(group, cores)][first:stop])) * (1 + 0.12 * (layers - 1))


def _all_measured(table: LatencyTable) -> LatencyTable:
    n = table.n_layers
    return table.with_stages(
        {
            (g, c, a, b): _true_ms(table, g, c, a, b)
            for g, c in table.keys()
            for a, b in itertools.combinations(range(n + 1), 2)
        }
    )


def test_measured_stages_replace_the_sums_in_every_search():
    table = _table()
    plan = optimal_pipeline(table, GROUPS, available=CORES)
    # measure the optimum's slowest stage 3x slower than its layers' sum
    slow = max(plan.stages, key=lambda s: s.latency_ms)
    key = (slow.group, slow.core_count, slow.first_layer, slow.stop_layer)
    t2 = table.with_stages({key: 3 * float(np.sum(table[key[:2]][key[2] : key[3]]))})
    assert t2.stage_ms == {key: pytest.approx(3 * slow.latency_ms)}
    again = optimal_pipeline(t2, GROUPS, available=CORES)
    assert key not in {(s.group, s.core_count, s.first_layer, s.stop_layer) for s in again.stages}
    # the same plan recosted on the table with the stage measured: that stage at 3x
    assert recost_plan(plan, t2).bottleneck_ms == pytest.approx(3 * slow.latency_ms)
    # the search and the exhaustive check agree on it (both see the measured stage)
    assert search_pipeline(t2, GROUPS, available=CORES).bottleneck_ms == pytest.approx(
        again.bottleneck_ms
    )
    ex = exhaustive_pipeline(t2, GROUPS, max_stages=4, available=CORES)
    assert ex.bottleneck_ms == pytest.approx(again.bottleneck_ms)
    heur = search_pipeline(t2, GROUPS, available=CORES, balance="pipe-it", exact_stages=False)
    assert key not in {(s.group, s.core_count, s.first_layer, s.stop_layer) for s in heur.stages}


def test_measured_stage_keys_are_checked():
    table = _table()
    with pytest.raises(PlannerError, match="no entry for 3 core"):
        table.with_stages({("big", 3, 0, 2): 1.0})
    with pytest.raises(PlannerError, match=r"layers \[4, 9\) outside"):
        table.with_stages({("big", 1, 4, 9): 1.0})
    with pytest.raises(PlannerError, match="must be finite"):
        table.with_stages({("big", 1, 0, 2): float("nan")})


@pytest.mark.parametrize("seed", range(4))
def test_refinement_ends_in_the_optimum_of_the_true_stage_times(seed):
    table = _table(seed)
    truth = optimal_pipeline(_all_measured(table), GROUPS, available=CORES)
    calls = []

    def measure(plan):
        calls.append(plan.describe())
        return [
            _true_ms(table, s.group, s.core_count, s.first_layer, s.stop_layer) for s in plan.stages
        ]

    got = refine_with_stages(table, GROUPS, measure, rounds=200, available=CORES)
    assert got.converged
    assert got.plan.bottleneck_ms == pytest.approx(truth.bottleneck_ms)
    # every stage of the kept plan is measured, at its true time
    for s in got.plan.stages:
        want = _true_ms(table, s.group, s.core_count, s.first_layer, s.stop_layer)
        assert got.table.stage_ms[(s.group, s.core_count, s.first_layer, s.stop_layer)] == (
            pytest.approx(want)
        )
    # the sums' optimum underestimates its bottleneck; refinement measured it and moved on
    summed = optimal_pipeline(table, GROUPS, available=CORES)
    assert summed.bottleneck_ms < got.plan.bottleneck_ms
    assert len(calls) == len(got.rounds) == len(set(calls))


def test_out_of_rounds_keeps_the_lowest_measured_bottleneck():
    table = _table(1)

    def measure(plan):
        return [
            _true_ms(table, s.group, s.core_count, s.first_layer, s.stop_layer) for s in plan.stages
        ]

    got = refine_with_stages(table, GROUPS, measure, rounds=2, available=CORES)
    assert not got.converged and len(got.rounds) == 2
    assert got.plan.bottleneck_ms == pytest.approx(min(r["measured_ms"] for r in got.rounds))
    assert got.to_json()["measured_stages"] == len(got.table.stage_ms)
    with pytest.raises(PlannerError, match=r"measured \d+ stage times for a plan of"):
        refine_with_stages(table, GROUPS, lambda p: [1.0] * (len(p.stages) + 1), available=CORES)
    with pytest.raises(PlannerError, match="stage rounds must be >= 1"):
        refine_with_stages(table, GROUPS, measure, rounds=0, available=CORES)


def test_handoff_is_added_to_measured_stages():
    table = _table(2)
    handoff = HandOff(0.5)
    plan = optimal_pipeline(table, GROUPS, available=CORES, handoff=handoff)
    s = plan.stages[0]
    key = (s.group, s.core_count, s.first_layer, s.stop_layer)
    t2 = table.with_stages({key: 10.0})
    assert recost_plan(plan, t2, handoff=handoff).stages[0].latency_ms == pytest.approx(10.5)


def test_stage_timer_times_each_stage_of_a_real_plan(tmp_path):
    model = load_onnx(_residual_cnn())
    groups = (ProcessorGroup("big", "cpu", (0,)), ProcessorGroup("little", "cpu", (1,)))
    libs = build_layer_libraries(model, groups, tmp_path, isa={"little": "x86-64-v2"})
    table = measure_layers(model, groups, libs, number=1, repeat=1)
    measure = stage_timer(model, groups, libs, passes=2)
    plan = search_pipeline(table, groups, available=[0, 1])
    ms = measure(plan)
    assert len(ms) == len(plan.stages) and all(m > 0 for m in ms)
    got = refine_with_stages(table, groups, measure, rounds=8, available=[0, 1])
    for s in got.plan.stages:
        assert (s.group, s.core_count, s.first_layer, s.stop_layer) in got.table.stage_ms
    # a stage that cannot run is reported, after every stage stopped
    libs["little"] = tmp_path / "broken.so"
    libs["little"].write_bytes(b"not a library")
    two = search_pipeline(
        LatencyTable({("big", 1): [1, 1, 1, 1], ("little", 1): [1, 1, 1, 1]}),
        groups,
        available=[0, 1],
    )
    assert {s.group for s in two.stages} == {"big", "little"}
    with pytest.raises(PlannerError, match=r"timing the stages of .* failed"):
        stage_timer(model, groups, libs, passes=2)(two)
