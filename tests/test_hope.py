"""HOPE's DAG placement: the operator graph, the exact and greedy schedulers, the baselines.

The hand-made graphs have optimal makespans worked out in the comments; nothing is measured.
Cost models for the graph tests are CodlModels fitted on a synthetic device pair
(``codl_tvm.cost_model.synthetic``).
"""

from __future__ import annotations

import builtins
import random

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from codl_tvm.core.errors import CodlError, PlanError, PlannerError
from codl_tvm.core.plan import PartitionPlan, partitionable_ops
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.planner.placement.graph import CoexecCosts, DagEdge, DagNode, OpGraph, build_graph
from codl_tvm.planner.placement.hope import (
    Schedule,
    ScheduleError,
    SolverMissingError,
    check_schedule,
    greedy_schedule,
    lower_bound_ms,
    mosaic_schedule,
    partition_by_upward_rank,
    solve_exact,
    starpu_schedule,
)
from codl_tvm.planner.placement.modes import PlacementConfig

HEURISTICS = (greedy_schedule, starpu_schedule, mosaic_schedule)
# Plans without co-execution costs (the synthetic models record none; explicit, as these tests
# check the schedulers and plans, not the costs).
PLAIN = PlacementConfig(costs=CoexecCosts())
MODES_PLACED = ("hope", "hope_greedy", "starpu", "mosaic")


def graph(nodes, edges, home="gpu") -> OpGraph:
    """``nodes``: (name, cpu_ms, gpu_ms[, follows]); ``edges``: (src, dst, transfer_ms)."""
    return OpGraph(
        tuple(DagNode(n[0], n[1], n[2], *(n[3:] or ())) for n in nodes),
        tuple(DagEdge(s, d, t) for s, d, t in edges),
        home,
    )


def all_schedules(g: OpGraph) -> list[Schedule]:
    out = [solve_exact(g, time_limit_s=10)] + [h(g) for h in HEURISTICS]
    for s in out:
        check_schedule(g, s)
    return out


# -- hand-made graphs with known optima ----------------------------------------------------------


def test_diamond():
    # a -> b, c -> d; b and c take 4 ms anywhere, so they must run in parallel: one of them on a
    # processor other than a's or d's pays one 1 ms transfer. a on the GPU [0, 1], b on the CPU
    # [2, 6], c on the GPU [1, 5], d on either: CPU at max(6, 5 + 1) -> 8, GPU at 6 + 1 -> 8.
    # Every other mapping is no faster (all GPU: 10, all CPU: 12).
    g = graph(
        [("a", 2, 1), ("b", 4, 4), ("c", 4, 4), ("d", 2, 1)],
        [("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)],
    )
    exact, greedy, starpu, mosaic = all_schedules(g)
    assert exact.makespan_ms == pytest.approx(8.0)
    assert exact.status == "optimal" and exact.gap == 0.0
    assert {exact.processor[1], exact.processor[2]} == {"cpu", "gpu"}
    assert greedy.makespan_ms == pytest.approx(8.0)
    assert starpu.makespan_ms == pytest.approx(8.0)
    # MOSAIC runs slices of the order a, b, c, d: b and c in one slice (no parallelism)
    assert mosaic.makespan_ms == pytest.approx(10.0)


def test_two_parallel_chains():
    # a1 -> a2 (2 ms on the GPU, 4 on the CPU) and b1 -> b2 (3 ms on either). Chain a on the GPU
    # (4 ms) and chain b on the CPU (6 ms): 6. Three ops on the GPU take at least 2+2+3 = 7;
    # chain a on the CPU takes 8; so 6 is optimal.
    g = graph(
        [("a1", 4, 2), ("a2", 4, 2), ("b1", 3, 3), ("b2", 3, 3)],
        [("a1", "a2", 1), ("b1", "b2", 1)],
    )
    exact, *_ = all_schedules(g)
    assert exact.makespan_ms == pytest.approx(6.0)
    assert exact.processor == ("gpu", "gpu", "cpu", "cpu")
    assert exact.order("gpu") == [0, 1] and exact.order("cpu") == [2, 3]


def test_expensive_transfer_keeps_a_chain_on_one_processor():
    # Each op alone prefers a different processor (1 ms against 5), but every move costs 10 ms:
    # alternating takes 1 + 10 + 1 + 10 + 1 = 23, all on the GPU 11, all on the CPU 7.
    g = graph(
        [("x", 1, 5), ("y", 5, 1), ("z", 1, 5)],
        [("x", "y", 10), ("y", "z", 10)],
    )
    for s in all_schedules(g):
        assert s.makespan_ms == pytest.approx(7.0), s.method
        assert s.processor == ("cpu", "cpu", "cpu"), s.method


def test_follow_nodes_obey_the_placement_rule():
    # j (a concat, 0 ms) follows its producers: both on the CPU -> CPU, mixed -> home (GPU).
    # Best: p and q in parallel on different processors, j on the GPU, r (1 ms on the GPU)
    # after it: p on the CPU [0, 3], transfer 1 -> j at 4, r [4, 5] on the GPU.
    g = graph(
        [("p", 3, 3), ("q", 3, 3), ("j", 0, 0, True), ("r", 1, 1)],
        [("p", "j", 1), ("q", "j", 1), ("j", "r", 1)],
    )
    exact, *_ = all_schedules(g)
    assert exact.makespan_ms == pytest.approx(5.0)
    assert exact.processor[2] == "gpu" and exact.processor[3] == "gpu"
    bad = Schedule(
        ("cpu", "gpu", "cpu", "cpu"), (0, 0, 4, 4), (3, 3, 4, 5), 5.0, "hand", "heuristic"
    )
    with pytest.raises(ScheduleError, match="follow rule puts it on gpu"):
        check_schedule(g, bad)


def test_checker_rejects_each_violation():
    g = graph([("a", 2, 1), ("b", 2, 1)], [("a", "b", 5)])

    def sched(procs, start, finish):
        return Schedule(procs, start, finish, max(finish), "hand")

    check_schedule(g, sched(("gpu", "cpu"), (0, 6), (1, 8)))
    with pytest.raises(ScheduleError, match="plus 5 ms of transfer"):
        check_schedule(g, sched(("gpu", "cpu"), (0, 5), (1, 7)))
    with pytest.raises(ScheduleError, match="runs 2 ms on gpu, predicted 1"):
        check_schedule(g, sched(("gpu", "gpu"), (0, 1), (2, 3)))
    h = graph([("a", 2, 1), ("b", 2, 1)], [])
    with pytest.raises(ScheduleError, match="overlap"):
        check_schedule(h, sched(("gpu", "gpu"), (0, 0.5), (1, 1.5)))
    with pytest.raises(ScheduleError, match="makespan"):
        check_schedule(h, Schedule(("gpu", "cpu"), (0, 0), (1, 2), 1.0, "hand"))


def test_graph_rejects_bad_input():
    with pytest.raises(PlannerError, match="backwards"):
        graph([("a", 1, 1), ("b", 1, 1)], [("b", "a", 0)])
    with pytest.raises(PlannerError, match="names no node 'c'"):
        graph([("a", 1, 1)], [("a", "c", 0)])
    with pytest.raises(PlannerError, match="finite latencies"):
        graph([("a", float("nan"), 1)], [])
    with pytest.raises(PlannerError, match="k must be a positive integer"):
        greedy_schedule(graph([("a", 1, 1)], []), k=0)


def test_missing_ortools_is_a_clear_error(monkeypatch):
    real_import = builtins.__import__

    def no_ortools(name, *args, **kwargs):
        if name.startswith("ortools"):
            raise ImportError("No module named 'ortools'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ortools)
    with pytest.raises(SolverMissingError, match="install the 'ortools' package") as info:
        solve_exact(graph([("a", 1, 2)], []))
    assert isinstance(info.value, CodlError)


# -- random graphs ---------------------------------------------------------------------------------


def random_graph(rng: random.Random, n: int, p_edge: float, follow: float = 0.15) -> OpGraph:
    nodes, edges = [], []
    for i in range(n):
        preds = [j for j in range(i) if rng.random() < p_edge]
        is_follow = bool(preds) and len(preds) > 1 and rng.random() < follow * 4
        if is_follow:
            nodes.append((f"n{i}", 0.0, 0.0, True))
        else:
            nodes.append((f"n{i}", round(rng.uniform(0.1, 3), 3), round(rng.uniform(0.1, 3), 3)))
        edges += [(f"n{j}", f"n{i}", round(rng.uniform(0, 1.5), 3)) for j in preds]
    return graph(nodes, edges, rng.choice(["cpu", "gpu"]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 8), st.sampled_from([0.2, 0.4, 0.7]))
def test_heuristics_never_beat_the_exact_schedule(seed, n, p_edge):
    g = random_graph(random.Random(seed), n, p_edge)
    exact = solve_exact(g, time_limit_s=20, workers=2)
    assert exact.status == "optimal"
    check_schedule(g, exact)
    for h in HEURISTICS:
        s = h(g)
        check_schedule(g, s)
        assert s.makespan_ms >= exact.makespan_ms - 1e-6 * max(1.0, exact.makespan_ms), s.method
    assert lower_bound_ms(g) <= exact.makespan_ms + 1e-9


def test_greedy_k_is_a_window():
    g = random_graph(random.Random(7), 14, 0.25)
    for k in (1, 2, 4, 6):
        check_schedule(g, greedy_schedule(g, k=k))


@pytest.mark.slow
def test_time_limit_returns_a_feasible_schedule_with_its_gap():
    g = random_graph(random.Random(3), 70, 0.08)
    s = solve_exact(g, time_limit_s=0.3, max_nodes=1000, workers=1)
    check_schedule(g, s)
    assert s.status == "feasible"
    assert s.bound_ms is not None and 0.0 < s.gap < 1.0
    assert s.makespan_ms <= greedy_schedule(g).makespan_ms + 1e-9


def modules_graph(rng: random.Random, n_modules: int) -> OpGraph:
    """Inception-like: a stem, then modules of 2-4 parallel branches of one or two nodes (the
    second four times heavier, a 3x3 after a 1x1), each module joined by a concat."""
    nodes = [("stem", round(rng.uniform(0.5, 2), 3), round(rng.uniform(0.5, 2), 3))]
    edges = []
    prev = "stem"
    for m in range(n_modules):
        ends = []
        for b in range(rng.randint(2, 4)):
            last = prev
            for d in range(rng.randint(1, 2)):
                name = f"m{m}b{b}n{d}"
                cpu = rng.uniform(0.05, 0.3) * (4 if d else 1)
                nodes.append((name, round(cpu, 3), round(cpu * rng.uniform(0.6, 1.6), 3)))
                edges.append((last, name, round(rng.uniform(0.02, 0.3), 3)))
                last = name
            ends.append(last)
        nodes.append((f"cat{m}", 0.0, 0.0, True))
        edges += [(e, f"cat{m}", round(rng.uniform(0.02, 0.3), 3)) for e in ends]
        prev = f"cat{m}"
    return graph(nodes, edges, rng.choice(["cpu", "gpu"]))


@pytest.mark.parametrize("seed", range(12))
def test_greedy_within_five_percent_of_exact_on_inception_like_dags(seed):
    rng = random.Random(seed)
    g = modules_graph(rng, rng.randint(1, 3))
    exact = solve_exact(g, time_limit_s=20, max_nodes=100, workers=2)
    assert exact.status == "optimal"
    greedy = greedy_schedule(g)
    check_schedule(g, greedy)
    assert exact.makespan_ms - 1e-9 <= greedy.makespan_ms <= 1.05 * exact.makespan_ms


def test_gs_alone_is_myopic_the_refined_greedy_is_not():
    # three modules whose 3x3 branches GS's window cannot see: GS alone ends 18 % above the
    # optimum; the upward-rank lookahead and the local search bring it within 2 %
    g = modules_graph(random.Random(29), 3)
    exact = solve_exact(g, time_limit_s=20, max_nodes=100, workers=2)
    assert exact.status == "optimal"
    plain = greedy_schedule(g, refine=False)
    check_schedule(g, plain)
    assert plain.makespan_ms > 1.1 * exact.makespan_ms
    refined = greedy_schedule(g)
    assert refined.makespan_ms <= 1.05 * exact.makespan_ms


def test_swaps_fix_gs_on_independent_operators():
    # seven operators, one edge: GS maps the first four to finish them earliest and the rest
    # where they fit, 4.417 ms; the optimum, 3.334 ms, needs two of them to trade processors,
    # which only a swap reaches from GS's placement
    g = graph(
        [
            ("n0", 0.519, 2.125),
            ("n1", 0.171, 0.212),
            ("n2", 0.265, 2.103),
            ("n3", 1.673, 2.366),
            ("n4", 0.935, 2.783),
            ("n5", 1.373, 1.351),
            ("n6", 2.456, 0.968),
        ],
        [("n2", "n5", 1.383)],
        "cpu",
    )
    exact = solve_exact(g)
    assert exact.status == "optimal" and exact.makespan_ms == pytest.approx(3.334)
    assert greedy_schedule(g, refine=False).makespan_ms == pytest.approx(4.417)
    assert greedy_schedule(g).makespan_ms == pytest.approx(3.334)


def test_upward_rank_partitioning_gives_ordered_balanced_pieces():
    g = random_graph(random.Random(5), 45, 0.1)
    pieces = partition_by_upward_rank(g, max_nodes=12)
    assert sorted(i for p in pieces for i in p) == list(range(len(g)))
    assert all(0 < len(p) <= 12 for p in pieces)
    piece_of = {i: k for k, p in enumerate(pieces) for i in p}
    for e in g.edges:
        assert piece_of[g.index(e.src)] <= piece_of[g.index(e.dst)]
    s = solve_exact(g, time_limit_s=5, max_nodes=12, workers=2)
    check_schedule(g, s)
    assert s.status in ("optimal_pieces", "feasible") and s.gap is not None


def test_upward_rank_cut_matches_hope_figure_shape():
    # A chain of three levels fanning out to two branches and back: rank 0 | 1, 1 | 2, 2 | 3.
    # With 6 nodes and max 4, the balanced cut with the fewest crossing producers is after rank 1
    # (3 + 3 nodes, 2 producers crossing).
    g = graph(
        [("s", 1, 1), ("a", 1, 1), ("b", 1, 1), ("a2", 1, 1), ("b2", 1, 1), ("t", 1, 1)],
        [
            ("s", "a", 0),
            ("s", "b", 0),
            ("a", "a2", 0),
            ("b", "b2", 0),
            ("a2", "t", 0),
            ("b2", "t", 0),
        ],
    )
    assert partition_by_upward_rank(g, max_nodes=4) == [[0, 1, 2], [3, 4, 5]]


# -- the graph of a Relax module -----------------------------------------------------------------


def inception_like(seed: int = 0, c: int = 8, hw: int = 16) -> onnx.ModelProto:
    """A stem conv and an Inception module: a 1x1 branch, 1x1 -> 3x3, and maxpool -> 1x1,
    concatenated along channels."""
    rng = np.random.default_rng(seed)

    def init(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), name)

    conv = helper.make_node
    nodes = [
        conv("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1]),
        conv("Relu", ["s"], ["sr"]),
        conv("Conv", ["sr", "wa", "ba"], ["a"]),
        conv("Relu", ["a"], ["ar"]),
        conv("Conv", ["sr", "wb1", "bb1"], ["b1"]),
        conv("Relu", ["b1"], ["b1r"]),
        conv("Conv", ["b1r", "wb2", "bb2"], ["b2"], pads=[1, 1, 1, 1]),
        conv("Relu", ["b2"], ["b2r"]),
        conv("MaxPool", ["sr"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        conv("Conv", ["p", "wc", "bc"], ["cc"]),
        conv("Relu", ["cc"], ["cr"]),
        conv("Concat", ["ar", "b2r", "cr"], ["y"], axis=1),
    ]
    inits = [init("w0", (c, 3, 3, 3)), init("b0", (c,))]
    for name, k in (("a", 1), ("b1", 1), ("b2", 3), ("c", 1)):
        inits += [init(f"w{name}", (c, c, k, k)), init(f"b{name}", (c,))]
    g = helper.make_graph(
        nodes,
        "inception_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3 * c, hw, hw])],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def inception_mod():
    from codl_tvm.frontend.importer import load_onnx

    return load_onnx(inception_like()).mod


@pytest.fixture(scope="module")
def sharing_model():
    return synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.5))


def test_graph_of_an_inception_module(inception_mod, sharing_model):
    from codl_tvm.planner.split.codl import SplitPlanner
    from codl_tvm.planner.split.config import PlannerConfig

    g = build_graph(inception_mod, sharing_model)
    names = [n.name for n in g.nodes]
    assert names == [
        "conv2d_0",
        "conv2d_1",
        "conv2d_2",
        "conv2d_3",
        "max_pool2d_4",
        "conv2d_5",
        g.nodes[-1].name,
    ]
    concat = g.nodes[-1]
    assert concat.follows and concat.kind == "concat" and concat.op is None
    # bias add and relu merged into each conv (super-ops); the pool has no follower
    assert all(len(n.members) == 3 for n in g.nodes if n.kind == "conv2d")
    assert g.nodes[4].members == (g.nodes[4].members[0],)
    edges = {(e.src, e.dst) for e in g.edges}
    assert edges == {
        ("conv2d_0", "conv2d_1"),
        ("conv2d_0", "conv2d_2"),
        ("conv2d_0", "max_pool2d_4"),
        ("conv2d_2", "conv2d_3"),
        ("max_pool2d_4", "conv2d_5"),
        ("conv2d_1", concat.name),
        ("conv2d_3", concat.name),
        ("conv2d_5", concat.name),
    }
    # every edge carries one 8x16x16 float32 tensor and the sharing prediction for it
    nbytes = 8 * 16 * 16 * 4
    share = sum(sharing_model.predict_sharing(k, nbytes) for k in ("transform", "map", "presync"))
    assert all(e.nbytes == nbytes and e.transfer_ms == pytest.approx(share) for e in g.edges)
    # node latencies are the planner's whole-operator predictions
    planner = SplitPlanner(inception_mod, sharing_model, PlannerConfig(), "codl")
    for op in planner.ops:
        node = g.nodes[g.index(op.name)]
        assert (node.cpu_ms, node.gpu_ms) == (op.cpu_ms, op.gpu_ms)
    assert g.home in ("cpu", "gpu") and any("outside the cost model" in t for t in g.notes)
    for s in all_schedules(g):
        assert s.makespan_ms > 0


def test_graph_of_a_residual_block(sharing_model):
    """x -> conv -> relu -> conv, added to the first conv's output: the add is a follow node."""
    from codl_tvm.frontend.importer import load_onnx

    rng = np.random.default_rng(1)
    w = [
        numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype("float32"), f"w{i}")
        for i in range(2)
    ]
    g_proto = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["ar"]),
            helper.make_node("Conv", ["ar", "w1"], ["b"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["ar", "b"], ["y"]),
        ],
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        w,
    )
    proto = helper.make_model(g_proto, opset_imports=[helper.make_opsetid("", 13)])
    g = build_graph(load_onnx(proto).mod, sharing_model, home="cpu")
    assert [n.name for n in g.nodes][:2] == ["conv2d_0", "conv2d_1"]
    add = g.nodes[2]
    assert add.follows and add.kind == "add" and g.home == "cpu"
    assert {(e.src, e.dst) for e in g.edges} == {
        ("conv2d_0", "conv2d_1"),
        ("conv2d_0", add.name),
        ("conv2d_1", add.name),
    }


# -- plans ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cheap_sharing_model():
    return synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.05))


@pytest.mark.parametrize("mode", MODES_PLACED)
def test_placement_modes_give_whole_operator_plans(inception_mod, cheap_sharing_model, mode):
    from codl_tvm.planner.placement.modes import make_plan

    plan, report = make_plan(inception_mod, cheap_sharing_model, mode, placement=PLAIN)
    names = [i.name for i in partitionable_ops(inception_mod)]
    assert [e.op for e in plan.ops] == names and not plan.chains
    assert {e.ratio for e in plan.ops} <= {0.0, 1.0}
    s = report.summary
    assert s.n_whole_cpu + s.n_whole_gpu == len(names) and s.n_split_h == s.n_split_oc == 0
    assert report.mode == mode and s.predicted_ms > 0
    assert all(d.reason.startswith(f"{mode}: whole on ") for d in report.decisions)
    assert plan.home == build_graph(inception_mod, cheap_sharing_model).home


def test_hope_plan_uses_both_processors_and_beats_the_baselines(inception_mod, cheap_sharing_model):
    from codl_tvm.planner.placement.modes import make_plan

    plain = PLAIN
    reports = {
        m: make_plan(inception_mod, cheap_sharing_model, m, placement=plain)[1]
        for m in MODES_PLACED
    }
    hope = reports["hope"].summary
    assert hope.n_whole_cpu > 0 and hope.n_whole_gpu > 0
    assert hope.predicted_ms < min(hope.cpu_only_ms, hope.gpu_only_ms)
    for mode, rep in reports.items():
        assert hope.predicted_ms <= rep.summary.predicted_ms + 1e-9, mode
    assert "proven optimal" in reports["hope"].notes[0]


def test_cli_plan_hope_mode(tmp_path, inception_mod, cheap_sharing_model, capsys):
    import argparse

    from codl_tvm.cli.plan import register

    model_path = tmp_path / "inception_like.onnx"
    onnx.save(inception_like(), model_path)
    cm_path = tmp_path / "cm.json"
    cheap_sharing_model.save(cm_path)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    out = tmp_path / "plan.json"
    args = parser.parse_args(
        [
            *("plan", str(model_path), "--cost-model", str(cm_path)),
            *("--mode", "hope_greedy", "--greedy-k", "2", "-o", str(out)),
        ]
    )
    assert args.func(args) == 0
    assert "[hope_greedy] predicted" in capsys.readouterr().out
    plan = PartitionPlan.load(out)
    assert {e.ratio for e in plan.ops} <= {0.0, 1.0}
    with pytest.raises(PlannerError, match="greedy_k must be an integer"):
        bad = parser.parse_args(
            ["plan", str(model_path), "--cost-model", str(cm_path), "--greedy-k", "0"]
        )
        bad.func(bad)


@pytest.mark.opencl
def test_hope_plan_of_an_inception_module_equals_onnxruntime(
    opencl, inception_mod, split_friendly_model
):
    import onnxruntime as ort

    import codl_tvm
    from codl_tvm.planner.placement.modes import make_plan

    plan, _ = make_plan(inception_mod, split_friendly_model, "hope", placement=PLAIN)
    assert {e.ratio for e in plan.ops} == {0.0, 1.0}  # branches on both processors
    # the schedule issues the GPU branch before the CPU branch main computes first
    assert plan.order != tuple(e.op for e in plan.ops)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    sess = ort.InferenceSession(
        inception_like().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (expected,) = sess.run(None, {"x": x})
    built = codl_tvm.compile(inception_mod, plan)
    np.testing.assert_allclose(built([x])[0], expected, rtol=1e-4, atol=1e-4)
    # the build issues the operators in the schedule's dispatch order
    issued = list(dict.fromkeys(c[1] for c in built.kernel_splits["calls"] if c[1] is not None))
    assert plan.order and issued == list(plan.order)


def test_unmodelled_operator_is_left_out_with_its_reason(cheap_sharing_model):
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.planner.placement.modes import make_plan

    rng = np.random.default_rng(0)
    w0 = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 1)).astype(np.float32), "w0")
    w1 = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w1")
    g_proto = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 0, 1, 0]),
            helper.make_node("Conv", ["a", "w1"], ["y"], pads=[1, 1, 1, 1]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w0, w1],
    )
    mod = load_onnx(helper.make_model(g_proto, opset_imports=[helper.make_opsetid("", 13)])).mod
    graph_ = build_graph(mod, cheap_sharing_model)
    assert graph_.nodes[0].follows and graph_.nodes[0].op is None
    assert any("conv2d_0 (conv2d) is not placed" in n for n in graph_.notes)
    plan, report = make_plan(mod, cheap_sharing_model, "hope", placement=PLAIN)
    assert [e.op for e in plan.ops] == ["conv2d_1"]
    row = report.decisions[0]
    assert row.ops == ("conv2d_0",) and row.ratio is None
    assert "kernel [3, 1] is not square" in row.reason and "left out of the plan" in row.reason
    assert report.summary.n_unmodelled == 1


def test_placement_modules_import_with_a_runtime_only_tvm():
    """Artifacts import the planner package on devices whose TVM is its runtime alone; only
    building a graph from IR needs the compiler."""
    import os
    import subprocess
    import sys

    code = "import codl_tvm.planner.placement.modes, codl_tvm.planner.placement.hope"
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_dispatch_order_enqueues_gpu_work_before_the_cpu_blocks_the_host():
    from codl_tvm.planner.placement.modes import dispatch_order

    # the diamond's optimum: a on the GPU [0, 1], c on the GPU [1, 5], b on the CPU [2, 6]:
    # c must be enqueued before the host runs b, or the GPU idles while the CPU computes
    nodes = [("a", 2, 1), ("b", 4, 4), ("c", 4, 4), ("d", 2, 1)]
    g = OpGraph(
        tuple(DagNode(n, c, gp, op=n) for n, c, gp in nodes),
        tuple(DagEdge(s, d, 1) for s, d in (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))),
    )
    s = Schedule(("gpu", "cpu", "gpu", "gpu"), (0, 2, 1, 7), (1, 6, 5, 8), 8.0, "hand")
    check_schedule(g, s)
    assert dispatch_order(g, s) == ("a", "c", "b", "d")
    # a GPU node reading CPU results is issued after them; a GPU node that can start while the
    # CPU still computes is issued before the CPU node
    s2 = Schedule(("gpu", "cpu", "cpu", "gpu"), (0, 2, 6, 11), (1, 6, 10, 12), 12.0, "hand")
    check_schedule(g, s2)
    assert dispatch_order(g, s2) == ("a", "b", "c", "d")
    s3 = Schedule(("cpu", "cpu", "gpu", "cpu"), (0, 2, 3, 8), (2, 6, 7, 10), 10.0, "hand")
    check_schedule(g, s3)
    assert dispatch_order(g, s3) == ("a", "c", "b", "d")


def test_order_splits_issues_a_partitioned_module_in_dispatch_order(
    inception_mod, cheap_sharing_model
):
    """The hope plan of the Inception-like module, partitioned as the build does, ordered by
    its schedule's dispatch order: the operators come in that order and compute the same."""
    from codl_tvm.passes import PartitionOperators, collect_parts
    from codl_tvm.passes.order import OrderSplits

    from codl_tvm.build.pipeline import inference_passes
    from codl_tvm.planner.placement.modes import (
        PlacementConfig,
        dispatch_order,
        make_plan,
        schedule_graph,
    )
    from tests.test_passes_split import run

    graph_ = build_graph(inception_mod, cheap_sharing_model)
    schedule = schedule_graph(graph_, "hope", PlacementConfig())
    order = dispatch_order(graph_, schedule)
    plan, _ = make_plan(inception_mod, cheap_sharing_model, "hope", placement=PLAIN)
    assert {e.op: e.ratio for e in plan.ops} == {
        n.op: float(p == "gpu") for n, p in zip(graph_.nodes, schedule.processor) if n.op
    }
    mod = inception_mod
    for p in inference_passes():
        mod = p(mod)
    parted = PartitionOperators(plan)(mod)
    ordered = OrderSplits(order)(parted)
    kinds = ("relax.nn.conv2d", "relax.nn.max_pool2d")
    seen = [
        b.var
        for b in ordered["main"].body.blocks[0].bindings
        if getattr(getattr(b.value, "op", None), "name", None) in kinds
    ]
    split_of = {v: s.name for s in collect_parts(ordered) for p in s.parts for v in p.bindings}
    assert [split_of[v] for v in seen] == list(order)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    np.testing.assert_allclose(run(ordered, x), run(parted, x), rtol=1e-5, atol=1e-5)


def test_hope_plans_are_deterministic(inception_mod, cheap_sharing_model):
    """The Inception module has several optimal placements; one solver worker always returns
    the same one (parallel workers returned two different ones in six runs)."""
    from codl_tvm.planner.placement.modes import make_plan

    plans = {
        make_plan(inception_mod, cheap_sharing_model, "hope", placement=PLAIN)[0].to_json()
        for _ in range(4)
    }
    assert len(plans) == 1


# -- splits as a third choice (codl_hope) ----------------------------------------------------------


def split_graph(nodes, edges, home="gpu") -> OpGraph:
    """``nodes``: (name, cpu_ms, gpu_ms, split_ms or None); ``edges``: (src, dst, transfer)."""
    return OpGraph(
        tuple(
            DagNode(
                n,
                c,
                g,
                op=n,
                split_ms=sp,
                split_dim=None if sp is None else "H",
                split_ratio=None if sp is None else 0.5,
            )
            for n, c, g, sp in nodes
        ),
        tuple(DagEdge(s, d, t) for s, d, t in edges),
        home,
    )


def test_a_lone_operator_is_split_when_its_split_is_faster():
    g = split_graph([("x", 4, 4, 2.5)], [])
    exact = solve_exact(g)
    check_schedule(g, exact)
    assert exact.processor == ("both",) and exact.makespan_ms == pytest.approx(2.5)


def test_independent_branches_beat_splitting_each():
    # two 4 ms ops side by side: 4; each split (2.5 ms on both processors) one after the other: 5
    g = split_graph([("a", 4, 4, 2.5), ("b", 4, 4, 2.5)], [])
    exact = solve_exact(g)
    check_schedule(g, exact)
    assert exact.makespan_ms == pytest.approx(4.0)
    assert sorted(exact.processor) == ["cpu", "gpu"]


def test_splits_carry_their_own_sharing_no_transfer_delay():
    # a -> b -> c; moving a tensor costs 10 ms. Whole: a chain on one processor, 4 + 4 + 4 = 12.
    # a and b split (3 ms each, sharing included) and c whole on the GPU after b's merged
    # output: 3 + 3 + 1 = 7 (c is 1 ms on the GPU); all split: 3 + 3 + 3 = 9.
    g = split_graph(
        [("a", 4, 4, 3), ("b", 4, 4, 3), ("c", 4, 1, 3)], [("a", "b", 10), ("b", "c", 10)]
    )
    exact = solve_exact(g)
    check_schedule(g, exact)
    assert exact.makespan_ms == pytest.approx(7.0)
    assert exact.processor == ("both", "both", "gpu")
    assert greedy_schedule(g).makespan_ms >= exact.makespan_ms - 1e-9
    from codl_tvm.planner.placement.modes import dispatch_order

    assert dispatch_order(g, exact) == ("a", "b", "c")


def test_split_producers_do_not_decide_a_follow_node():
    # j joins a split p and q whole on the CPU: PlaceParts ignores the merged split output, so j
    # follows q to the CPU (home is the GPU); with q on the GPU too it goes to the GPU
    nodes = (
        DagNode("p", 9, 9, split_ms=1, split_dim="H", split_ratio=0.5),
        DagNode("q", 1, 5),
        DagNode("j", 0, 0, follows=True),
    )
    g = OpGraph(nodes, (DagEdge("p", "j", 1), DagEdge("q", "j", 1)), "gpu")
    assert g.follow(2, ("both", "cpu", None)) == "cpu"
    assert g.follow(2, ("both", "gpu", None)) == "gpu"
    assert g.follow(2, ("both", "both", None)) == "gpu"
    exact = solve_exact(g)
    check_schedule(g, exact)
    # p split [0, 1] then q on the CPU [1, 2], j on the CPU at 2 (no transfer from a split)
    assert exact.processor == ("both", "cpu", "cpu") and exact.makespan_ms == pytest.approx(2.0)
    with pytest.raises(ScheduleError, match="cannot run on 'both'"):
        check_schedule(g, Schedule(("both", "both", "gpu"), (0, 1, 2), (1, 2, 2), 2.0, "hand"))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 7), st.sampled_from([0.2, 0.5]))
def test_greedy_with_splits_never_beats_the_exact_schedule(seed, n, p_edge):
    rng = random.Random(seed)
    base = random_graph(rng, n, p_edge)
    nodes = tuple(
        node
        if node.follows or rng.random() < 0.4
        else DagNode(
            node.name,
            node.cpu_ms,
            node.gpu_ms,
            split_ms=round(rng.uniform(0.3, 1.0) * min(node.cpu_ms, node.gpu_ms) + 0.05, 3),
            split_dim="H",
            split_ratio=0.5,
            follows=False,
        )
        for node in base.nodes
    )
    g = OpGraph(nodes, base.edges, base.home)
    exact = solve_exact(g, time_limit_s=20, workers=2)
    assert exact.status == "optimal"
    check_schedule(g, exact)
    greedy = greedy_schedule(g)
    check_schedule(g, greedy)
    assert greedy.makespan_ms >= exact.makespan_ms - 1e-6 * max(1.0, exact.makespan_ms)
    assert lower_bound_ms(g) <= exact.makespan_ms + 1e-9
    # splits are a third choice: never worse than placing whole operators only
    assert exact.makespan_ms <= solve_exact(base, time_limit_s=20, workers=2).makespan_ms + 1e-6


@pytest.fixture(scope="module")
def split_friendly_model():
    """Sharing so cheap that splitting the larger convs pays."""
    return synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.01, presync_ms=0.001))


def test_codl_hope_mixes_splits_and_whole_branches(inception_mod, split_friendly_model):
    from codl_tvm.planner.placement.modes import make_plan

    plain = PLAIN
    plans = {
        m: make_plan(inception_mod, split_friendly_model, m, placement=plain)
        for m in ("hope", "codl_hope")
    }
    plan, report = plans["codl_hope"]
    ratios = [e.ratio for e in plan.ops]
    assert any(0.0 < r < 1.0 for r in ratios) and {0.0, 1.0} <= set(ratios)
    s = report.summary
    assert s.n_split_h + s.n_split_oc + s.n_whole_cpu + s.n_whole_gpu == len(ratios)
    assert s.predicted_ms <= plans["hope"][1].summary.predicted_ms + 1e-9
    split_rows = [d for d in report.decisions if d.ratio is not None and 0 < d.ratio < 1]
    assert all("codl_hope: split" in d.reason and d.coexec_ms == d.split_ms for d in split_rows)


@pytest.mark.opencl
def test_codl_hope_plan_equals_onnxruntime(opencl, inception_mod, split_friendly_model):
    import onnxruntime as ort

    import codl_tvm
    from codl_tvm.planner.placement.modes import make_plan

    plan, _ = make_plan(inception_mod, split_friendly_model, "codl_hope", placement=PLAIN)
    assert any(0.0 < e.ratio < 1.0 for e in plan.ops)
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype("float32")
    sess = ort.InferenceSession(
        inception_like().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (expected,) = sess.run(None, {"x": x})
    built = codl_tvm.compile(inception_mod, plan)
    np.testing.assert_allclose(built([x])[0], expected, rtol=1e-4, atol=1e-4)
    # each processor issues its splits in the plan's order (IssueGpuAhead enqueues GPU kernels
    # ahead of independent CPU ones, so the merged order may differ)
    for proc in ("cpu", "gpu"):
        calls = built.kernel_splits["calls"]
        issued = list(dict.fromkeys(c[1] for c in calls if c[1] is not None and c[2] == proc))
        assert issued == [s for s in plan.order if s in issued], proc


def test_plan_order_round_trips_and_names_entries(inception_mod, cheap_sharing_model):
    from codl_tvm.planner.placement.modes import make_plan

    plan, _ = make_plan(inception_mod, cheap_sharing_model, "hope", placement=PLAIN)
    assert sorted(plan.order) == sorted(e.op for e in plan.ops)
    assert PartitionPlan.from_json(plan.to_json()) == plan
    data = plan.to_dict()
    with pytest.raises(PlanError, match="order names 'conv2d_9', which is no entry"):
        PartitionPlan.from_dict({**data, "order": ["conv2d_9"]})
    with pytest.raises(PlanError, match="order must be a list of entry names"):
        PartitionPlan.from_dict({**data, "order": "conv2d_0"})
    with pytest.raises(PlanError, match="names an entry twice"):
        PartitionPlan.from_dict({**data, "order": ["conv2d_0", "conv2d_0"]})
    # plans without an order keep main's and write no "order" field
    assert "order" not in PartitionPlan(plan.ops).to_dict()


BENCHMARK_MODELS = (
    "vgg19",
    "vgg16",
    "yolov2",
    "fst",
    "retinaface",
    "posenet",
    "inception_v1",
    "resnet50",
    "squeezenet",
    "bvlc_alexnet",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARK_MODELS)
def test_greedy_within_five_percent_of_exact_on_the_benchmark_models(name):
    from codl_tvm.cost_model import load_model
    from codl_tvm.cost_model.defaults import default_model_path
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import benchmark_model
    from codl_tvm.planner.split.search import PlannerConfig, calibrated_model

    path = default_model_path("emulated-soc").parent / "emulated-soc-k12.json"
    cost_model, _ = calibrated_model(load_model(path), PlannerConfig())
    mod = load_onnx(benchmark_model(name)).mod
    for splits in (False, True):
        g = build_graph(mod, cost_model, splits=splits)
        exact = solve_exact(g)
        greedy = greedy_schedule(g)
        check_schedule(g, greedy)
        assert greedy.makespan_ms >= exact.bound_ms - 1e-9
        assert greedy.makespan_ms <= 1.05 * exact.makespan_ms, (splits, greedy, exact)


def test_contract_a_chain_into_one_node():
    # s -> a -> b -> t, s -> t: the path a, b becomes one node where b was; a path whose inner
    # node is read outside it, or nodes that are no path, cannot be contracted
    g = graph(
        [("s", 1, 1), ("a", 2, 3), ("b", 4, 5), ("t", 1, 1)],
        [("s", "a", 0.5), ("a", "b", 0.1), ("b", "t", 0.7), ("s", "t", 0.2)],
    )
    node = DagNode("a..b", 6, 8, split_ms=4, split_dim="H", split_ratio=0.5)
    c = g.contract(("a", "b"), node)
    assert [n.name for n in c.nodes] == ["s", "a..b", "t"]
    assert c.transfer_ms(0, 1) == 0.5 and c.transfer_ms(1, 2) == 0.7 and c.preds(2) == (1, 0)
    assert g.contract(("s", "a"), node) is None  # s is also read by t
    assert g.contract(("a", "t"), node) is None  # not a path
    assert g.contract(("a", "x"), node) is None


# -- co-execution costs --------------------------------------------------------------------------


def test_coexec_costs_scale_whole_operators_and_delay_cross_edges():

    g = OpGraph(
        (
            DagNode("a", 2.0, 4.0, op="a", split_ms=3.0, split_dim="H", split_ratio=0.5),
            DagNode("j", 0.0, 0.0, follows=True),
            DagNode("b", 1.0, 1.0, op="b"),
        ),
        (DagEdge("a", "j", 0.5), DagEdge("j", "b", 0.25)),
    )
    costs = CoexecCosts(cpu_factor=1.5, gpu_factor=2.0, gpu_op_ms=0.1, cross_edge_ms=0.2)
    c = g.with_costs(costs)
    a, j, b = c.nodes
    assert (a.cpu_ms, a.gpu_ms, a.split_ms) == (3.0, 8.1, 3.0)  # a split keeps Eq. 2's latency
    assert (j.cpu_ms, j.gpu_ms) == (0.0, 0.0) and j.follows
    assert (b.cpu_ms, b.gpu_ms) == (1.5, 2.1)
    assert [e.transfer_ms for e in c.edges] == [0.7, 0.45]
    assert c.delay_ms(1, 2, "cpu", "cpu") == 0.0 and c.delay_ms(1, 2, "cpu", "gpu") == 0.45
    assert g.with_costs(CoexecCosts()) is g
    for bad in ({"cpu_factor": 0.0}, {"gpu_factor": float("inf")}, {"cross_edge_ms": -1.0}):
        with pytest.raises(PlannerError, match="CoexecCosts"):
            CoexecCosts(**bad)


def test_costs_turn_a_marginal_branch_placement_into_one_processor(
    inception_mod, cheap_sharing_model
):
    """A placement predicted faster with the plain predictions but not once each operator and
    edge pays the co-executed build's costs: every operator goes to the faster processor,
    predicted at its plain single-processor latency (what the compile then builds)."""
    from codl_tvm.planner.placement.modes import PlacementConfig, make_plan

    plain = PlacementConfig(costs=CoexecCosts())
    costly = PlacementConfig(costs=CoexecCosts(cpu_factor=3.0, gpu_factor=3.0, gpu_op_ms=1.0))
    for mode in (*MODES_PLACED, "codl_hope"):
        _, before = make_plan(inception_mod, cheap_sharing_model, mode, placement=plain)
        s = before.summary
        if mode in ("hope", "codl_hope"):
            assert s.predicted_ms < min(s.cpu_only_ms, s.gpu_only_ms), mode
        plan, report = make_plan(inception_mod, cheap_sharing_model, mode, placement=costly)
        s = report.summary
        best = min(s.cpu_only_ms, s.gpu_only_ms)
        assert s.predicted_ms == pytest.approx(best), mode
        ratio = 0.0 if s.cpu_only_ms <= s.gpu_only_ms else 1.0
        assert {e.ratio for e in plan.ops} == {ratio} and not plan.chains, mode
        where = "CPU" if ratio == 0.0 else "GPU"
        assert any(f"every operator on the {where}" in n for n in report.notes), mode


@pytest.mark.parametrize("mode", (*MODES_PLACED, "codl_hope"))
def test_costs_recorded_in_the_cost_model_apply_by_default(
    inception_mod, cheap_sharing_model, mode
):
    """The costs a cost model's file records (as fit_coexec_costs.py writes them) are what
    every placement mode plans with by default; no mode then predicts a plan slower than the
    faster processor alone."""
    import copy

    from codl_tvm.planner.placement.graph import META_KEY
    from codl_tvm.planner.placement.modes import make_plan

    cm = copy.copy(cheap_sharing_model)
    cm.meta = {**cheap_sharing_model.meta, META_KEY: {"cpu_factor": 1.3, "gpu_factor": 1.5}}
    assert CoexecCosts.of(cm) == CoexecCosts(cpu_factor=1.3, gpu_factor=1.5)
    _, report = make_plan(inception_mod, cm, mode)
    s = report.summary
    assert s.predicted_ms <= min(s.cpu_only_ms, s.gpu_only_ms) + 1e-9
    assert any("co-execution costs in the makespan: CPU operators x1.3" in n for n in report.notes)
    cm.meta = {META_KEY: {"cpu_factor": 1.3, "launch_ms": 1.0}}
    with pytest.raises(PlannerError, match="meta 'coexec_costs' must map cpu_factor"):
        make_plan(inception_mod, cm, mode)


def test_the_shipped_emulated_soc_model_records_its_coexec_costs():
    from codl_tvm.cost_model import load_model
    from codl_tvm.cost_model.defaults import default_model_path

    path = default_model_path("emulated-soc").parent / "emulated-soc-k12.json"
    costs = CoexecCosts.of(load_model(path))
    assert not costs.neutral and costs.cpu_factor >= 1.0 and costs.gpu_factor >= 1.0
