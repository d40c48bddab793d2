"""The benchmark helpers' bookkeeping: the overlap window of the concurrent bound (T* under
contention) and the loops that fill it. Nothing here asserts a time: timing belongs on the device
machine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.cli import bundled_model_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.profiling.stats import concurrent_bound, overlapped, paired_ab, paired_ratios
from codl_tvm.runtime.artifact import load_artifact


def test_overlapped_keeps_runs_inside_the_common_window():
    # CPU loop from t=0, GPU loop from t=1.5; the GPU loop outlives the CPU's last run (t=6).
    cpu = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0), (5.0, 6.0)]
    gpu = [(1.5, 3.5), (3.5, 5.5), (5.5, 7.5)]
    in_cpu, in_gpu = overlapped(cpu, gpu)
    # Window [1.5, 6]: the CPU runs started before 1.5 had the machine to themselves in part.
    assert in_cpu == [1.0, 1.0, 1.0, 1.0]
    assert in_gpu == [2.0, 2.0]
    assert overlapped(cpu, []) == ([], [])


def test_overlapped_without_a_common_window():
    assert overlapped([(0.0, 1.0)], [(2.0, 3.0)]) == ([], [])


def test_concurrent_bound_fills_both_loops():
    calls = {"cpu": 0, "gpu": 0}

    def run(which):
        def step():
            calls[which] += 1
            np.linalg.svd(np.ones((64, 64)))  # some work that releases the GIL

        return step

    bound = concurrent_bound(run("cpu"), run("gpu"), seconds=0.0, min_runs=3)
    assert bound.cpu_runs >= 3 and bound.gpu_runs >= 3
    assert calls["cpu"] >= bound.cpu_runs and calls["gpu"] >= bound.gpu_runs
    expected = 1.0 / (1.0 / bound.cpu_ms + 1.0 / bound.gpu_ms)
    assert bound.t_star_ms == pytest.approx(expected)
    assert bound.t_star_ms < min(bound.cpu_ms, bound.gpu_ms)


def test_concurrent_bound_reports_a_failing_gpu_loop():
    def broken():
        raise ValueError("no device")

    with pytest.raises(RuntimeError, match="GPU loop failed: ValueError"):
        concurrent_bound(lambda: None, broken, seconds=0.0)


def test_concurrent_bound_gives_up_when_the_window_never_fills():
    def one_long_run():  # one GPU run longer than the whole budget
        time.sleep(1.0)

    with pytest.raises(RuntimeError, match="0 GPU runs overlapped"):
        concurrent_bound(lambda: None, one_long_run, seconds=0.0, max_seconds=0.2)


@pytest.mark.opencl
def test_concurrent_bound_runs_real_builds(tmp_path, opencl):
    """The CPU build on this thread, the OpenCL build on the loop's: both still compute the
    model's outputs afterwards (the runner's inputs stay on the device between runs)."""
    model = bundled_model_path()
    arts = {}
    for device in ("cpu", "opencl"):
        out = compile_artifact(model, tmp_path / device, CompileOptions(device=device))
        arts[device] = load_artifact(out)
    inputs, expected = arts["cpu"].reference()
    feed = [inputs[s.name] for s in arts["cpu"].model.inputs]
    bound = concurrent_bound(
        arts["cpu"].runner(feed), arts["opencl"].runner(feed), seconds=0.0, min_runs=2
    )
    assert bound.cpu_runs >= 2 and bound.gpu_runs >= 2
    for art in arts.values():
        for got, want in zip(art(feed), expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_paired_ratios_compare_within_each_round():
    # Round 2 is slowed for every variant (other load): per-round ratios cancel it.
    cpu = [10.0, 20.0, 10.0]
    gpu = [15.0, 30.0, 30.0]
    variant = [8.0, 16.0, 12.0]
    paired = paired_ratios(variant, cpu, gpu)
    assert paired.speedup_vs_best_single == pytest.approx([1.25, 1.25, 10.0 / 12.0])
    # T* per round: 6, 12, 7.5 ms
    assert paired.of_t_star == pytest.approx([0.75, 0.75, 7.5 / 12.0])
    assert paired.median_speedup == pytest.approx(1.25)
    assert paired.median_of_t_star == pytest.approx(0.75)
    assert paired.rounds_slower == 1


def test_paired_ratios_reject_unpaired_samples():
    with pytest.raises(ValueError, match="one sample per round"):
        paired_ratios([1.0, 2.0], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="one sample per round"):
        paired_ratios([], [], [])
    with pytest.raises(ValueError, match="positive"):
        paired_ratios([1.0], [0.0], [1.0])


def test_paired_ab_pools_rounds_of_several_runs():
    # Run 2 is slow for both builds; A is 10% slower than B in every round but one tie.
    runs = [([11.0, 22.0, 10.01], [10.0, 20.0, 10.0]), ([33.0, 44.0], [30.0, 40.0])]
    ab = paired_ab(runs)
    assert ab.ratios == pytest.approx([1.1, 1.1, 1.001, 1.1, 1.1])
    assert ab.median == pytest.approx(1.1)
    assert (ab.rounds_a_slower, ab.rounds_a_faster) == (4, 0)  # 1.001 is a tie
    # 4 of 4 non-tied rounds one way: 2 * (1/2)**4
    assert ab.sign_test_p == pytest.approx(0.125)
    assert ab.to_json()["rounds"] == 5


def test_paired_ab_sign_test_of_a_balanced_and_an_empty_comparison():
    ab = paired_ab([([1.1, 0.9, 1.2, 0.8], [1.0, 1.0, 1.0, 1.0])])
    assert (ab.rounds_a_slower, ab.rounds_a_faster) == (2, 2)
    assert ab.sign_test_p == pytest.approx(1.0)
    # 7 of 8 one way: 2 * (C(8,7) + C(8,8)) / 2**8
    lopsided = paired_ab([([1.2] * 7 + [0.8], [1.0] * 8)])
    assert lopsided.sign_test_p == pytest.approx(2 * 9 / 256)
    # the other way round: 1 slower, 7 faster, the same p
    faster = paired_ab([([1.2] + [0.8] * 7, [1.0] * 8)])
    assert (faster.rounds_a_slower, faster.rounds_a_faster) == (1, 7)
    assert faster.sign_test_p == pytest.approx(2 * 9 / 256)
    # the tie band is symmetric: A/B and B/A fall on the same side of it
    for ratio, counted in ((1.00502, 1), (1.00498, 0)):
        assert paired_ab([([ratio], [1.0])]).rounds_a_slower == counted
        assert paired_ab([([1.0], [ratio])]).rounds_a_faster == counted
    # 1100 rounds, all one way: no OverflowError (2**-1100 underflows to 0)
    assert paired_ab([([2.0] * 1100, [1.0] * 1100)]).sign_test_p < 1e-300
    assert paired_ab([([2.0] * 23, [1.0] * 23)]).to_json()["sign_test_p"] == pytest.approx(2.38e-7)
    assert paired_ab([([1.0, 2.0], [1.0, 2.0])]).sign_test_p == 1.0  # all ties


def test_paired_ab_rejects_unpaired_samples():
    with pytest.raises(ValueError, match="run 1 has 1 samples of A and 2 of B"):
        paired_ab([([1.0], [1.0]), ([1.0], [1.0, 2.0])])
    for bad in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="not positive"):
            paired_ab([([1.0, bad], [1.0, 1.0])])
    with pytest.raises(ValueError, match="no rounds"):
        paired_ab([])
    with pytest.raises(ValueError, match="no rounds"):
        paired_ab([([], [])])


def _run_json(path, models: dict) -> str:
    rows = {
        name: {"rows": {tag: {"samples_ms": s} for tag, s in tags.items()}}
        for name, tags in models.items()
    }
    path.write_text(json.dumps({"commit": "abc", "results": {"models": rows}}))
    return str(path)


def test_bench_planner_compare_pools_runs(tmp_path, capsys):
    from tests.scripts_util import script_module

    one = _run_json(
        tmp_path / "one.json",
        {"m": {"codl": [2.2, 2.2], "x": [2.0, 2.0]}, "other": {"codl": [1.0], "y": [1.0]}},
    )
    two = _run_json(tmp_path / "two.json", {"m": {"codl": [1.8, 3.3, 3.3], "x": [2.0, 3.0, 3.0]}})
    out = tmp_path / "ab.json"
    with script_module("bench_planner") as bp:
        bp.main(
            ["compare", "--results", f"{one},{two}", "--a", "codl", "--b", "x", "--out", str(out)]
        )
        got = json.loads(out.read_text())["results"]
        assert got["a"] == "codl" and got["b"] == "x"
        assert list(got["models"]) == ["m"]  # "other" has no build x
        m = got["models"]["m"]
        assert m["pooled"]["ratios"] == pytest.approx([1.1, 1.1, 0.9, 1.1, 1.1])
        assert (m["pooled"]["rounds_a_slower"], m["pooled"]["rounds_a_faster"]) == (4, 1)
        assert [r["median_ratio"] for r in m["runs"]] == pytest.approx([1.1, 1.1])
        printed = capsys.readouterr()
        assert "pooled 1.100 (4/1 of 5" in printed.out
        assert "other has no x: skipped" in printed.err
        with pytest.raises(SystemExit, match=r"no model of .* has both codl and z"):
            bp.main(["compare", "--results", one, "--a", "codl", "--b", "z"])
        with pytest.raises(SystemExit, match=r"has other \(--models\) with both codl and x"):
            bp.main(["compare", "--results", one, "--a", "codl", "--b", "x", "--models", "m,other"])
        with pytest.raises(SystemExit, match="named twice"):
            bp.main(["compare", "--results", f"{one},{one}", "--a", "codl", "--b", "x"])
        with pytest.raises(SystemExit, match="--a and --b are both codl"):
            bp.main(["compare", "--results", one, "--a", "codl", "--b", "codl"])
        (tmp_path / "bad.json").write_text("{}")
        with pytest.raises(SystemExit, match=r"bad\.json is no `bench_planner\.py run` JSON"):
            bp.main(["compare", "--results", str(tmp_path / "bad.json"), "--a", "a", "--b", "b"])
        zero = _run_json(tmp_path / "zero.json", {"m": {"codl": [0.0], "x": [1.0]}})
        with pytest.raises(SystemExit, match=r"zero\.json, m: paired_ab: run 0 has a latency"):
            bp.main(["compare", "--results", zero, "--a", "codl", "--b", "x"])


def test_bench_planner_tags_combine_suffixes_in_any_order():
    from tests.scripts_util import script_module

    with script_module("bench_planner") as bp:
        flags = bp._tag_mode("codl_alone_rowlrn")
        assert (flags.mode, flags.alone, flags.rowlrn, flags.streaming) == (
            "codl",
            True,
            True,
            False,
        )
        flags = bp._tag_mode("h_only_rowlrn_streaming")
        assert (flags.mode, flags.rowlrn, flags.streaming) == ("h_only", True, True)
        assert bp._tag_mode("codl_wholenorm").wholenorm
        assert bp._tag_mode("codl") == bp._TagFlags("codl")  # row blocks off by default
        assert bp._tag_mode("codl_hope") == bp._TagFlags("codl_hope")  # placement modes too
        with pytest.raises(SystemExit, match="LRN blocks are whole by default"):
            bp._tag_mode("codl_wholelrn")
        with pytest.raises(SystemExit, match="names no planner mode"):
            bp._tag_mode("fast")
        # the single-processor and oracle builds carry no planner flags
        assert bp._tag_mode("oracle", strict=False) == bp._TagFlags("oracle")


def _balance_run(path, k, models):
    """A `bench_planner.py run` JSON at split k: {model: (Tcpu, Tgpu, codl, T*c per round)}."""
    out = {}
    for name, (tc, tg, codl, tsc) in models.items():
        t_star = tc * tg / (tc + tg)
        out[name] = {
            "summary": {
                "t_cpu_ms": tc,
                "t_gpu_ms": tg,
                "t_star_ms": t_star,
                "concurrent": {"t_star_ms": tsc, "t_star_c_over_t_star": tsc / t_star},
            },
            "rows": {
                "codl": {
                    "device": "coexec",
                    "paired": {
                        "speedup_vs_best_single": min(tc, tg) / codl,
                        "of_t_star": t_star / codl,
                        "of_t_star_concurrent": tsc / codl,
                    },
                }
            },
        }
    data = {"env": {"POCL_CPU_MAX_CU_COUNT": str(k)}, "results": {"models": out}}
    path.write_text(json.dumps(data))
    return str(path)


def test_bench_planner_balance_table_and_plot(tmp_path, capsys):
    from tests.scripts_util import script_module

    k8 = _balance_run(tmp_path / "k8.json", 8, {"m": (2.0, 6.0, 1.8, 1.8)})
    k14 = _balance_run(tmp_path / "k14.json", 14, {"m": (6.0, 2.0, 1.6, 2.0)})
    out, png = tmp_path / "balance.json", tmp_path / "balance.png"
    with script_module("bench_planner") as bp:
        bp.main(["balance", "--results", f"{k8},{k14}", "--out", str(out), "--plot", str(png)])
        rows = json.loads(out.read_text())["results"]["rows"]
        assert [(r["k"], r["model"]) for r in rows] == [(8, "m"), (14, "m")]
        assert rows[0]["cpu_over_gpu"] == pytest.approx(1 / 3)
        assert rows[0]["gain"] == pytest.approx(2.0 / 1.8)
        assert rows[0]["of_t_star"] == pytest.approx(1.5 / 1.8)
        assert rows[1]["of_t_star_c"] == pytest.approx(2.0 / 1.6)
        assert rows[1]["t_star_c_over_t_star"] == pytest.approx(2.0 / 1.5)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "14 m" in capsys.readouterr().out
        with pytest.raises(SystemExit, match="has x"):
            bp.main(["balance", "--results", k8, "--tag", "x"])


@pytest.mark.opencl
def test_coexec_benchmark_helpers_build_and_run_a_split_conv(tmp_path, opencl):
    """The co-execution benchmarks' build targets, device record and library runner on a real
    co-executed conv: its output equals the unpartitioned build's."""
    import tvm
    from onnx import TensorProto, helper, numpy_helper

    import codl_tvm
    from codl_tvm.build.runner import build
    from codl_tvm.build.targets import host_cpu
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx
    from tests.scripts_util import script_module

    with script_module("bench_util") as bench_util:
        coexec_targets = bench_util.coexec_targets
        open_opencl = bench_util.open_opencl
        run_coexec_library = bench_util.run_coexec_library
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model = load_onnx(proto)
    gpu, cpu = coexec_targets(host_cpu().name)
    assert gpu.kind.name == "opencl" and "device" not in gpu.attrs
    assert gpu.host.attrs["mcpu"] == cpu.attrs["mcpu"] == host_cpu().name
    assert coexec_targets(host_cpu().name, "pocl")[0].attrs["device"] == "pocl"
    built = codl_tvm.compile(
        model.mod, uniform_plan(model.mod, "H", 0.5), gpu=gpu, cpu=cpu, work_dir=tmp_path
    )
    info, record = open_opencl()
    assert record == {
        "platform": info.platform,
        "device": info.devices[0].name,
        "compute_units": info.devices[0].compute_units,
    }
    x = rng.standard_normal((1, 4, 12, 12)).astype(np.float32)
    dev = tvm.opencl(0)
    out, ms = run_coexec_library(built.library, [tvm.runtime.tensor(x, dev)], dev, 1, 1)
    np.testing.assert_allclose(out, build(model.mod, "cpu")([x])[0], rtol=1e-4, atol=1e-4)
    assert isinstance(ms, float)


def test_never_slower_report_pairs_the_default_with_the_faster_processor(tmp_path, capsys):
    from tests.scripts_util import script_module

    run = _run_json(
        tmp_path / "run.json",
        {
            # kept the CPU alone, which is the faster processor: ties it
            "mobilenet_v2": {"cpu": [2.0, 2.0, 2.0], "gpu": [5.0, 5.0, 5.0], "default": [2.0] * 3},
            # a known model whose default build lost to the GPU alone in every round
            "vgg19": {"cpu": [9.0, 9.0, 9.0], "gpu": [4.0, 4.0, 4.0], "default": [5.0, 5.0, 4.8]},
            # kept the CPU alone's very library, timed below the floor against itself
            "posenet": {"cpu": [13.0] * 3, "gpu": [80.0] * 3, "default": [14.2, 14.2, 12.5]},
        },
    )
    data = json.loads(Path(run).read_text())
    models = data["results"]["models"]
    models["mobilenet_v2"]["rows"]["default"]["verify"] = {"chosen": "cpu"}
    models["vgg19"]["rows"]["default"]["verify"] = {"chosen": "coexec"}
    models["posenet"]["rows"]["default"]["verify"] = {"chosen": "cpu"}
    for name, tag, sha in (("posenet", "default", "aa"), ("posenet", "cpu", "aa"),
                           ("vgg19", "default", "bb"), ("vgg19", "gpu", "cc")):  # fmt: skip
        models[name]["rows"][tag]["library_sha256"] = sha
    Path(run).write_text(json.dumps(data))
    out = tmp_path / "ns.json"
    with script_module("bench_never_slower") as ns:
        ns.main(["report", "--runs", run, "--labels", "k14", "--out", str(out)])
    got = json.loads(out.read_text())["results"]
    rows = {r["model"]: r for r in got["rows"]}
    mob, vgg = rows["mobilenet_v2"], rows["vgg19"]
    assert (mob["unseen"], mob["kept"], mob["best_single"], mob["meets_floor"]) == (
        True,
        "cpu",
        "cpu",
        True,
    )
    assert (vgg["unseen"], vgg["kept"], vgg["best_single"]) == (False, "coexec", "gpu")
    # the GPU alone over the default build, round by round: 0.8, 0.8, 0.833
    assert vgg["speedup_vs_best_single"]["median_ratio"] == pytest.approx(0.8)
    assert vgg["speedup_vs_best_single"]["rounds_a_faster"] == 3
    assert not vgg["meets_floor"] and not vgg["kept_is_fastest_in_evaluation"]
    assert not vgg["same_library_as_best"] and not mob["same_library_as_best"]  # no hashes
    assert rows["posenet"]["same_library_as_best"] and not rows["posenet"]["meets_floor"]
    assert got["summary"]["known"] == {
        "models": 2,
        "meets_floor": 0,
        "below_floor_with_the_best_library": 1,
        "worst": pytest.approx(0.8),
    }
    assert "vgg19" in capsys.readouterr().out
