"""The profiler: part modules against the unpartitioned operator, a small real profiling run on
the local OpenCL device (well-formed dataset, resume, compile-dir/run-dir), and fitting on it.

Nothing here checks a latency value beyond "finite and > 0" (the machine is shared and slow)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.base import CostModelFallbackWarning
from codl_tvm.cost_model.dataset import SHARING_KINDS, DatasetWriter, load_dataset
from codl_tvm.cost_model.features import FeatureError, OpParams, Partition, part_shape
from codl_tvm.cost_model.part_ir import check_part, part_module, passes_parts
from codl_tvm.profiling.profile import (
    compile_jobs,
    make_jobs,
    model_ops,
    profile,
    run_compiled,
    sampled_ops,
)
from codl_tvm.profiling.timing import (
    LEGACY_TIMING,
    MAX_RUNS_PER_SAMPLE,
    TimingConfig,
    runs_per_sample,
)

FAST = TimingConfig(warmup=1, repeats=2, number=1)
OPS = [
    ("conv_a", OpParams("conv2d", 10, 10, 4, 8, 3, 1, 1)),
    ("conv_b", OpParams("conv2d", 9, 9, 4, 6, 3, 2, 1)),
]
RATIOS = (0.5, 1.0)
DIMS = ("H", "OC")


@pytest.fixture(scope="module")
def run(opencl, tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "data.jsonl"
    jobs = make_jobs(OPS, DIMS, RATIOS)
    counts = profile(jobs, out, timing=FAST, sharing_sizes=(4096, 65536), progress=False)
    return out, jobs, counts


@pytest.mark.opencl
def test_dataset_well_formed(run, opencl):
    out, jobs, counts = run
    data = load_dataset(out)
    ops = data.op_records
    assert counts == {"measured": len(jobs), "skipped": 0, "sharing": len(data.sharing_records)}
    # ratio 0.5: a GPU and a CPU part; ratio 1.0: the GPU part only; per op and dim.
    assert len(ops) == len(OPS) * len(DIMS) * 3 == len(jobs)
    assert {r.processor for r in ops} == {"gpu", "cpu"}
    assert {r.partition.dim for r in ops} == set(DIMS)
    assert {r.partition.ratio for r in ops} == set(RATIOS)
    assert {r.name for r in ops} == {n for n, _ in OPS}
    assert data.meta["timing"] == FAST.to_meta()
    for r in ops:
        assert np.isfinite(r.latency_ms) and r.latency_ms > 0
        assert r.repeats == FAST.repeats
        # The spread of the samples behind the median (runs per sample sized by the probe).
        assert 0 < r.min_ms <= r.latency_ms <= r.max_ms and np.isfinite(r.max_ms)
        assert 1 <= FAST.number <= r.number <= MAX_RUNS_PER_SAMPLE
        assert r.impl and r.impl != ""
        assert r.part == part_shape(r.params, r.partition, r.processor)
        if r.processor == "gpu":
            assert r.dispatch.wg_size and r.dispatch.wg_count
        else:
            assert r.dispatch.cpu_parallel_blocks and r.dispatch.threads
        assert r.device["svm_mode"] == opencl.svm_mode
        assert r.device["gpu"] == opencl.devices[0].name
    kinds = {(r.kind, r.nbytes) for r in data.sharing_records}
    assert {k for k, _ in kinds} == set(SHARING_KINDS)
    assert {
        ("transform", 4096),
        ("transform", 65536),
        ("presync", 4096),
        ("postsync", 65536),
    } <= kinds
    for r in data.sharing_records:
        if r.kind in ("map", "unmap") and opencl.svm_mode == "fine":
            assert r.latency_ms == 0.0
        elif r.kind == "transform":
            assert r.latency_ms > 0


@pytest.mark.opencl
def test_resume_skips_measured_keys(run, tmp_path):
    out, jobs, _ = run
    copy = tmp_path / "data.jsonl"
    copy.write_bytes(out.read_bytes())
    before = copy.read_text().splitlines()
    counts = profile(jobs, copy, timing=FAST, sharing_sizes=(4096, 65536), progress=False)
    assert counts == {"measured": 0, "skipped": len(jobs), "sharing": 0}
    assert copy.read_text().splitlines() == before
    # A run killed mid-write leaves a partial line: it is dropped, only the new job runs.
    with open(copy, "a") as f:
        f.write('{"type":"op","dev')
    extra = make_jobs([("conv_c", OpParams("conv2d", 6, 6, 3, 4, 1, 1, 0))], ("OC",), (1.0,))
    with pytest.warns(UserWarning, match="incomplete last line"):
        counts = profile(jobs + extra, copy, timing=FAST, sharing_sizes=(), progress=False)
    assert counts == {"measured": 1, "skipped": len(jobs), "sharing": 0}
    data = load_dataset(copy)
    assert len(data.op_records) == len(jobs) + 1
    assert data.op_records[-1].name == "conv_c"


def test_runs_per_sample_lasts_min_repeat_ms():
    t = TimingConfig(repeats=10, number=2, min_repeat_ms=2.0)
    assert runs_per_sample(0.01, t) == 200  # 200 runs of 0.01 ms last 2 ms
    assert runs_per_sample(0.3, t) == 7
    assert runs_per_sample(5.0, t) == 2  # never below --number
    assert runs_per_sample(0.0, t) == MAX_RUNS_PER_SAMPLE  # below the timer's resolution
    assert runs_per_sample(1e-9, t) == MAX_RUNS_PER_SAMPLE
    assert runs_per_sample(0.01, TimingConfig(number=3, min_repeat_ms=0)) == 3  # off
    for bad in (-1.0, float("inf"), float("nan"), "2", True):
        with pytest.raises(ValueError, match="min_repeat_ms must be a number >= 0"):
            TimingConfig(min_repeat_ms=bad)
    assert TimingConfig(min_repeat_ms=0).to_meta() == {
        "warmup": 1,
        "repeats": 10,
        "number": 1,
        "min_repeat_ms": 0.0,
    }


@pytest.mark.opencl
def test_timing_is_one_setting_per_dataset(opencl, tmp_path):
    """A dataset records its timing protocol; a resume with another one is refused (the file
    unchanged), and a dataset from before the protocol was recorded resumes only with the
    defaults of then. ``min_repeat_ms`` 0 times exactly ``number`` runs per sample."""
    fixed = TimingConfig(warmup=1, repeats=3, number=2, min_repeat_ms=0.0)
    jobs = make_jobs([("c", OpParams("conv2d", 6, 6, 3, 4, 3, 1, 1))], ("OC",), (0.5,))
    out = tmp_path / "fixed.jsonl"
    counts = profile(jobs, out, timing=fixed, sharing_sizes=(), progress=False)
    assert counts["measured"] == 2
    data = load_dataset(out)
    assert data.meta["timing"] == fixed.to_meta()
    for r in data.op_records:
        assert (r.repeats, r.number) == (3, 2)
        assert 0 < r.min_ms <= r.latency_ms <= r.max_ms
    before = out.read_bytes()
    with pytest.raises(ProfileError, match=r"--min-repeat-ms 0, this run has timing .*--min-re"):
        profile(jobs, out, timing=TimingConfig(), sharing_sizes=(), progress=False)
    assert out.read_bytes() == before
    again = profile(jobs, out, timing=fixed, sharing_sizes=(), progress=False)
    assert again == {"measured": 0, "skipped": 2, "sharing": 0}

    legacy = tmp_path / "legacy.jsonl"
    DatasetWriter(legacy, meta={"command": "codl-tvm profile"}).close()
    with pytest.raises(ProfileError, match=r"--repeats 5 --number 3 --min-repeat-ms 0"):
        profile([], legacy, timing=TimingConfig(), sharing_sizes=(), progress=False)
    old = TimingConfig(**LEGACY_TIMING)
    assert profile([], legacy, timing=old, sharing_sizes=(), progress=False)["measured"] == 0


@pytest.mark.opencl
def test_flush_weights_is_one_setting_per_dataset(opencl, tmp_path):
    """``--flush-weights`` times CPU parts one cold run per sample; the dataset records the
    setting and refuses a resume without it (the two ways of timing differ by up to 3x)."""
    from codl_tvm.cli import main

    common = ["profile", "--sample", "1", "--max-gflops", "0.01", "--dims", "H", "--ratios", "0.5"]
    common += ["--repeats", "2", "--number", "2", "--no-sharing"]
    cold = tmp_path / "cold.jsonl"
    assert main([*common, "--flush-weights", "-o", str(cold)]) == 0
    data = load_dataset(cold)
    assert data.meta["flush_weights"] is True
    cpu = [r for r in data.op_records if r.processor == "cpu"]
    gpu = [r for r in data.op_records if r.processor == "gpu"]
    assert cpu and gpu
    assert all(r.repeats == 4 for r in cpu)  # one run per sample: repeats x number samples
    assert all(r.repeats == 2 for r in gpu)  # OpenCL parts are timed as before
    assert all(np.isfinite(r.latency_ms) and r.latency_ms > 0 for r in data.op_records)
    before = cold.read_bytes()
    assert main([*common, "-o", str(cold)]) != 0  # resumed without the flag: refused
    assert cold.read_bytes() == before
    warm = tmp_path / "warm.jsonl"
    assert main([*common, "-o", str(warm)]) == 0
    assert "flush_weights" not in load_dataset(warm).meta


@pytest.mark.opencl
def test_tvm_cpus_pins_the_pool_and_rejects_bad_ranges(opencl, tmp_path, capsys):
    """``--tvm-cpus LO-HI`` pins TVM's pool as the SoC benchmarks do; bad ranges and RPC runs
    are refused with a message naming the value."""
    import os

    from codl_tvm.cli import main

    common = ["profile", "--sample", "1", "--max-gflops", "0.01", "--dims", "H", "--ratios", "1"]
    common += ["--repeats", "1", "--number", "1", "--no-sharing"]
    n = os.cpu_count()
    before = os.sched_getaffinity(0)
    try:
        assert main([*common, "--tvm-cpus", f"0-{n - 1}", "-o", str(tmp_path / "a.jsonl")]) == 0
        assert os.sched_getaffinity(0) == set(range(n))
    finally:
        os.sched_setaffinity(0, before)
    assert load_dataset(tmp_path / "a.jsonl").op_records
    for bad in ("3-1", f"0-{n}", "x", "0-1-2"):
        capsys.readouterr()
        assert main([*common, "--tvm-cpus", bad, "-o", str(tmp_path / "b.jsonl")]) != 0
        assert f"--tvm-cpus {bad!r}" in capsys.readouterr().err
    assert not (tmp_path / "b.jsonl").exists()
    rpc = ["--rpc", "127.0.0.1:1", "--tvm-cpus", "0-0", "-o", str(tmp_path / "c.jsonl")]
    assert main([*common, *rpc]) != 0
    assert "drop it with --rpc" in capsys.readouterr().err


@pytest.mark.opencl
def test_compile_dir_then_run_dir(opencl, tmp_path):
    jobs = make_jobs([("c", OpParams("conv2d", 6, 6, 3, 4, 3, 1, 1))], ("H",), (0.5,))
    manifest = compile_jobs(jobs, tmp_path / "build", progress=False)
    parts = json.loads(manifest.read_text())["parts"]
    assert len(parts) == 2 and all((tmp_path / "build" / p["library"]).exists() for p in parts)
    # Compiling again builds nothing new.
    compile_jobs(jobs, tmp_path / "build", progress=False)
    assert json.loads(manifest.read_text())["parts"] == parts
    out = tmp_path / "run.jsonl"
    counts = run_compiled(tmp_path / "build", out, timing=FAST, sharing_sizes=(), progress=False)
    assert counts == {"measured": 2, "failed": 0, "skipped": 0, "sharing": 0}
    recs = load_dataset(out).op_records
    assert sorted(r.processor for r in recs) == ["cpu", "gpu"]
    assert all(r.latency_ms > 0 and r.partition == Partition("H", 0.5) for r in recs)
    again = run_compiled(tmp_path / "build", out, timing=FAST, sharing_sizes=(), progress=False)
    assert again["measured"] == 0
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text('{"format": "other"}')
    with pytest.raises(ProfileError, match="manifest"):
        run_compiled(tmp_path / "bad", out, progress=False)


_RUN_DIR = """
import json, sys
from codl_tvm import runtime
from codl_tvm.profiling.profile import run_compiled
from codl_tvm.profiling.timing import TimingConfig
timing = TimingConfig(warmup=1, repeats=2, number=1)
counts = run_compiled(sys.argv[1], sys.argv[2], timing=timing, sharing_sizes=(), progress=False)
print(json.dumps({**counts, **runtime.cache_stats()}))
"""


@pytest.mark.opencl
@pytest.mark.parametrize("warm", ["2", "0"])
def test_run_dir_compiles_the_gpu_parts_in_parallel_first(opencl, tmp_path, warm):
    """With a warm-up (forced here: two cores), the measuring process finds every GPU part's
    program in the cache the warm-up processes filled and builds none from source; without,
    it builds each; the records are the same parts either way."""
    jobs = make_jobs(OPS, DIMS, (0.5,))
    compile_jobs(jobs, tmp_path / "build", progress=False)
    env = {
        **os.environ,
        "CODL_OPENCL_WARM_UP": warm,
        "CODL_TVM_CACHE_DIR": str(tmp_path / "cache"),
        "POCL_CACHE_DIR": str(tmp_path / "pocl"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_DIR, str(tmp_path / "build"), str(tmp_path / "run.jsonl")],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    gpu = [r for r in load_dataset(tmp_path / "run.jsonl").op_records if r.processor == "gpu"]
    assert stats["measured"] == len(jobs) and len(gpu) == len(OPS) * len(DIMS)
    if warm == "2":
        assert stats["source_builds"] == 0 and stats["disk_hits"] >= len(gpu)
    else:
        assert stats["source_builds"] >= len(gpu)


@pytest.mark.opencl
def test_fit_on_profiled_data(run, tmp_path):
    from codl_tvm.cli import cost_model as cost_model_cli
    from codl_tvm.cost_model import evaluate

    out, _, _ = run
    data = load_dataset(out)
    # 8 GPU records (fitted), 4 CPU ones (too few: FLOPs fallback, with a warning).
    with pytest.warns(UserWarning, match="FLOPs fallback"):
        codl = evaluate.fit_model("codl", data.records)
    gpu = [r for r in data.op_records if r.processor == "gpu"]
    assert len(gpu) == 8 and codl.covers(gpu[0].features())
    for model in (codl, evaluate.fit_model("flops", data.records)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CostModelFallbackWarning)
            preds = [model.predict(r.features()) for r in data.op_records]
        assert all(np.isfinite(x) and x > 0 for x in preds)
    parser = argparse.ArgumentParser()
    cost_model_cli.register(parser.add_subparsers())
    path = tmp_path / "model.json"
    args = parser.parse_args(
        ["cost-model", "fit", str(out), "-o", str(path), "--kind", "codl", "--holdout", "0.2"]
    )
    with pytest.warns(UserWarning, match="FLOPs fallback"):
        assert args.func(args) == 0
    assert json.loads(path.read_text())


@pytest.mark.parametrize(
    ("params", "partition"),
    [
        (OpParams("conv2d", 9, 9, 4, 6, 3, 2, 1), Partition("H", 0.3)),
        (OpParams("conv2d", 8, 8, 4, 4, 3, 1, 1, groups=4), Partition("OC", 0.5)),
        (OpParams("pool", 9, 9, 3, 3, 3, 2, 1), Partition("H", 0.6)),
        (OpParams("dense", 5, 1, 12, 10), Partition("OC", 0.3)),
    ],
)
def test_part_module_matches_unpartitioned(params, partition):
    """Each part module, fed its slice of the input, computes its slice of the full output."""
    from codl_tvm.build.runner import build

    full_mod = part_module(params, part_shape(params, Partition(), "cpu"))
    rng = np.random.default_rng(1)
    shapes = [tuple(int(v) for v in p.ty.shape.values) for p in full_mod["main"].params]
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    full = build(full_mod, "cpu")(inputs)[0]
    regions = passes_parts(params, partition)
    for proc in ("gpu", "cpu"):
        part = part_shape(params, partition, proc)
        check_part(params, partition, proc, part)
        a, b = regions[proc]["region"]
        c, d = regions[proc]["input_region"]
        if partition.dim == "H":
            args = [inputs[0][:, :, c:d], *inputs[1:]]
            want = full[:, :, a:b]
        elif params.op == "dense":
            args = [inputs[0], inputs[1][:, a:b]]
            want = full[:, a:b]
        else:
            args = [inputs[0][:, c:d], inputs[1][a:b]]
            want = full[:, a:b]
        got = build(part_module(params, part), "cpu")([np.ascontiguousarray(x) for x in args])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_model_ops_and_jobs():
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 3, 3, 3), "float32"), "w")
    g = numpy_helper.from_array(np.ones((8 * 4 * 4, 5), "float32"), "g")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
            helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("MatMul", ["f", "g"], ["y"]),
        ],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [w, g],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = dict(model_ops(model))
    assert ops["conv2d_0"] == OpParams("conv2d", 16, 16, 3, 8, 3, 2, 1)
    assert ops["max_pool2d_1"] == OpParams("pool", 8, 8, 8, 8, 2, 2, 0)
    assert ops["matmul_2"] == OpParams("dense", 1, 1, 128, 5)
    jobs = make_jobs(ops.items(), ("H", "OC"), (0.0, 0.5))
    # dense is split along OC only; ratio 0 has only a CPU part.
    assert not [j for j in jobs if j.params.op == "dense" and j.partition.dim == "H"]
    assert not [j for j in jobs if j.partition.ratio == 0.0 and j.processor == "gpu"]
    assert len(jobs) == 6 + 6 + 3  # conv, pool: 2 dims x 3 parts; dense: OC x 3 parts
    whole = make_jobs([("c", ops["conv2d_0"])], ("none",), (0.25, 0.5))
    assert [(j.partition, j.processor) for j in whole] == [
        (Partition("none", 1.0), "gpu"),
        (Partition("none", 0.0), "cpu"),
    ]
    for j in whole:
        check_part(j.params, j.partition, j.processor, part_shape(j.params, j.partition, "gpu"))
    with pytest.raises(FeatureError, match="partition dim 'W'"):
        make_jobs(ops.items(), ("W",), (0.5,))


def test_sampled_ops_are_seeded():
    a = sampled_ops(5, seed=3, max_gflops=0.5)
    assert a == sampled_ops(5, seed=3, max_gflops=0.5)
    assert a != sampled_ops(5, seed=4, max_gflops=0.5)
    assert all(p.op == "conv2d" and 1 <= p.h <= 640 for _, p in a)
    with pytest.raises(ValueError, match="sampling method 'x'"):
        sampled_ops(1, method="x")


@pytest.mark.opencl
def test_cli_profile(opencl, tmp_path, capsys):
    from onnx import TensorProto, helper, numpy_helper

    from codl_tvm.cli.profile import register as register_cli

    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [w],
    )
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(helper.make_model(graph).SerializeToString())
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers())
    out = tmp_path / "d.jsonl"
    argv = [
        "profile",
        "--model",
        str(onnx_path),
        "--ratios",
        "0.5",
        "--dims",
        "OC",
        "-o",
        str(out),
        "--repeats",
        "2",
        "--number",
        "1",
        "--min-repeat-ms",
        "0.5",
        "--sharing-sizes",
        "4096",
    ]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "measured 2 parts" in capsys.readouterr().out
    assert load_dataset(out).meta["timing"] == {
        "warmup": 1,
        "repeats": 2,
        "number": 1,
        "min_repeat_ms": 0.5,
    }
    recs = load_dataset(out).op_records
    assert {(r.name, r.processor, r.partition.dim) for r in recs} == {
        ("conv2d_0", "gpu", "OC"),
        ("conv2d_0", "cpu", "OC"),
    }
    # Compile here for a preset, run the directory "there" (here), same records.
    build = tmp_path / "build"
    argv2 = ["profile", "--model", str(onnx_path), "--ratios", "0.5", "--dims", "OC"]
    args = parser.parse_args(
        [*argv2, "--compile-dir", str(build), "--preset", "opencl", "--threads", "3"]
    )
    assert args.func(args) == 0
    out2 = tmp_path / "d2.jsonl"
    args = parser.parse_args(
        [
            "profile",
            "--run-dir",
            str(build),
            "-o",
            str(out2),
            "--repeats",
            "2",
            "--number",
            "1",
            "--no-sharing",
        ]
    )
    assert args.func(args) == 0
    recs2 = load_dataset(out2).op_records
    assert {(r.processor, r.part) for r in recs2} == {(r.processor, r.part) for r in recs}
    assert [r.dispatch.threads for r in recs2 if r.processor == "cpu"] == [3]
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--ratios", "1.5"])
    args = parser.parse_args(["profile", "-o", str(out)])
    with pytest.raises(Exception, match="nothing to profile"):
        args.func(args)
    args = parser.parse_args(["profile", "--sample", "1", "--min-repeat-ms", "-1", "-o", "x"])
    with pytest.raises(Exception, match="min_repeat_ms must be a number >= 0"):
        args.func(args)


_SERVER = """
import functools, sys
import tvm.rpc
from codl_tvm import runtime
s = tvm.rpc.Server("127.0.0.1", int(sys.argv[1]), int(sys.argv[1]) + 50, silent=True,
                   server_init_callback=functools.partial(runtime.load))
print(s.port, flush=True)
s.proc.join()
"""


@pytest.mark.rpc
@pytest.mark.opencl
def test_profile_through_rpc(opencl, tmp_path):
    """The same code path through a TVM RPC server (with the plugin) on 127.0.0.1."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    import tvm.rpc

    from codl_tvm.profiling.sessions import RPCSession

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        session = RPCSession(tvm.rpc.connect("127.0.0.1", port))
        jobs = make_jobs([("c", OpParams("conv2d", 6, 6, 3, 4, 3, 1, 1))], ("H",), (0.5,))
        out = tmp_path / "rpc.jsonl"
        counts = profile(jobs, out, session, timing=FAST, sharing_sizes=(4096,), progress=False)
        assert counts == {"measured": 2, "skipped": 0, "sharing": 5}
        data = load_dataset(out)
        assert all(r.device["remote"] is True and r.latency_ms > 0 for r in data.op_records)
        assert {r.kind for r in data.sharing_records} == set(SHARING_KINDS)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_bad_jobs_raise_clear_errors(tmp_path):
    from codl_tvm.profiling.part_build import compile_part

    p = OpParams("conv2d", 6, 6, 3, 4, 3, 1, 1)
    with pytest.raises(ProfileError, match=r"conv2d\(H=6.*processor 'npu'"):
        compile_part(p, Partition("H", 0.5), "npu", tmp_path)
    with pytest.raises(ProfileError, match=r"conv2d\(H=6.*cpu part of partition H:1 is empty"):
        compile_part(p, Partition("H", 1.0), "cpu", tmp_path)
    with pytest.raises(ProfileError, match=r"no manifest\.json"):
        run_compiled(tmp_path, tmp_path / "d.jsonl", progress=False)
