"""HOPE's placement pays the image conversions of CoDL's hybrid data type on its edges.

Where the GPU computes on images (``PlannerConfig.images``), ``codl.PackGpuParts`` packs a
tensor a GPU conv reads from the CPU and unpacks an image result the CPU reads; packed values
flow from GPU operator to GPU operator without a conversion. The operator graph charges the
same conversions, predicted by the calibrated cost model's ``image_pack`` / ``image_unpack``
sharing kinds as the split planner charges a GPU part, to the edges that cross the processors
in that direction (``DagEdge.pack_ms`` / ``unpack_ms``). Cost models are synthetic device
pairs with a conversion fit added (real ``SharingModel`` objects); nothing is measured.
"""

from __future__ import annotations

import copy

import pytest

from codl_tvm.core.errors import PlannerError
from codl_tvm.cost_model.base import IMAGE_SHARING_KINDS
from codl_tvm.cost_model.features import OpParams
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.planner.placement.graph import CoexecCosts, DagEdge, DagNode, OpGraph, build_graph
from codl_tvm.planner.placement.hope import (
    check_schedule,
    greedy_schedule,
    mosaic_schedule,
    simulate,
    solve_exact,
    starpu_schedule,
)
from codl_tvm.planner.placement.modes import PlacementConfig, make_plan, schedule_placement
from codl_tvm.planner.split.config import PlannerConfig
from codl_tvm.planner.split.predict import calibrated_model, on_images

from .test_hope import inception_like

PACK, UNPACK = IMAGE_SHARING_KINDS
PLAIN = PlacementConfig(costs=CoexecCosts())
IMAGES = PlannerConfig(gpu_images=True)
MODES = ("hope", "hope_greedy", "starpu", "mosaic", "codl_hope")


def exact_schedule(g: OpGraph):
    return solve_exact(g, time_limit_s=10)


SCHEDULERS = (exact_schedule, greedy_schedule, starpu_schedule, mosaic_schedule)


def _with_conversion(model, intercept_ms: float, ms_per_byte: float = 0.0):
    """A copy of ``model`` whose image conversions cost ``intercept + slope * bytes`` each
    way (in its sharing model, as ``SharingModel.with_conversion`` adds the profile's fit)."""
    fit = {"intercept_ms": intercept_ms, "ms_per_byte": ms_per_byte, "n": 3}
    out = copy.copy(model)
    out.sharing = model.sharing.with_conversion({"pack": fit, "unpack": fit})
    return out


@pytest.fixture(scope="module")
def mod():
    from codl_tvm.frontend.importer import load_onnx

    return load_onnx(inception_like()).mod


@pytest.fixture(scope="module")
def base_model():
    # cheap transfers: the exact placement runs the Inception branches on both processors
    return synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.05))


def _crossing_conversions(graph: OpGraph, procs) -> float:
    """The image conversions a placement pays on its edges across the processors."""
    return sum(
        graph.conversion_ms(j, i, procs[i])
        for i in range(len(graph))
        for j in graph.preds(i)
        if {procs[i], procs[j]} == {"cpu", "gpu"}
    )


# -- the graph ----------------------------------------------------------------------------------


def line(pack_ms: float = 0.0, unpack_ms: float = 0.0) -> OpGraph:
    """a -> b -> c: a and c fast on the CPU, b fast on the GPU; 0.5 ms transfers."""
    return OpGraph(
        (DagNode("a", 1.0, 10.0), DagNode("b", 10.0, 2.0), DagNode("c", 1.0, 10.0)),
        (
            DagEdge("a", "b", 0.5, 64, pack_ms, unpack_ms),
            DagEdge("b", "c", 0.5, 64, 0.0, unpack_ms),
        ),
        home="cpu",
    )


def test_an_edge_pays_its_pack_to_the_gpu_and_its_unpack_to_the_cpu():
    g = line(pack_ms=1.0, unpack_ms=2.0)
    a, b = g.index("a"), g.index("b")
    assert g.delay_ms(a, b, "cpu", "gpu") == 1.5  # transfer + pack
    assert g.delay_ms(a, b, "gpu", "cpu") == 2.5  # transfer + unpack
    assert g.delay_ms(a, b, "gpu", "gpu") == g.delay_ms(a, b, "cpu", "cpu") == 0.0
    assert g.delay_ms(a, b, "both", "gpu") == 0.0  # a split's Eq. 2 holds its conversions
    assert (g.conversion_ms(a, b, "gpu"), g.conversion_ms(a, b, "cpu")) == (1.0, 2.0)
    assert g.transfer_ms(a, b) == 0.5
    # buffers: no conversion, the same delays as before images
    assert line().delay_ms(a, b, "cpu", "gpu") == line().transfer_ms(a, b) == 0.5
    # the co-execution costs and a contraction keep the conversions
    costly = g.with_costs(CoexecCosts(cross_edge_ms=0.25))
    assert costly.delay_ms(a, b, "cpu", "gpu") == 1.75
    chain = g.contract(("b", "c"), DagNode("b..c", 11.0, 12.0))
    assert chain.edges == (DagEdge("a", "b..c", 0.5, 64, 1.0, 2.0),)
    with pytest.raises(PlannerError, match="finite pack_ms"):
        OpGraph((DagNode("a", 1, 1), DagNode("b", 1, 1)), (DagEdge("a", "b", 0, 0, -1.0),))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_conversions_delay_or_undo_a_gpu_detour(scheduler):
    """Before (buffers): a CPU [0, 1], b GPU [1.5, 3.5], c CPU [4, 5]: 5 ms (all CPU: 12).
    With 1 ms each way: the same placement, 2 ms later (b's pack and c's input's unpack);
    with 4 ms each way the detour costs 13 ms: everything on the CPU, 12 ms (StarPU's earliest
    finish, blind to c, keeps the detour and pays its 8 ms)."""
    before = scheduler(line())
    assert before.processor == ("cpu", "gpu", "cpu") and before.makespan_ms == pytest.approx(5.0)
    cheap = scheduler(line(1.0, 1.0))
    check_schedule(line(1.0, 1.0), cheap)
    assert cheap.processor == before.processor
    assert cheap.makespan_ms == pytest.approx(before.makespan_ms + 2.0)
    costly = scheduler(line(4.0, 4.0))
    check_schedule(line(4.0, 4.0), costly)
    if scheduler is starpu_schedule:
        assert costly.processor == before.processor
        assert costly.makespan_ms == pytest.approx(before.makespan_ms + 8.0)
    else:
        assert costly.processor == ("cpu",) * 3 and costly.makespan_ms == pytest.approx(12.0)


def test_the_graph_charges_each_edge_as_the_image_build_converts(mod, base_model):
    """Images on: a conv on the GPU packs what it reads from the CPU; a conv's (or a pool's
    behind it) image result is unpacked for the CPU; the concat of the branches reads images
    and packs nothing. Images off: every conversion 0, the graph as before."""
    model = _with_conversion(base_model, 0.5, 1e-6)
    calibrated, _ = calibrated_model(model, IMAGES)
    g = build_graph(mod, calibrated, IMAGES)
    concat = g.nodes[-1].name
    nbytes = 8 * 16 * 16 * 4
    pack = model.predict_sharing(PACK, nbytes)
    unpack = model.predict_sharing(UNPACK, nbytes)
    expected = {
        ("conv2d_0", "conv2d_1"): (pack, unpack),
        ("conv2d_0", "conv2d_2"): (pack, unpack),
        ("conv2d_0", "max_pool2d_4"): (0.0, unpack),  # a pool reading the CPU is not packed
        ("conv2d_2", "conv2d_3"): (pack, unpack),
        ("max_pool2d_4", "conv2d_5"): (pack, unpack),  # the pool behind conv2d_0 is packed
        ("conv2d_1", concat): (0.0, unpack),
        ("conv2d_3", concat): (0.0, unpack),
        ("conv2d_5", concat): (0.0, unpack),
    }
    assert {(e.src, e.dst): (e.pack_ms, e.unpack_ms) for e in g.edges} == expected
    assert pack == pytest.approx(0.5 + 1e-6 * nbytes)
    buffers = build_graph(mod, calibrated_model(model, PlannerConfig())[0])
    assert all(e.pack_ms == e.unpack_ms == 0.0 for e in buffers.edges)
    assert [e.transfer_ms for e in buffers.edges] == [e.transfer_ms for e in g.edges]


def test_a_conv_short_of_whole_pixels_stays_in_buffers():
    """The texture layout packs only convs writing whole pixels (OC a multiple of 4)."""
    conv = dict(op="conv2d", h=8, w=8, ic=8, kernel=3, stride=1)
    assert on_images(OpParams(oc=8, **conv))
    assert not on_images(OpParams(oc=10, **conv))
    assert not on_images(OpParams(op="pool", h=8, w=8, ic=8, oc=8, kernel=2, stride=2))


# -- plans --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_buffers_plans_are_byte_identical(mod, base_model, mode):
    """Images off, or on without a measured conversion: the plan is the buffers' plan byte for
    byte, and off its report too (no conversion_ms, no words about conversions)."""
    plan, report = make_plan(mod, base_model, mode, placement=PLAIN)
    costly = _with_conversion(base_model, 100.0)
    plan2, report2 = make_plan(mod, costly, mode, placement=PLAIN)
    assert plan2.to_json() == plan.to_json() and report2.to_json() == report.to_json()
    assert all("conversion_ms" not in d.to_dict() for d in report.decisions)
    plan3, report3 = make_plan(mod, base_model, mode, IMAGES, placement=PLAIN)
    assert plan3.to_json() == plan.to_json()
    assert report3.summary == report.summary
    assert [d.reason for d in report3.decisions] == [d.reason for d in report.decisions]


def test_costly_conversions_keep_hope_off_converting_edges(mod, base_model):
    """Without conversions the exact placement crosses the processors at edges that would
    convert; with 50 ms conversions none of its crossing edges converts (the placement
    changes), and it is predicted slower than before, never below the faster processor."""
    free = schedule_placement(mod, base_model, "hope", IMAGES, placement=PLAIN)
    costly_model = _with_conversion(base_model, 50.0)
    free_graph = build_graph(mod, calibrated_model(costly_model, IMAGES)[0], IMAGES)
    assert _crossing_conversions(free_graph, free.schedule.processor) > 0
    costly = schedule_placement(mod, costly_model, "hope", IMAGES, placement=PLAIN)
    assert costly.schedule.processor != free.schedule.processor
    assert _crossing_conversions(costly.graph, costly.schedule.processor) == 0.0
    assert costly.schedule.makespan_ms > free.schedule.makespan_ms
    assert costly.schedule.makespan_ms <= min(costly.single_ms.values()) + 1e-9


def test_the_report_shows_each_gpu_operators_conversions(mod, base_model):
    """Cheap conversions keep a mixed placement: each operator on the GPU reports the
    conversions its edges across the processors pay (the pack of what it reads from the CPU,
    the unpack of its result for the CPU), in the split planner's words."""
    model = _with_conversion(base_model, 1e-3)
    scheduled = schedule_placement(mod, model, "hope", IMAGES, placement=PLAIN)
    g, procs = scheduled.graph, scheduled.schedule.processor
    assert {"cpu", "gpu"} <= set(procs)
    _, report = make_plan(mod, model, "hope", IMAGES, placement=PLAIN)
    rows = {d.ops[0]: d for d in report.decisions}
    shown = 0
    for i, node in enumerate(g.nodes):
        if node.op is None:
            continue
        row = rows[node.name]
        if procs[i] == "cpu":
            assert row.conversion_ms is None
            continue
        packs = sum(g.conversion_ms(j, i, "gpu") for j in g.preds(i) if procs[j] == "cpu")
        unpacks = [g.conversion_ms(i, k, "cpu") for k in g.succs(i) if procs[k] == "cpu"]
        assert row.conversion_ms == pytest.approx(packs + max(unpacks, default=0.0))
        if row.conversion_ms:
            shown += 1
            assert f", {row.conversion_ms:.3f} of it image conversions" in row.reason
            assert row.to_dict()["conversion_ms"] == row.conversion_ms
    assert shown, "some GPU operator crosses the processors"


def test_codl_hope_splits_report_their_conversions(mod):
    """A split offered to ``codl_hope`` carries its Eq. 2 conversions, shown as the split
    planner shows them."""
    model = _with_conversion(synthetic_cost_model(SyntheticDevice()), 1e-4, 1e-12)
    g = build_graph(mod, calibrated_model(model, IMAGES)[0], IMAGES, splits=True)
    split = [n for n in g.nodes if n.split_ms is not None]
    assert split and all(n.split_conversion_ms is not None for n in split)
    assert any(n.split_conversion_ms > 0 for n in split)
    assert all(n.split_conversion_ms is None for n in build_graph(mod, model, splits=True).nodes)
    _, report = make_plan(mod, model, "codl_hope", IMAGES, placement=PLAIN)
    for d in report.decisions:
        if d.ratio is not None and 0.0 < d.ratio < 1.0 and d.conversion_ms:
            assert "of it image conversions" in d.reason


def test_schedules_stay_valid_and_exact_stays_best_with_conversions(mod, base_model):
    model = _with_conversion(base_model, 0.01, 1e-6)
    g = build_graph(mod, calibrated_model(model, IMAGES)[0], IMAGES)
    exact, *heuristics = (scheduler(g) for scheduler in SCHEDULERS)
    for s in (exact, *heuristics):
        check_schedule(g, s)
        assert simulate(g, s.processor).makespan_ms >= exact.makespan_ms - 1e-9
