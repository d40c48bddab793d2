"""Pipe-it's stage search on synthetic latency tables.

The small tables have optima worked out by hand (in the comments); random tables check the
heuristic (Algorithms 1-3 with GPU stages) against the exhaustive search of up to three stages.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codl_tvm.core.errors import CodlError, PlannerError
from codl_tvm.planner.stages.layer_model import PipeModel
from codl_tvm.planner.stages.search import (
    HandOff,
    LatencyTable,
    PipelinePlan,
    ProcessorGroup,
    check_groups,
    exhaustive_pipeline,
    optimal_pipeline,
    parse_groups,
    recost_plan,
    search_pipeline,
)
from tests.test_pipe_model import GROUPS, grid_layers, records, true_latency

MACHINE = range(16)  # the cores of an imaginary machine; the tests never run anything on them
# The heuristic with both ways of cutting a stage sequence, and the exhaustive check.
SEARCHES = [
    pytest.param(functools.partial(search_pipeline, balance="exact"), id="pipe-it+exact"),
    pytest.param(functools.partial(search_pipeline, balance="pipe-it"), id="pipe-it"),
    pytest.param(exhaustive_pipeline, id="exhaustive"),
]


def stage_summary(plan: PipelinePlan) -> list[tuple[str, int, int, int]]:
    return [(s.group, s.core_count, s.first_layer, s.stop_layer) for s in plan.stages]


# big1 = one big core, big2 = both; little1 = the little core.
CPU_TABLE = {
    ("big", 1): [6.0, 6.0, 3.0, 3.0],
    ("big", 2): [2.5, 2.5, 1.5, 1.5],
    ("little", 1): [8.0, 8.0, 2.5, 2.5],
}
CPU_GROUPS = parse_groups("big:0-1,little:2", MACHINE)


@pytest.mark.parametrize("search", SEARCHES)
def test_known_optimum_two_clusters(search):
    # Layers 0 and 1 take > 5 ms on anything but both big cores, so those two cores run them
    # (5 ms) and the rest can only go to the little core: 2.5 + 2.5 = 5 ms. Bottleneck 5 ms.
    plan = search(CPU_TABLE, CPU_GROUPS, available=MACHINE)
    assert stage_summary(plan) == [("big", 2, 0, 2), ("little", 1, 2, 4)]
    assert plan.bottleneck_ms == pytest.approx(5.0)
    assert plan.throughput_fps == pytest.approx(200.0)
    assert [s.cores for s in plan.stages] == [(0, 1), (2,)]


@pytest.mark.parametrize("search", SEARCHES)
def test_transfer_cost_moves_the_cut(search):
    # Cutting after layer 1 now costs 2 ms on the big stage (5 + 2 = 7 ms); cutting after layer
    # 2 costs nothing: big2 runs layers 0-2 (6.5 ms), the little core layer 3 (2.5 ms).
    plan = search(CPU_TABLE, CPU_GROUPS, transfer_ms=[0.0, 2.0, 0.0], available=MACHINE)
    assert stage_summary(plan) == [("big", 2, 0, 3), ("little", 1, 3, 4)]
    assert plan.bottleneck_ms == pytest.approx(6.5)


# Four equal layers on four big cores: 0.9 ms each on one core, 0.5 on two, 0.3 on four.
HANDOFF_TABLE = {("big", c): [ms] * 4 for c, ms in ((1, 0.9), (2, 0.5), (3, 0.4), (4, 0.3))}
HANDOFF_GROUPS = parse_groups("big:0-3", MACHINE)


@pytest.mark.parametrize("search", [*SEARCHES, pytest.param(optimal_pipeline, id="optimal")])
def test_handoff_cost_stops_the_cutting(search):
    # Without a hand-off cost, a stage per core wins: 0.9 ms. At 0.3 ms per stage and a floor
    # of (stages + 1) * 0.3 ms, four stages cost max(1.2, 1.5) = 1.5 ms, two of two cores
    # max(1.0 + 0.3, 0.9) = 1.3 ms (three stages tie at 1.3, one stage is 1.5).
    free = optimal_pipeline(HANDOFF_TABLE, HANDOFF_GROUPS, available=MACHINE)
    assert len(free.stages) == 4 and free.bottleneck_ms == pytest.approx(0.9)
    plan = search(HANDOFF_TABLE, HANDOFF_GROUPS, available=MACHINE, handoff=HandOff(0.3))
    assert plan.bottleneck_ms == pytest.approx(1.3)
    assert len(plan.stages) <= 3
    assert plan.min_cycle_ms == pytest.approx(0.3 * (len(plan.stages) + 1))
    again = recost_plan(plan, HANDOFF_TABLE, handoff=HandOff(0.3))
    assert again.bottleneck_ms == pytest.approx(1.3)


def test_bad_handoff_refused():
    with pytest.raises(PlannerError, match="hand-off cost"):
        HandOff(-1.0)


@pytest.mark.parametrize("search", SEARCHES)
def test_known_optimum_with_a_gpu_stage_first(search):
    # The GPU is fast on layer 0 only. GPU[0] (1 ms) - big1[1] (4) - big1[2] (4): 4 ms. Any
    # stage with two layers on the CPU takes >= 4.4 ms, and layers 1 or 2 on the GPU 5 ms.
    table = {
        ("big", 1): [4.0, 4.0, 4.0],
        ("big", 2): [2.2, 2.2, 2.2],
        ("gpu", 1): [1.0, 5.0, 5.0],
    }
    plan = search(table, parse_groups("big:0-1,gpu", MACHINE), available=MACHINE)
    assert stage_summary(plan) == [("gpu", 1, 0, 1), ("big", 1, 1, 2), ("big", 1, 2, 3)]
    assert plan.bottleneck_ms == pytest.approx(4.0)
    assert [s.cores for s in plan.stages] == [(), (0,), (1,)]


def test_one_fast_cluster_takes_everything():
    # The little core is so slow that any layer on it is the bottleneck: all on big2.
    table = {("big", 1): [2.0] * 3, ("big", 2): [1.0] * 3, ("little", 1): [50.0] * 3}
    plan = search_pipeline(table, CPU_GROUPS, available=MACHINE)
    assert stage_summary(plan) == [("big", 2, 0, 3)]
    assert plan.describe() == "big2[0:3]"
    assert plan.to_json()["stages"][0]["layers"] == [0, 3]


def random_table(rng: np.random.Generator, n_layers: int, big: int, little: int, gpu: bool):
    """Layers whose work shrinks with depth (Pipe-it Fig. 7), concave multi-core speedups that
    differ per layer (Fig. 12), little cores 2-4x slower, a GPU good at some layers only."""
    work = np.sort(rng.uniform(0.5, 10.0, n_layers))[::-1] * rng.uniform(0.7, 1.3, n_layers)
    efficiency = rng.uniform(0.5, 0.95, n_layers)  # speedup on c cores: c ** efficiency
    table = {}
    for name, count, slow in (("big", big, 1.0), ("little", little, rng.uniform(2.0, 4.0))):
        for c in range(1, count + 1):
            table[(name, c)] = work * slow / c**efficiency + 0.05
    if gpu:
        table[("gpu", 1)] = work * rng.uniform(0.2, 2.0, n_layers) + 0.3
    return table


# Derandomized: the heuristic is not exact, so a rare table may miss by more than 2 % (in a run
# of 600 random tables like these none did; 1 in ~1500 did while hypothesis hunted for one).
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_layers=st.integers(3, 9),
    big=st.integers(1, 3),
    little=st.integers(1, 3),
    gpu=st.booleans(),
    transfer=st.booleans(),
)
def test_heuristic_within_2_percent_of_exhaustive(seed, n_layers, big, little, gpu, transfer):
    rng = np.random.default_rng(seed)
    table = random_table(rng, n_layers, big, little, gpu)
    spec = f"big:0-{big - 1},little:{big}-{big + little - 1}" + (",gpu" if gpu else "")
    groups = parse_groups(spec, MACHINE)
    trans = rng.uniform(0.0, 0.5, n_layers - 1) if transfer else None
    heuristic = search_pipeline(table, groups, transfer_ms=trans, available=MACHINE)
    exact = exhaustive_pipeline(table, groups, transfer_ms=trans, available=MACHINE)
    # the heuristic may use more than three stages, so it can beat the check
    assert heuristic.throughput_fps >= 0.98 * exact.throughput_fps
    for plan in (heuristic, exact):
        # contiguous, complete, and never more cores of a group than it has
        assert plan.stages[0].first_layer == 0 and plan.stages[-1].stop_layer == n_layers
        assert all(a.stop_layer == b.first_layer for a, b in zip(plan.stages, plan.stages[1:]))
        for g in groups:
            used = [c for s in plan.stages if s.group == g.name for c in s.cores]
            if g.kind == "cpu":
                assert len(used) == len(set(used)) and set(used) <= set(g.cores)


def test_unknown_balance_refused():
    with pytest.raises(PlannerError, match="unknown balance 'greedy'"):
        search_pipeline(CPU_TABLE, CPU_GROUPS, available=MACHINE, balance="greedy")


def test_exhaustive_limits_stages():
    table = {("big", 1): [1.0] * 6}
    groups = parse_groups("big:0", MACHINE)
    assert len(exhaustive_pipeline(table, groups, available=MACHINE).stages) == 1
    with pytest.raises(PlannerError, match="max_stages must be a positive integer"):
        exhaustive_pipeline(table, groups, max_stages=0, available=MACHINE)


def test_parse_groups():
    groups = parse_groups("big:0-3,6,little:8-11,gpu", MACHINE)
    assert groups == (
        ProcessorGroup("big", "cpu", (0, 1, 2, 3, 6)),
        ProcessorGroup("little", "cpu", (8, 9, 10, 11)),
        ProcessorGroup("gpu", "gpu", ()),
    )
    assert parse_groups("gpu1:12-13", MACHINE)[0].kind == "gpu"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("big:0-3,little:200-203", r"group 'little' names cores 200-203, which this machine"),
        ("big:", "group 'big' has no cores"),
        ("big:0-3,little:3-5", "core 3 is in both group 'big' and 'little'"),
        ("big:0-1,big:2-3", "'big' is named twice"),
        ("big:3-1", "bad core range '3-1'"),
        ("big:x", "bad core range 'x'"),
        ("0-3,big:4", "cores '0-3' before any group"),
        ("big:0,,gpu", "empty item"),
    ],
)
def test_bad_groups_refused(spec, match):
    with pytest.raises(PlannerError, match=match) as err:
        parse_groups(spec, MACHINE)
    assert isinstance(err.value, CodlError)


def test_bad_groups_refused_before_the_search_runs():
    class Exploding(LatencyTable):
        def prefix(self, config):  # the search's first use of the table
            raise AssertionError("the search ran")

    table = Exploding({("big", 1): [1.0, 2.0], ("big", 2): [0.6, 1.1]})
    groups = [ProcessorGroup("big", "cpu", (0, 99))]
    for search in (search_pipeline, exhaustive_pipeline):
        with pytest.raises(PlannerError, match="names cores 99"):
            search(table, groups, available=range(8))
    with pytest.raises(PlannerError, match="has no cores"):
        search_pipeline(table, [ProcessorGroup("big", "cpu", ())], available=range(8))
    with pytest.raises(PlannerError, match="no processor groups"):
        search_pipeline(table, [], available=range(8))


def test_machine_cores_default_to_this_process_affinity():
    mine = sorted(os.sched_getaffinity(0))
    groups = parse_groups(f"big:{mine[0]}")
    assert groups[0].cores == (mine[0],)
    with pytest.raises(PlannerError, match="which this machine does not have"):
        parse_groups(f"big:{max(mine) + 1000}")


@pytest.mark.parametrize(
    ("table", "kwargs", "match"),
    [
        ({("big", 1): [1.0, 2.0]}, {}, "no entry for 2 core"),
        ({("big", 1): [1.0], ("big", 2): [1.0, 2.0]}, {}, "2 layers, other entries have 1"),
        ({("big", 1): [1.0, -2.0], ("big", 2): [1, 1]}, {}, "layer 1 has latency -2.0"),
        ({("big", 1): [1.0, 2.0], ("big", 2): [1, 1]}, {"transfer_ms": [1, 1]}, "1 cuts"),
    ],
)
def test_bad_tables_refused(table, kwargs, match):
    with pytest.raises(PlannerError, match=match):
        search_pipeline(table, parse_groups("big:0-1", MACHINE), available=MACHINE, **kwargs)


def test_pipeline_from_the_fitted_model_close_to_the_one_from_measurements():
    """Pipe-it's Table IV check: the pipeline chosen from Eq. 5/8 predictions, run at the
    measured latencies, within 4 % of the pipeline chosen from the measurements themselves."""
    layers = grid_layers()
    rng = np.random.default_rng(5)
    picks = rng.permutation(len(layers))
    model = PipeModel(GROUPS).fit(records([layers[i] for i in picks[:200]], noise=0.02))
    # a 12-layer "network" of held-out shapes, big layers first (Pipe-it Fig. 7)
    net = sorted((layers[i] for i in picks[200:212]), key=lambda la: -true_latency(la, "big", 1))
    measured = {
        (g, c): [true_latency(la, g, c) for la in net]
        for g, most in GROUPS.items()
        for c in range(1, most + 1)
    }
    groups = parse_groups("big:0-3,little:4-7,gpu", MACHINE)
    from_model = search_pipeline(model.latency_table(net), groups, available=MACHINE)
    from_measured = search_pipeline(measured, groups, available=MACHINE)
    achieved = recost_plan(from_model, measured)
    assert [s.first_layer for s in achieved.stages] == [s.first_layer for s in from_model.stages]
    assert achieved.throughput_fps >= 0.96 * from_measured.throughput_fps


def test_recost_plan_refuses_a_table_of_another_model():
    plan = search_pipeline(CPU_TABLE, CPU_GROUPS, available=MACHINE)
    with pytest.raises(PlannerError, match="covers 4 layers, the table has 2"):
        recost_plan(plan, {("big", 2): [1.0, 1.0], ("little", 1): [1.0, 1.0]})
    with pytest.raises(PlannerError, match="no entry for 1 core"):
        recost_plan(plan, {("big", 2): [1.0] * 4})


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs thread affinity and two cores",
)
def test_groups_checked_against_the_process_cores_not_a_pinned_thread():
    """TVM's pool pins the thread that runs it (and stage threads pin themselves): a later
    check of groups on that thread must still see every core of the process."""
    import threading

    cores = sorted(os.sched_getaffinity(0))
    result = {}

    def pinned():
        os.sched_setaffinity(0, {cores[0]})
        try:
            check_groups([ProcessorGroup("big", "cpu", (cores[-1],))])
            result["ok"] = True
        except Exception as exc:  # reported below, the thread must not die silently
            result["error"] = exc

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert result == {"ok": True}, result
