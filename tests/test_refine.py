"""Plans refined from timelines: kernel attribution, the balancing rule, and refined artifacts.

The rule is checked on hand-worked numbers; the attribution and the refined artifact on real
builds of the bundled CNN run through PoCL, whose outputs are compared with the unpartitioned
reference. No test asserts a time.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import codl_tvm
from codl_tvm.artifact import ArtifactError, compile_artifact, load_artifact, refine_artifact
from codl_tvm.cli import bundled_model_path, main
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.planner.split.refine import RefineError, SplitTime, refine_plan, split_times
from codl_tvm.profiling.trace import Trace, TraceEvent, trace_inference

# -- the balancing rule ---------------------------------------------------------------------


def _splits(**shares):
    out = {}
    for name, (ops, share) in shares.items():
        out[name] = {"ops": list(ops), "dim": "H", "ratio": share, "gpu_share": share}
    return {"splits": out, "calls": []}


def test_balanced_share_on_hand_worked_numbers():
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", "H", 0.5), OpPartition("conv2d_3", "OC", 0.3)),
        chains=(ChainPlan(("conv2d_1", "conv2d_2"), "H", 0.42),),
    )
    splits = _splits(
        conv2d_0=(["conv2d_0"], 0.5),
        # the chain was built with 0.4 of the rows (rounding), not its nominal 0.42
        **{"conv2d_1..conv2d_2": (["conv2d_1", "conv2d_2"], 0.4)},
        conv2d_3=(["conv2d_3"], 0.3),
    )
    times = {
        # whole op on the CPU 6 ms, on the GPU 2 ms: the GPU should take 6 / 8 of it
        "conv2d_0": SplitTime(3000.0, 1000.0, 5),
        # C = 2 / 0.6 = 3.33, G = 2 / 0.4 = 5: balanced at 0.4, i.e. unchanged
        "conv2d_1..conv2d_2": SplitTime(2000.0, 2000.0, 5),
        # C = 0.7 / 0.7 = 1, G = 2.7 / 0.3 = 9: 0.1
        "conv2d_3": SplitTime(700.0, 2700.0, 5),
    }
    refined, rows = refine_plan(plan, splits, times)
    assert refined.ops[0].ratio == 0.75
    assert refined.chains[0].ratio == 0.42
    assert refined.ops[1].ratio == 0.1
    by = {r["split"]: r for r in rows}
    assert by["conv2d_0"]["balanced_share"] == pytest.approx(0.75)
    assert by["conv2d_0"]["cpu_ms"] == pytest.approx(3.0)
    # half-way steps
    half, _ = refine_plan(plan, splits, times, step=0.5)
    assert half.ops[0].ratio == pytest.approx(0.62, abs=0.005)
    # a split that only one processor ran stays as it is, within bounds
    times["conv2d_0"] = SplitTime(3000.0, 0.0, 5)
    kept, rows = refine_plan(plan, splits, times, min_share=0.2)
    assert kept.ops[0].ratio == 0.5
    assert "kept" in {r["split"]: r for r in rows}["conv2d_0"]["note"]
    assert kept.ops[1].ratio == 0.2  # 0.1 clamped to min_share


def test_output_channel_cuts_move_in_whole_vectors():
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", "OC", 0.4), OpPartition("conv2d_1", "OC", 0.4)),
        chains=(ChainPlan(("conv2d_2", "conv2d_3"), "H", 0.4),),
    )
    splits = _splits(
        conv2d_0=(["conv2d_0"], 0.4),
        conv2d_1=(["conv2d_1"], 0.4),
        **{"conv2d_2..conv2d_3": (["conv2d_2", "conv2d_3"], 0.4)},
    )
    splits["splits"]["conv2d_0"].update(dim="OC", extent=256)
    splits["splits"]["conv2d_1"].update(dim="OC", extent=40)  # fewer than 4 vectors
    splits["splits"]["conv2d_2..conv2d_3"]["extent"] = 56
    # C = 1 / 0.6, G = 0.7 / 0.4: balanced at 0.4878 of the output
    same = SplitTime(1000.0, 700.0, 1)
    times = {"conv2d_0": same, "conv2d_1": same, "conv2d_2..conv2d_3": same}
    refined, _ = refine_plan(plan, splits, times)
    # 0.49 of 256 channels is 125.4: the cut goes to 128, 8 vectors of 16
    assert refined.ops[0].ratio == 0.5
    assert refined.ops[1].ratio == 0.49
    assert refined.chains[0].ratio == 0.49
    from codl_tvm.core.geometry import split_point

    for share in (0.07, 0.33, 0.61, 0.93):
        splits["splits"]["conv2d_0"]["gpu_share"] = share
        ratio = refine_plan(plan, splits, {"conv2d_0": SplitTime(500.0, 500.0, 1)})[0].ops[0].ratio
        assert split_point(256, ratio) % 16 == 0


def test_channel_blocks_set_the_block_ratio():
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5),), block_ratio=0.5)
    splits = _splits(
        conv2d_0=(["conv2d_0"], 0.5),
        **{
            "conv2d_0+channels": (["conv2d_0"], 0.5),
            "conv2d_4+channels": (["conv2d_4"], 0.5),
        },
    )
    times = {
        "conv2d_0": SplitTime(1000.0, 1000.0, 1),
        # pooled: CPU 2 * (1 + 2) = 6 ms whole, GPU 2 * (0.5 + 1) = 3 ms: GPU share 2 / 3
        "conv2d_0+channels": SplitTime(1000.0, 500.0, 1),
        "conv2d_4+channels": SplitTime(2000.0, 1000.0, 1),
    }
    refined, rows = refine_plan(plan, splits, times)
    assert refined.block_ratio == 0.67
    assert refined.ops[0].ratio == 0.5
    assert rows[-1]["split"] == "block_ratio"


def test_refine_errors():
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "H", 0.5),))
    with pytest.raises(RefineError, match="recorded no splits"):
        refine_plan(plan, {"splits": {}, "calls": []}, {})
    with pytest.raises(RefineError, match="step"):
        refine_plan(plan, _splits(conv2d_0=(["conv2d_0"], 0.5)), {}, step=0)
    with pytest.raises(RefineError, match="attribute no kernel"):
        split_times([Trace([TraceEvent("CPU", "k", 0.0, 1.0)])])


def test_split_times_take_the_median_of_per_timeline_sums():
    def trace(cpu, gpu):
        return Trace(
            [
                TraceEvent("CPU", "a", 0.0, cpu / 2, "s"),
                TraceEvent("CPU", "b", cpu / 2, cpu, "s"),
                TraceEvent("GPU", "g", 0.0, gpu, "s"),
                TraceEvent("sync", "wait", 0.0, 50.0),
                TraceEvent("GPU", "other", 0.0, 99.0),
            ]
        )

    times = split_times([trace(10.0, 4.0), trace(30.0, 8.0), trace(20.0, 100.0)])
    assert times == {"s": SplitTime(20.0, 8.0, 3)}


def test_trace_summary_counts_gpu_kernels_and_gaps():
    trace = Trace(
        [
            TraceEvent("GPU", "k", 0.0, 10.0),
            TraceEvent("GPU", "k", 12.0, 20.0),  # gap 2
            TraceEvent("GPU", "k_1", 30.0, 40.0),  # gap 10
            TraceEvent("GPU", "k_2", 38.0, 50.0),  # overlaps: gap 0
            TraceEvent("CPU", "c", 0.0, 100.0),
        ]
    )
    s = trace.summary()
    assert (s["gpu_kernels"], s["gpu_kernels_distinct"]) == (4, 3)
    assert s["gpu_gap_us"] == 2.0
    assert Trace([TraceEvent("GPU", "k", 0.0, 1.0)]).summary()["gpu_gap_us"] == 0.0


# -- attribution on real builds -------------------------------------------------------------


PLAN = PartitionPlan(
    ops=(OpPartition("conv2d_2", "H", 0.4), OpPartition("conv2d_5", "OC", 0.4)),
    chains=(ChainPlan(("conv2d_0", "conv2d_1"), "H", 0.5),),
)


def test_every_kernel_of_a_split_is_attributed(opencl, tmp_path):
    model = load_onnx(bundled_model_path())
    built = codl_tvm.compile(model.mod, PLAN)
    record = built.kernel_splits
    assert set(record["splits"]) == {"conv2d_0..conv2d_1", "conv2d_2", "conv2d_5"}
    # the chain's convs are fused kernels: their split survives FuseTIR
    fused = [c for c in record["calls"] if c[0].startswith("fused_conv2d") and c[1]]
    assert {c[1] for c in fused} == set(record["splits"])
    assert {c[2] for c in fused} == {"cpu", "gpu"}
    assert record["splits"]["conv2d_2"]["gpu_share"] == pytest.approx(13 / 32)
    trace = trace_inference(built, [random_inputs(model)["input"]])
    lanes = {(e.split, e.lane) for e in trace.events if e.split}
    assert lanes == {(s, lane) for s in record["splits"] for lane in ("CPU", "GPU")}
    # the kernels outside every split are exactly those the record leaves unattributed
    outside = {c[0] for c in record["calls"] if c[1] is None}
    for e in trace.events:
        if e.lane == "CPU":
            assert (e.split is None) == (e.name in outside), e
    trace.save_chrome(tmp_path / "t.json")
    again = Trace.load_chrome(tmp_path / "t.json")
    assert [e.split for e in again.events] == [e.split for e in trace.events]
    # a record of another build: no event is attributed
    other = {"splits": record["splits"], "calls": [["nothing", "conv2d_2", "cpu"]]}
    assert not any(
        e.split for e in trace_inference(built, [random_inputs(model)["input"]], 0, other).events
    )


def test_identical_splits_share_kernels_and_are_told_apart(opencl, tmp_path):
    """LegalizeOps shares one PrimFunc among identical convs (VGG's repeated layers). The
    timeline must still tell the splits apart (or it adds one split's time to another), and
    the build must still compile each distinct kernel once: PoCL reloads every kernel's binary
    at each launch once a model has more than 128 distinct kernels."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "input"
    for i in range(3):
        w = rng.standard_normal((32, 32, 3, 3)).astype("float32") * 0.1
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    shape = [1, 32, 16, 16]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    model = load_onnx(model)
    feeds = random_inputs(model, seed=1)
    from codl_tvm.build.runner import build

    want = build(model.mod, "cpu")([feeds["input"]])[0]
    for dim in ("OC", "H"):  # H: the input slices are shared kernels too
        plan = PartitionPlan(ops=tuple(OpPartition(f"conv2d_{i}", dim, 0.5) for i in range(3)))
        built = codl_tvm.compile(model.mod, plan)
        calls = [c for c in built.kernel_splits["calls"] if c[1]]
        per = 2 if dim == "OC" else 4
        assert [c[1] for c in calls] == [f"conv2d_{i}" for i in range(3) for _ in range(per)]
        # the three splits run the same kernels (one per processor and step); the timeline
        # below attributes them only if the record names them as the VM calls them
        assert len({c[0] for c in calls}) == per
        trace = trace_inference(built, [feeds["input"]])
        assert {(e.split, e.lane) for e in trace.events if e.split} == {
            (f"conv2d_{i}", lane) for i in range(3) for lane in ("CPU", "GPU")
        }
        np.testing.assert_allclose(built([feeds["input"]])[0], want, rtol=0, atol=1e-4)


@pytest.mark.slow  # 17 s on 2 cores; CI keeps the split-kernel numerics above
def test_refined_artifact_is_numerically_the_model(opencl, tmp_path):
    art_dir = tmp_path / "art"
    PLAN.save(tmp_path / "plan.json")
    compile_artifact(bundled_model_path(), art_dir, plan=PLAN, log=lambda _m: None)
    assert load_artifact(art_dir).kernel_splits["calls"]
    out = refine_artifact(art_dir, tmp_path / "refined", traces=2, log=lambda _m: None)
    art = load_artifact(out)
    manifest = art.manifest
    assert manifest["device"] == "coexec"
    assert manifest["plan"]["source"] == "refined"
    rows = {r["split"]: r for r in manifest["plan"]["refined"]["splits"]}
    plan = PartitionPlan.load(out / "plan.json")
    for entry in plan.entries():
        name = entry.ops[0] if len(entry.ops) == 1 else f"{entry.ops[0]}..{entry.ops[-1]}"
        assert entry.ratio == rows[name]["new_ratio"]
        assert 0.05 <= entry.ratio <= 0.95
    assert manifest["plan"]["refined"]["from_plan"] == PLAN.to_dict()
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))
    # the CLI: one more round from the refined artifact, then its output checked by `run`
    assert main(["refine", str(out), "-o", str(tmp_path / "again"), "--traces", "1"]) == 0
    assert main(["run", str(tmp_path / "again"), "--repeat", "1", "--number", "1"]) == 0
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["plan"]["refined"][
        "from"
    ] == str(out)


def test_refine_rejects_what_it_cannot_refine(opencl, tmp_path, capsys):
    cpu = tmp_path / "cpu"
    compile_artifact(bundled_model_path(), cpu, device="cpu", log=lambda _m: None)
    with pytest.raises(ArtifactError, match="runs on the cpu alone"):
        refine_artifact(cpu, tmp_path / "x", log=lambda _m: None)
    with pytest.raises(ArtifactError, match="directory of its own"):
        refine_artifact(cpu, cpu, log=lambda _m: None)
    assert main(["refine", str(cpu), "-o", str(tmp_path / "y")]) == 2
    assert "runs on the cpu alone" in capsys.readouterr().err
    assert main(["refine", str(cpu), "-o", str(tmp_path / "y"), "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err
    # a co-executed artifact whose model file has moved
    art = tmp_path / "art"
    model = tmp_path / "m.onnx"
    model.write_bytes(bundled_model_path().read_bytes())
    compile_artifact(model, art, plan=PLAN, reference=False, log=lambda _m: None)
    model.unlink()
    with pytest.raises(ArtifactError, match="model file is gone"):
        refine_artifact(art, tmp_path / "z", traces=1, log=lambda _m: None)
    # an artifact from before the kernel record
    manifest = json.loads((art / "manifest.json").read_text())
    del manifest["kernel_splits"]
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="no kernel record"):
        refine_artifact(art, tmp_path / "z", traces=1, log=lambda _m: None)


@pytest.mark.slow
def test_verify_times_a_refined_candidate(opencl, tmp_path, capsys):
    """``compile --verify N --refine 1``: the plan's build is traced, refined and built again,
    and every build is timed; whichever is kept computes the model."""
    lopsided = PartitionPlan(
        ops=(OpPartition("conv2d_2", "H", 0.1), OpPartition("conv2d_5", "OC", 0.1)),
        chains=(ChainPlan(("conv2d_0", "conv2d_1"), "H", 0.1),),
    )
    out = tmp_path / "art"
    compile_artifact(
        bundled_model_path(),
        out,
        plan=lopsided,
        verify=1,
        refine=1,
        refine_traces=2,
        log=lambda _m: None,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"coexec", "coexec:refined", "cpu", "opencl"} <= set(manifest["verify"]["median_ms"])
    record = manifest["plan"]["refine"]["candidates"]["coexec:refined"]
    assert record["from"] == "coexec" and record["from_plan"] == lopsided.to_dict()
    assert len(record["span_ms"]) == 2
    moved = {r["split"]: r["new_ratio"] for r in record["splits"] if "new_ratio" in r}
    assert moved and any(v != 0.1 for v in moved.values())
    art = load_artifact(out)
    if manifest["verify"]["chosen"] == "coexec:refined":
        plan = PartitionPlan.load(out / "plan.json")
        assert manifest["plan"]["source"] == "refined"
        assert not (out / "plan_report.json").exists()
        for entry in plan.entries():
            name = entry.ops[0] if len(entry.ops) == 1 else f"{entry.ops[0]}..{entry.ops[-1]}"
            assert entry.ratio == moved[name]
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-4 * max(1.0, float(np.abs(w).max())))
    # refinement needs --verify to judge it, and timelines taken here
    with pytest.raises(ArtifactError, match="refine needs verify > 0"):
        compile_artifact(bundled_model_path(), tmp_path / "x", refine=1, log=lambda _m: None)
    with pytest.raises(ArtifactError, match="cannot be combined with tracker"):
        compile_artifact(
            bundled_model_path(),
            tmp_path / "x",
            verify=1,
            refine=1,
            tracker="127.0.0.1:9190",
            key="k",
            log=lambda _m: None,
        )
    assert main(["compile", str(bundled_model_path()), "-o", str(tmp_path / "y"), "--refine", "1"])
    assert "--refine needs --verify > 0" in capsys.readouterr().err
    assert (
        main(
            [
                "compile",
                str(bundled_model_path()),
                "-o",
                str(tmp_path / "y"),
                "--verify",
                "1",
                "--refine",
                "1",
                "--refine-traces",
                "0",
            ]
        )
        == 2
    )
    assert "--refine-traces must be a whole number >= 1" in capsys.readouterr().err
