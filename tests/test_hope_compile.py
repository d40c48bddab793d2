"""The placement modes through ``codl-tvm compile`` and ``--mode auto``; hope plans' numerics.

``auto`` is checked on synthetic device pairs (``codl_tvm.cost_model.synthetic``) where the winner
is known: two independent branches on balanced processors with costly splits (hope), one chain
with a fast GPU and cheap splits (codl). Built plans are compared with onnxruntime on the local
OpenCL device; nothing is timed.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from codl_tvm.artifact import load_artifact
from codl_tvm.cli import main
from codl_tvm.core.errors import PlannerError
from codl_tvm.core.plan import partitionable_ops
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.planner.placement.graph import CoexecCosts
from codl_tvm.planner.placement.modes import AUTO_CANDIDATES, PlacementConfig, make_plan, plan_auto

from .test_hope import inception_like

# Splits pay a sharing cost per operator that outweighs their gain; a whole branch moved to the
# other processor is paid for by its slack.
COSTLY_SPLITS = SyntheticDevice(share_ms_per_mb=1.0, presync_ms=0.1)
# Sharing nearly free, the GPU 3x the CPU: every conv of a chain is best split.
CHEAP_SPLITS_FAST_GPU = SyntheticDevice(
    cpu_gflops=10.0, gpu_gflops=30.0, share_ms_per_mb=0.001, presync_ms=0.001
)


# Plans without co-execution costs (the synthetic models record none; explicit, as these tests
# check the modes' choices, not the costs).
PLAIN = PlacementConfig(costs=CoexecCosts())


def conv_chain(n: int = 3, c: int = 16, hw: int = 32) -> onnx.ModelProto:
    """``n`` 3x3 convs with ReLUs, one after the other: nothing to run side by side."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        w = (rng.standard_normal((c, 3 if i == 0 else c, 3, 3)) * 0.2).astype("float32")
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def residual_block(c: int = 16, hw: int = 16) -> onnx.ModelProto:
    """A stem conv, then two 3x3 convs beside a 1x1 projection shortcut, added and ReLU'd."""
    rng = np.random.default_rng(2)

    def w(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), name)

    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1]),
        node("Relu", ["s"], ["sr"]),
        node("Conv", ["sr", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
        node("Relu", ["a"], ["ar"]),
        node("Conv", ["ar", "w2", "b2"], ["a2"], pads=[1, 1, 1, 1]),
        node("Conv", ["sr", "wp", "bp"], ["p"]),
        node("Add", ["a2", "p"], ["sum"]),
        node("Relu", ["sum"], ["y"]),
    ]
    inits = [w("w0", (c, 3, 3, 3)), w("b0", (c,))]
    for name, k in (("1", 3), ("2", 3), ("p", 1)):
        inits += [w(f"w{name}", (c, c, k, k)), w(f"b{name}", (c,))]
    g = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def onnxruntime_outputs(proto: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got, want) -> None:
    """Within 1e-4 of the output's scale (fp32, other summation orders)."""
    scale = max(float(np.max(np.abs(want))), 1e-6)
    assert np.max(np.abs(np.asarray(got).reshape(want.shape) - want)) <= 1e-4 * scale + 1e-6


@pytest.fixture(scope="module")
def branches_mod():
    return load_onnx(inception_like(c=32, hw=32)).mod


@pytest.fixture(scope="module")
def costly_splits_model():
    return synthetic_cost_model(COSTLY_SPLITS)


# -- --mode auto ---------------------------------------------------------------------------------


def test_auto_places_independent_branches_when_splits_cost_too_much(
    branches_mod, costly_splits_model
):
    plan, report = make_plan(branches_mod, costly_splits_model, "auto", placement=PLAIN)
    c = report.candidates
    assert list(c) == list(AUTO_CANDIDATES)
    # branches side by side beat splitting each conv; codl_hope splits nothing here, so it
    # ties with hope, and the tie goes to the earlier mode
    assert report.mode == "hope"
    assert c["hope"] < c["codl"] and c["codl_hope"] == pytest.approx(c["hope"])
    assert report.summary.predicted_ms == c["hope"] == min(c.values())
    assert {e.ratio for e in plan.ops} == {0.0, 1.0}
    assert plan == make_plan(branches_mod, costly_splits_model, "hope", placement=PLAIN)[0]
    assert report.notes[0].startswith("auto: hope predicted")
    assert "a tie goes to the earlier" in report.notes[0]
    text = report.table()
    assert "auto chose hope, the lowest predicted latency of codl " in text
    data = json.loads(report.to_json())
    assert data["auto"]["chosen"] == "hope"
    assert data["auto"]["candidates_ms"] == pytest.approx(c)


def test_auto_keeps_codl_for_a_chain_with_cheap_splits():
    mod = load_onnx(conv_chain()).mod
    cm = synthetic_cost_model(CHEAP_SPLITS_FAST_GPU)
    plan, report = make_plan(mod, cm, "auto", placement=PLAIN)
    c = report.candidates
    # a chain has nothing to run side by side: whole-operator placement is one processor
    # alone, while every split keeps both busy; codl_hope's splits equal codl's prediction
    assert report.mode == "codl" and c["codl"] < c["hope"]
    assert c["hope"] == pytest.approx(report.summary.gpu_only_ms)
    assert c["codl_hope"] == pytest.approx(c["codl"])
    assert plan == make_plan(mod, cm, "codl")[0]
    assert all(0.0 < e.ratio < 1.0 for e in plan.ops)


def test_auto_takes_the_strictly_lowest_prediction(branches_mod):
    # cheap sharing: splitting the big convs and running branches beside them beats both
    cm = synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.05))
    _, report = make_plan(branches_mod, cm, "auto", placement=PLAIN)
    c = report.candidates
    assert report.mode == "codl_hope"
    assert c["codl_hope"] < min(c["codl"], c["hope"], c["hope_greedy"])
    assert "a tie" not in report.notes[0]


def test_auto_bad_candidates(branches_mod, costly_splits_model):
    with pytest.raises(PlannerError, match="no candidate modes"):
        plan_auto(branches_mod, costly_splits_model, candidates=())
    with pytest.raises(PlannerError, match=r"candidate modes \['auto', 'fast'\]"):
        plan_auto(branches_mod, costly_splits_model, candidates=("codl", "auto", "fast"))


def test_plan_policy_accepts_every_mode(branches_mod, tmp_path, costly_splits_model):
    from codl_tvm.planner.policy import resolve_plan

    path = tmp_path / "cm.json"
    costly_splits_model.save(path)
    choice = resolve_plan(branches_mod, mode="auto", cost_model=path)
    # with the default co-execution costs, this microsecond-scale device keeps placements on
    # one processor: auto chooses among its candidates all the same
    assert choice.mode == "auto" and choice.report.mode in AUTO_CANDIDATES
    assert choice.report.candidates is not None
    with pytest.raises(PlannerError, match="planner mode 'hopeful' is not one of"):
        resolve_plan(branches_mod, mode="hopeful", cost_model=path)


# -- compile --mode hope|auto ----------------------------------------------------------------


@pytest.fixture(scope="module")
def branches_files(tmp_path_factory, costly_splits_model):
    d = tmp_path_factory.mktemp("hope_compile")
    onnx.save(inception_like(c=32, hw=32), d / "inception_like.onnx")
    costly_splits_model.save(d / "cm.json")
    return d


@pytest.mark.opencl
def test_compile_hope_artifact_equals_onnxruntime(opencl, branches_files, capsys):
    d = branches_files
    out = d / "hope_art"
    args = ["compile", str(d / "inception_like.onnx"), "--cost-model", str(d / "cm.json")]
    # the placement as planned (tests/test_measure.py: what measuring keeps)
    assert main([*args, "--mode", "hope", "--no-measure", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "coexec" and "fallback" not in manifest["plan"]
    assert manifest["plan"]["mode"] == "hope" and "auto" not in manifest["plan"]
    assert json.loads((out / "plan_report.json").read_text())["mode"] == "hope"
    assert "[hope] predicted" in (out / "plan_report.txt").read_text()
    plan = json.loads((out / "plan.json").read_text())
    assert {e["ratio"] for e in plan["ops"]} == {0.0, 1.0} and plan["order"]
    art = load_artifact(out)
    feeds = random_inputs(art.model, seed=5)
    (want,) = onnxruntime_outputs(inception_like(c=32, hw=32), feeds)
    (got,) = art([feeds[s.name] for s in art.model.inputs])
    assert_close(got, want)
    capsys.readouterr()
    assert main(["run", str(out), "--check"]) == 0


@pytest.mark.opencl
def test_compile_auto_records_its_choice(opencl, branches_files):
    from codl_tvm.artifact import compile_artifact

    d = branches_files
    out = d / "auto_art"
    compile_artifact(
        d / "inception_like.onnx",
        out,
        mode="auto",
        cost_model=d / "cm.json",
        reference=False,
        log=lambda s: None,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["plan"]
    assert record["mode"] == "hope" and list(record["auto"]["candidates_ms"]) == list(
        AUTO_CANDIDATES
    )
    assert record["summary"]["predicted_ms"] == min(record["auto"]["candidates_ms"].values())
    report = json.loads((out / "plan_report.json").read_text())
    assert report["auto"]["chosen"] == "hope"
    assert "auto chose hope" in (out / "plan_report.txt").read_text()
    art = load_artifact(out)
    feeds = random_inputs(art.model, seed=6)
    (want,) = onnxruntime_outputs(inception_like(c=32, hw=32), feeds)
    assert_close(art([feeds[s.name] for s in art.model.inputs])[0], want)


@pytest.mark.opencl
def test_compile_hope_falls_back_like_codl(opencl, tmp_path):
    """A CPU 250x the GPU: the plan keeps every operator on the CPU, built for the CPU alone."""
    onnx.save(inception_like(), tmp_path / "m.onnx")
    cpu_heavy = SyntheticDevice(cpu_gflops=500.0, gpu_gflops=2.0)
    synthetic_cost_model(cpu_heavy).save(tmp_path / "c.json")
    out = tmp_path / "art"
    args = ["compile", str(tmp_path / "m.onnx"), "--cost-model", str(tmp_path / "c.json")]
    argv = [*args, "--mode", "hope_greedy", "--no-measure", "-o", str(out), "--no-reference"]
    assert main(argv) == 0  # the predicted fallback, unmeasured
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "cpu" and manifest["vm_devices"] == ["cpu"]
    assert "whole on the CPU" in manifest["plan"]["fallback"]
    assert manifest["plan"]["mode"] == "hope_greedy"


@pytest.mark.opencl
def test_compile_verify_times_placement_modes(opencl, tmp_path):
    """``--verify`` with ``--mode hope`` and ``--verify-modes`` of other placement modes: every
    plan that co-executes is built and timed beside each processor alone, the fastest kept."""
    proto = inception_like()
    onnx.save(proto, tmp_path / "m.onnx")
    synthetic_cost_model(SyntheticDevice(share_ms_per_mb=0.05)).save(tmp_path / "c.json")
    out = tmp_path / "art"
    args = ["compile", str(tmp_path / "m.onnx"), "--cost-model", str(tmp_path / "c.json")]
    args += ["--mode", "hope", "--verify", "1", "--no-verify-calibrate", "--no-reference"]
    assert main([*args, "--verify-modes", "codl_hope,starpu", "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    v = manifest["verify"]
    assert manifest["plan"]["verify_candidates"][0] == "hope"
    assert {"coexec", "cpu", "opencl"} <= set(v["median_ms"])
    assert v["chosen"] == min(v["median_ms"], key=v["median_ms"].get)
    art = load_artifact(out)
    feeds = random_inputs(art.model, seed=1)
    (want,) = onnxruntime_outputs(proto, feeds)
    assert_close(art([feeds[s.name] for s in art.model.inputs])[0], want)


def test_compile_rejects_unknown_verify_modes(tmp_path, capsys):
    onnx.save(inception_like(), tmp_path / "m.onnx")
    args = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"), "--verify", "1"]
    assert main([*args, "--verify-modes", "hope,greedy"]) == 2
    err = capsys.readouterr().err
    assert "'greedy' not among the planner modes" in err and "codl_hope" in err
    assert not (tmp_path / "o").exists()


# -- numerics of hope plans ------------------------------------------------------------------


def _check_placement_plan(proto: onnx.ModelProto, cost_model, mode: str) -> None:
    import codl_tvm

    model = load_onnx(proto)
    plan, _ = make_plan(model.mod, cost_model, mode)
    # both processors run work (a one-processor plan tests nothing new), and some operator
    # runs whole on one of them while another runs elsewhere
    ratios = [e.ratio for e in plan.ops]
    assert any(r < 1.0 for r in ratios) and any(r > 0.0 for r in ratios), plan
    assert {0.0, 1.0} & set(ratios) and len(set(ratios)) > 1, plan
    feeds = random_inputs(model, seed=4)
    want = onnxruntime_outputs(proto, feeds)
    got = codl_tvm.compile(model.mod, plan)([feeds[s.name] for s in model.inputs])
    for g, w in zip(got, want):
        assert_close(g, w)


@pytest.mark.opencl
@pytest.mark.parametrize("mode", ["hope", "codl_hope"])
def test_residual_block_placement_plan_equals_onnxruntime(opencl, mode):
    _check_placement_plan(residual_block(), synthetic_cost_model(SyntheticDevice()), mode)


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_light_model_hope_plan_equals_onnxruntime(opencl, name):
    from codl_tvm.frontend.models import light_model

    _check_placement_plan(light_model(name), synthetic_cost_model(SyntheticDevice()), "hope")


def test_dispatch_order_keeps_the_gpu_queue_in_schedule_order():
    """a on the GPU, then b split (both processors), then c on the GPU; b and c both read a
    only. The GPU runs its queue in order, so c (enqueueable right after a) must be issued
    after b, or it holds up b's GPU part. (The residual block's codl_hope plan had this shape;
    its build refused the earlier order.)"""
    from codl_tvm.planner.placement.graph import SPLIT, DagEdge, DagNode, OpGraph
    from codl_tvm.planner.placement.hope import Schedule, check_schedule
    from codl_tvm.planner.placement.modes import dispatch_order

    g = OpGraph(
        (
            DagNode("a", 2, 1, op="a"),
            DagNode("b", 4, 4, op="b", split_ms=2.0, split_dim="H", split_ratio=0.5),
            DagNode("c", 2, 1, op="c"),
        ),
        (DagEdge("a", "b", 1), DagEdge("a", "c", 1)),
    )
    s = Schedule(("gpu", SPLIT, "gpu"), (0, 1, 3), (1, 3, 4), 4.0, "hand")
    check_schedule(g, s)
    assert dispatch_order(g, s) == ("a", "b", "c")


def _residual_plan(mod, shortcut_ratio: float):
    """Every conv whole on the GPU but the 1x1 shortcut (``shortcut_ratio``), issued right after
    the stem: the order a schedule gives when the shortcut runs beside the 3x3 branch."""
    from codl_tvm.core.plan import OpPartition, PartitionPlan, model_fingerprint

    infos = partitionable_ops(mod)
    assert [i.name for i in infos] == ["conv2d_0", "conv2d_1", "conv2d_2", "conv2d_3"]
    return PartitionPlan(
        tuple(
            OpPartition(i.name, "H", shortcut_ratio if i.name == "conv2d_3" else 1.0) for i in infos
        ),
        (),
        model_fingerprint(mod, infos),
        home="gpu",
        order=("conv2d_0", "conv2d_3", "conv2d_1", "conv2d_2"),
    )


def _partition_and_order(mod, plan):
    """``mod`` partitioned by ``plan`` and ordered by its order: the partitioned module, the
    ordered one (checked well formed) and the split of each conv binding in issue order."""
    from codl_tvm.passes import PartitionOperators, collect_parts
    from codl_tvm.passes.order import OrderSplits

    from codl_tvm.build.pipeline import inference_passes

    staged = mod
    for p in inference_passes():
        staged = p(staged)
    parted = PartitionOperators(plan)(staged)
    ordered = OrderSplits(plan.order)(parted)
    tvm.relax.analysis.well_formed(ordered)
    split_of = {v: s.name for s in collect_parts(ordered) for q in s.parts for v in q.bindings}
    convs = [
        split_of[b.var]
        for b in ordered["main"].body.blocks[0].bindings
        if getattr(getattr(b.value, "op", None), "name", None) == "relax.nn.conv2d"
    ]
    return parted, ordered, convs


def test_order_splits_issues_a_shortcut_conv_before_the_branch_its_add_reads():
    """PartitionOperators merges the residual add into the shortcut conv's bindings; the add
    also reads the 3x3 branch's result. OrderSplits issues the shortcut conv where the order
    puts it and the add once both inputs are computed (it refused the order before)."""
    from .test_passes_split import run

    mod = load_onnx(residual_block()).mod
    for ratio in (0.0, 1.0):
        plan = _residual_plan(mod, ratio)
        parted, ordered, convs = _partition_and_order(mod, plan)
        assert convs == list(plan.order)
        x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
        np.testing.assert_allclose(run(ordered, x), run(parted, x), rtol=1e-5, atol=1e-5)


@pytest.mark.opencl
def test_shortcut_on_the_cpu_beside_the_branch_equals_onnxruntime(opencl):
    import codl_tvm

    proto = residual_block()
    model = load_onnx(proto)
    plan = _residual_plan(model.mod, 0.0)
    feeds = random_inputs(model, seed=8)
    (want,) = onnxruntime_outputs(proto, feeds)
    built = codl_tvm.compile(model.mod, plan)
    assert_close(built([feeds[s.name] for s in model.inputs])[0], want)
    # each processor issues its splits in the plan's order (IssueGpuAhead enqueues the GPU's
    # ahead of the CPU's shortcut, so the merged order differs)
    for proc in ("cpu", "gpu"):
        calls = built.kernel_splits["calls"]
        issued = list(dict.fromkeys(c[1] for c in calls if c[1] is not None and c[2] == proc))
        assert issued == [s for s in plan.order if s in issued], proc


def _split_residual_plan(mod):
    """ResNet50's conv2d_44..47 in small: the branch's first 3x3 split, its second whole on the
    CPU, the shortcut split and issued before the second (the order codl_hope gave ResNet50).
    PartitionOperators merges the residual add into the shortcut's parts, each slicing the
    branch's result to its own rows."""
    from codl_tvm.core.plan import OpPartition, PartitionPlan, model_fingerprint

    infos = partitionable_ops(mod)
    ratios = {"conv2d_0": 1.0, "conv2d_1": 0.3, "conv2d_2": 0.0, "conv2d_3": 0.3}
    return PartitionPlan(
        tuple(OpPartition(i.name, "H", ratios[i.name]) for i in infos),
        (),
        model_fingerprint(mod, infos),
        home="cpu",
        order=("conv2d_0", "conv2d_1", "conv2d_3", "conv2d_2"),
    )


def test_order_splits_issues_a_split_shortcut_before_the_branch_its_add_reads():
    """A split shortcut whose merged add slices the branch's result per part: the slices wait
    for the branch like the add (the order was refused: "split conv2d_3 reads ..., computed by
    split conv2d_2 that the order puts later")."""
    from .test_passes_split import run

    mod = load_onnx(residual_block()).mod
    plan = _split_residual_plan(mod)
    parted, ordered, convs = _partition_and_order(mod, plan)
    # the split shortcut's two parts come before the branch's second conv
    assert list(dict.fromkeys(convs)) == list(plan.order)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    np.testing.assert_allclose(run(ordered, x), run(parted, x), rtol=1e-5, atol=1e-5)


@pytest.mark.opencl
def test_split_shortcut_before_the_branch_equals_onnxruntime(opencl):
    import codl_tvm

    proto = residual_block()
    model = load_onnx(proto)
    plan = _split_residual_plan(model.mod)
    feeds = random_inputs(model, seed=9)
    (want,) = onnxruntime_outputs(proto, feeds)
    built = codl_tvm.compile(model.mod, plan)
    assert_close(built([feeds[s.name] for s in model.inputs])[0], want)
    # each processor issues its splits in the plan's order (IssueGpuAhead enqueues the GPU's
    # ahead of the CPU's shortcut, so the merged order differs)
    for proc in ("cpu", "gpu"):
        calls = built.kernel_splits["calls"]
        issued = list(dict.fromkeys(c[1] for c in calls if c[1] is not None and c[2] == proc))
        assert issued == [s for s in plan.order if s in issued], proc


def test_verify_adopting_an_auto_candidate_records_the_mode_it_chose(
    tmp_path, branches_mod, costly_splits_model
):
    """``--verify-modes auto`` (or a calibrated re-plan of ``--mode auto``) whose build is the
    fastest: the manifest names the mode auto chose and its candidates, not ``auto``."""
    from codl_tvm.objectives.latency import adopt_plan_record
    from codl_tvm.runtime.artifact import write_plan_files

    plan, report = make_plan(branches_mod, costly_splits_model, "auto", placement=PLAIN)
    record = {"source": "planner", "mode": "codl"}
    adopt_plan_record(record, report, "auto")
    write_plan_files(tmp_path, plan, report)
    assert record["mode"] == "hope" and record["planned_mode"] == "codl"
    assert record["auto"]["candidates_ms"] == pytest.approx(report.candidates)
    assert json.loads((tmp_path / "plan_report.json").read_text())["auto"]["chosen"] == "hope"


def _issued_calls(built, x) -> list[str]:
    """The VM's calls of one inference, in order (kernels by their host function's name)."""
    vm = built.vm
    calls: list[str] = []

    def instrument(func, symbol, before_run, ret, *args):
        if before_run:
            calls.append(str(symbol))
        return 0

    vm.set_instrument(instrument)
    try:
        vm["main"](tvm.runtime.tensor(x, tvm.opencl(0)))
        tvm.opencl(0).sync()
    finally:
        vm.set_instrument(None)
    return calls


@pytest.mark.opencl
@pytest.mark.parametrize("home", ["cpu", "gpu"])
def test_gpu_branch_is_flushed_before_the_cpu_branch_runs(opencl, home):
    """A GPU branch beside a CPU branch runs at once only if its kernels were submitted before
    the host runs the CPU's: every CPU kernel issued after GPU kernels comes after a
    ``gpu_mark`` or a ``gpu_flush`` that follows them. With the join on the GPU (home ``gpu``)
    no CPU kernel reads the GPU branch, so no mark would flush it: the flush does. Checked on
    the program the VM runs (the dispatch structure), not on timings: on a CPU OpenCL runtime
    sharing the host's cores, whether the two lanes' intervals overlap depends on the load."""
    import codl_tvm
    from codl_tvm.core.plan import OpPartition, PartitionPlan, model_fingerprint

    proto = inception_like(c=16, hw=16)
    model = load_onnx(proto)
    infos = partitionable_ops(model.mod)
    names = [i.name for i in infos]  # conv2d_0 (stem), conv2d_1, conv2d_2, conv2d_3, pool, conv
    gpu = {names[0], names[1], names[4], names[5]}  # stem, the 1x1 branch and the pool branch
    ops = tuple(OpPartition(n, "OC", 1.0 if n in gpu else 0.0) for n in names)
    order = (names[0], names[1], names[4], names[5], names[2], names[3])
    plan = PartitionPlan(ops, (), model_fingerprint(model.mod, infos), home=home, order=order)
    built = codl_tvm.compile(model.mod, plan)
    feeds = random_inputs(model, seed=3)
    (want,) = onnxruntime_outputs(proto, feeds)
    x = feeds[model.inputs[0].name]
    assert_close(built([x])[0], want)
    processor = {c[0]: c[2] for c in built.kernel_splits["calls"]}
    calls = _issued_calls(built, x)
    kernels = [c for c in calls if c in processor]
    first_cpu_branch = next(
        i for i, c in enumerate(calls) if processor.get(c) == "cpu" and i > calls.index(kernels[0])
    )
    assert any(processor.get(c) == "gpu" for c in calls[:first_cpu_branch])
    unsubmitted = False
    for c in calls:
        if processor.get(c) == "gpu":
            unsubmitted = True
        elif c in ("codl.coexec.gpu_mark", "codl.coexec.gpu_flush"):
            unsubmitted = False
        elif processor.get(c) == "cpu":
            assert not unsubmitted, f"{c} runs while GPU kernels before it are not submitted"


CHAINING = SyntheticDevice(share_ms_per_mb=0.3, presync_ms=0.05)


def test_codl_hope_keeps_codls_chains():
    """Sharing costly enough that CoDL chains the three convs (sharing at the chain's entry
    and exit only): codl_hope offers the chain as a choice and plans it, never slower."""
    mod = load_onnx(conv_chain()).mod
    cm = synthetic_cost_model(CHAINING)
    codl_plan, codl_report = make_plan(mod, cm, "codl")
    plan, report = make_plan(mod, cm, "codl_hope")
    assert len(codl_plan.chains) == 1 and plan.chains == codl_plan.chains
    assert report.summary.predicted_ms <= codl_report.summary.predicted_ms * (1 + 1e-9)
    assert report.summary.chain_lengths == (3,)
    assert plan.order == ("conv2d_0..conv2d_2",)
    assert any("CoDL chain H@" in d.reason for d in report.decisions)
    plan.validate(mod)


@pytest.mark.opencl
def test_codl_hope_chain_plan_equals_onnxruntime(opencl):
    import codl_tvm

    proto = conv_chain()
    model = load_onnx(proto)
    plan, _ = make_plan(model.mod, synthetic_cost_model(CHAINING), "codl_hope")
    assert plan.chains
    feeds = random_inputs(model, seed=4)
    (want,) = onnxruntime_outputs(proto, feeds)
    built = codl_tvm.compile(model.mod, plan)
    assert_close(built([feeds[s.name] for s in model.inputs])[0], want)
