"""Deployment through a real TVM RPC tracker and servers on 127.0.0.1.

The fixtures start ``python -m tvm.exec.rpc_tracker`` and codl-tvm's RPC server
(``python -m codl_tvm.cli serve``, that is ``codl-tvm serve``: TVM's server plus a version
report) as separate processes on free ports; every test compares remote outputs with the host
build and onnxruntime.
The emulated aarch64 test (``slow``) prepares or reuses the qemu-user device of
``scripts/emulated_aarch64.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives import deploy
from codl_tvm.objectives.deploy import DeployOptions
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.rpc.farm import DeviceFarm
from tests.rpc_support import Processes, free_port, start_tracker

pytestmark = pytest.mark.rpc

REPO = Path(__file__).resolve().parent.parent


def _small_cnn(seed: int = 0):
    """Conv(3->8, 3x3, pad 1) + Relu + MaxPool(2) + Gemm(512->10) on a 1x3x16x16 input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype("float32"), "w"),
        numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype("float32"), "b"),
        numpy_helper.from_array((rng.standard_normal((10, 512)) * 0.05).astype("float32"), "fw"),
        numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype("float32"), "fb"),
        numpy_helper.from_array(np.array([1, -1], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _onnxruntime(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)


@pytest.fixture(scope="module")
def procs():
    p = Processes()
    yield p
    p.close()


@pytest.fixture(scope="module")
def tracker(procs) -> str:
    return start_tracker(procs)


def _start_server(procs: Processes, tracker: str, key: str, extra=()) -> subprocess.Popen:
    before = _free(tracker, key)
    port = free_port()
    proc = procs.start(
        [
            sys.executable,
            "-m",
            "codl_tvm.cli",
            "serve",
            "--tracker",
            tracker,
            "--key",
            key,
            "--port",
            str(port),
            "--port-end",
            str(port + 1),
            "--silent",
            *extra,
        ]
    )
    rpc_utils.wait_for_devices(tracker, key, before + 1, timeout_s=60)
    return proc


def _free(tracker: str, key: str) -> int:
    q = rpc_utils.tracker_summary(tracker)["queue_info"].get(key, {})
    return int(q.get("free", 0))


@pytest.fixture(scope="module")
def cpu_server(procs, tracker) -> str:
    _start_server(procs, tracker, "x86")
    return "x86"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("model") / "small_cnn.onnx"
    onnx.save(_small_cnn(), str(path))
    model = load_onnx(path)
    return path, model


@pytest.fixture(scope="module")
def cnn_library(cnn, tmp_path_factory) -> Path:
    return deploy.compile_for(cnn[1].mod, "host", "cpu", tmp_path_factory.mktemp("lib"))


def test_deploy_cpu_matches_host_and_onnxruntime(tracker, cpu_server, cnn):
    path, model = cnn
    inputs = random_inputs(model, seed=3)
    result = deploy.deploy(
        model, DeployOptions(tracker, cpu_server, target="host", number=1, repeat=2), inputs
    )
    assert result.device.startswith("x86@127.0.0.1:")
    assert result.preset == "host"
    assert result.matches and result.max_abs_error < 1e-5
    np.testing.assert_allclose(
        result.outputs[0], _onnxruntime(path, inputs)[0], rtol=1e-4, atol=1e-5
    )
    assert result.run.repeats == 2 and result.run.median_ms > 0
    import tvm

    assert result.remote_versions["tvm"] == tvm.__version__
    # The library's temporary directory goes with the result (nothing is left in /tmp).
    import gc

    work = result.library.parent
    assert result.library.is_file()
    del result
    gc.collect()
    assert not work.exists()


def test_cli_deploy_with_npz(tracker, cpu_server, cnn, tmp_path, capsys):
    from codl_tvm.cli import main

    path, _ = cnn
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    rc = main(
        [
            "deploy",
            str(path),
            "--tracker",
            tracker,
            "--key",
            cpu_server,
            "--inputs",
            str(tmp_path / "in.npz"),
            "--save-outputs",
            str(tmp_path / "out.npz"),
            "--repeat",
            "1",
            "--number",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "remote latency on x86@127.0.0.1" in out and "matches" in out
    with np.load(tmp_path / "out.npz") as saved:
        assert saved.files == ["y"]
        np.testing.assert_allclose(
            saved["y"], _onnxruntime(path, {"x": x})[0], rtol=1e-4, atol=1e-5
        )


def test_cli_rejects_bad_input(tracker, cpu_server, cnn, tmp_path, capsys):
    from codl_tvm.cli import main

    path, _ = cnn
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 8, 8), "float32"))
    base = ["deploy", str(path), "--tracker", tracker, "--key", cpu_server]
    assert main([*base, "--inputs", str(tmp_path / "bad.npz")]) == 2
    assert (
        "input 'x' has shape (1, 3, 8, 8), the model expects (1, 3, 16, 16)"
        in capsys.readouterr().err
    )
    assert main([*base, "--target", "pixel9"]) == 2
    assert "unknown target preset 'pixel9'" in capsys.readouterr().err
    assert main([*base, "--target", "android-arm64"]) == 2
    assert "builds for aarch64 but remote device x86@" in capsys.readouterr().err
    assert main([*base, "--device", "opencl", "--target", "pocl"]) == 2
    assert "has no usable OpenCL runtime" in capsys.readouterr().err
    assert main([*base, "--device", "coexec"]) == 2
    assert "--device coexec needs a partition plan" in capsys.readouterr().err
    assert main([*base, "--device", "coexec", "--dim", "OC", "--ratio", "0.5"]) == 2
    assert "has no usable OpenCL runtime" in capsys.readouterr().err
    assert main(["deploy", str(path), "--tracker", "localhost", "--key", "k"]) == 2
    assert "tracker address 'localhost' is not HOST:PORT" in capsys.readouterr().err


def test_unreachable_tracker_fails_fast(cnn):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(rpc_utils.TrackerUnreachable, match=f"127.0.0.1:{port} within 1 s"):
        rpc_utils.request_remote(f"127.0.0.1:{port}", "x86", timeout_s=1)
    with pytest.raises(rpc_utils.TrackerUnreachable):
        deploy.deploy(cnn[1], DeployOptions(f"127.0.0.1:{port}", "x86", request_timeout_s=1))
    assert time.monotonic() - t0 < 15


def test_no_free_device(tracker, cpu_server):
    t0 = time.monotonic()
    with pytest.raises(
        rpc_utils.NoFreeDevice,
        match=r"no device registered under key 'pixel'.*keys registered there: .*x86",
    ):
        rpc_utils.request_remote(tracker, "pixel", timeout_s=1)
    rpc_utils.wait_for_devices(tracker, cpu_server, 1, timeout_s=30)
    held = rpc_utils.request_remote(tracker, cpu_server, timeout_s=5)
    try:
        with pytest.raises(rpc_utils.NoFreeDevice, match="1 registered, 0 free"):
            rpc_utils.request_remote(tracker, cpu_server, timeout_s=1.5)
    finally:
        held.close()
    assert time.monotonic() - t0 < 30
    # the abandoned request must not swallow the device: it is handed out again
    rpc_utils.wait_for_devices(tracker, cpu_server, 1, timeout_s=30)
    again = rpc_utils.request_remote(tracker, cpu_server, timeout_s=10)
    assert again.name.startswith("x86@")
    again.close()


def test_version_check(procs, tracker, cpu_server):
    import tvm

    rpc_utils.wait_for_devices(tracker, cpu_server, 1, timeout_s=30)
    remote = rpc_utils.request_remote(tracker, cpu_server, timeout_s=10)
    try:
        info = rpc_utils.check_remote_versions(remote)
    finally:
        remote.close()
    assert info["tvm"] == tvm.__version__ and info["machine"]
    assert rpc_utils.version_mismatches(info, rpc_utils.local_versions()) == []
    older = {**info, "tvm": "0.26.0"}
    assert rpc_utils.version_mismatches(older, rpc_utils.local_versions()) == [
        f"tvm 0.26.0 there, {tvm.__version__} here"
    ]
    # a stock TVM server cannot report: unknown, and an error when strict
    port = free_port()
    procs.start(
        [
            sys.executable,
            "-m",
            "tvm.exec.rpc_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--port-end",
            str(port + 1),
            "--tracker",
            tracker,
            "--key",
            "stock",
            "--silent",
        ]
    )
    rpc_utils.wait_for_devices(tracker, "stock", 1, timeout_s=60)
    stock = rpc_utils.request_remote(tracker, "stock", timeout_s=10)
    try:
        assert rpc_utils.remote_versions(stock) is None
        with pytest.raises(rpc_utils.VersionMismatch, match="does not report its TVM version"):
            rpc_utils.check_remote_versions(stock, strict=True)
    finally:
        stock.close()


def test_remote_dies_mid_run(procs, tracker, cnn, cnn_library):
    server = _start_server(procs, tracker, "doomed")
    remote = rpc_utils.request_remote(tracker, "doomed", timeout_s=10)
    inputs = [random_inputs(cnn[1], 0)["x"]]
    killer = threading.Timer(3.0, Processes.kill, args=(server,))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(rpc_utils.RemoteFailure, match=f"remote device {remote.name} failed"):
            # millions of runs: still busy when the server is killed
            deploy.run_remote(remote, cnn_library, inputs, number=10_000_000, repeat=1)
    finally:
        killer.join()
    assert time.monotonic() - t0 < 60
    assert server.poll() is not None


def test_farm_spreads_jobs_with_retry_and_timeout(procs, tracker, cnn, cnn_library):
    from codl_tvm.build.runner import build

    _start_server(procs, tracker, "farm")
    _start_server(procs, tracker, "farm")
    model = cnn[1]
    inputs = [random_inputs(model, seed)["x"] for seed in range(4)]
    host = build(model.mod, "cpu")
    expected = [host([x])[0] for x in inputs]

    def job(x):
        return lambda remote: deploy.run_remote(remote, cnn_library, [x], repeat=0).outputs[0]

    calls = {"n": 0}

    def flaky(remote):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("first attempt fails")
        return job(inputs[0])(remote)

    def stuck(remote):
        time.sleep(4)
        return None

    with DeviceFarm(tracker, "farm", request_timeout_s=10) as farm:
        assert len(farm.devices) == 2
        assert len({d.name for d in farm.devices}) == 2
        results = farm.run([job(x) for x in inputs] + [flaky], job_timeout_s=30, retries=1)
        assert all(r.ok for r in results), [r.error for r in results]
        for r, want in zip(results, [*expected, expected[0]]):
            np.testing.assert_allclose(r.value, want, rtol=1e-5, atol=1e-6)
        assert results[-1].attempts == 2
        assert {r.device for r in results} <= {d.name for d in farm.devices}
        timed = farm.run([stuck], job_timeout_s=1, retries=0)
    assert not timed[0].ok and "timed out after 1 s" in timed[0].error


@pytest.mark.opencl
def test_deploy_opencl_through_server_with_plugin(procs, tracker, cnn, opencl):
    """A server started with ``--opencl`` loads the plugin; the model runs on its OpenCL device."""
    _start_server(procs, tracker, "ocl", extra=["--opencl"])
    path, model = cnn
    for seed in (1, 2):  # two sessions: the server keeps serving OpenCL after the first
        inputs = random_inputs(model, seed=seed)
        result = deploy.deploy(
            model,
            DeployOptions(
                tracker,
                "ocl",
                target="pocl",
                device="opencl",
                number=1,
                repeat=1,
                request_timeout_s=30,
            ),
            inputs,
        )
        assert result.remote_versions["opencl"] == "1"
        assert result.matches, result.max_abs_error
        np.testing.assert_allclose(
            result.outputs[0], _onnxruntime(path, inputs)[0], rtol=1e-4, atol=1e-5
        )
        rpc_utils.wait_for_devices(tracker, "ocl", 1, timeout_s=30)


@pytest.mark.slow
def test_emulated_aarch64_deploy(procs, tracker, cnn):
    script = REPO / "scripts" / "emulated_aarch64.py"
    prep = subprocess.run(
        [sys.executable, str(script), "prepare", "--timeout", "600"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if prep.returncode != 0:
        pytest.skip(
            "the emulated aarch64 device cannot be prepared here: "
            + (prep.stderr.strip().splitlines() or ["unknown error"])[-1]
        )
    port = free_port()
    start = subprocess.run(
        [
            sys.executable,
            str(script),
            "serve",
            "--tracker",
            tracker,
            "--key",
            "aarch64-emu",
            "--port",
            str(port),
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert start.returncode == 0, start.stderr
    try:
        path, model = cnn
        inputs = random_inputs(model, seed=5)
        ref = _onnxruntime(path, inputs)[0]
        for target in (None, "android-arm64"):  # None: chosen from the remote's report
            result = deploy.deploy(
                model,
                DeployOptions(
                    tracker, "aarch64-emu", target=target, number=1, repeat=1, request_timeout_s=60
                ),
                inputs,
            )
            assert result.preset == (target or "linux-arm64")
            assert result.remote_versions["machine"] == "aarch64"
            assert result.matches, result.max_abs_error
            np.testing.assert_allclose(result.outputs[0], ref, rtol=1e-4, atol=1e-4)
            rpc_utils.wait_for_devices(tracker, "aarch64-emu", 1, timeout_s=60)
    finally:
        subprocess.run(
            [sys.executable, str(script), "stop", "--port", str(port)],
            capture_output=True,
            timeout=60,
        )


OTHER_TVM = "0.26.0"


@pytest.mark.slow
def test_emulated_device_with_other_tvm_is_refused_before_upload(procs, tracker, cnn):
    """A real aarch64 device running apache-tvm 0.26 (PyPI wheel): refused before any upload."""
    script = REPO / "scripts" / "emulated_aarch64.py"
    cache = Path(os.environ.get("CODL_TVM_CACHE_DIR", Path.home() / ".cache" / "codl-tvm"))
    home = cache.expanduser() / f"aarch64-emu-tvm{OTHER_TVM}"
    common = ["--root", str(home), "--tvm-version", OTHER_TVM]
    prep = subprocess.run(
        [sys.executable, str(script), "prepare", *common, "--timeout", "600"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if prep.returncode != 0:
        pytest.skip(
            f"an emulated aarch64 device with TVM {OTHER_TVM} cannot be prepared here: "
            + (prep.stderr.strip().splitlines() or ["unknown error"])[-1]
        )
    port = free_port()
    start = subprocess.run(
        [
            sys.executable,
            str(script),
            "serve",
            *common,
            "--tracker",
            tracker,
            "--key",
            "aarch64-old",
            "--port",
            str(port),
            "--timeout",
            "300",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert start.returncode == 0, start.stderr
    work = Path(str(cnn[0])).parent / "old-tvm"
    try:
        with pytest.raises(rpc_utils.VersionMismatch, match=f"tvm {OTHER_TVM} there"):
            deploy.deploy(
                cnn[1], DeployOptions(tracker, "aarch64-old", request_timeout_s=60, work_dir=work)
            )
        assert not work.exists()  # refused before compiling, let alone uploading
    finally:
        subprocess.run(
            [sys.executable, str(script), "stop", "--root", str(home), "--port", str(port)],
            capture_output=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
def opencl_server(procs, tracker, opencl) -> str:
    """A server that loaded codl-tvm's OpenCL plugin (``serve --opencl``)."""
    _start_server(procs, tracker, "coexec", extra=["--opencl"])
    return "coexec"


@pytest.mark.opencl
@pytest.mark.parametrize("dim", ["OC", "H"])
def test_deploy_coexec_matches_unpartitioned_host(tracker, opencl_server, cnn, dim):
    """A co-executed build runs over the remote's OpenCL device and CPU; its outputs equal the
    host's unpartitioned CPU build and onnxruntime."""
    from codl_tvm.build.runner import build

    path, model = cnn
    inputs = random_inputs(model, seed=3)
    result = deploy.deploy(
        model,
        DeployOptions(
            tracker,
            opencl_server,
            target="pocl",
            device="coexec",
            dim=dim,
            ratio=0.5,
            number=1,
            repeat=1,
            request_timeout_s=30,
        ),
        inputs,
    )
    assert result.remote_versions["opencl"] == "1"
    assert result.library.name == "model_pocl_coexec.so"
    host = build(model.mod, "cpu")([inputs["x"]])
    np.testing.assert_allclose(result.outputs[0], host[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        result.outputs[0], _onnxruntime(path, inputs)[0], rtol=1e-4, atol=1e-5
    )
    assert result.matches, result.max_abs_error
    assert result.run.median_ms is not None and result.run.median_ms > 0
    rpc_utils.wait_for_devices(tracker, opencl_server, 1, timeout_s=30)


@pytest.mark.opencl
def test_cli_deploy_coexec_with_plan_file(tracker, opencl_server, cnn, tmp_path, capsys):
    """``codl-tvm deploy --device coexec --plan PLAN.json`` (a plan with a GPU-only and a
    split operator) matches the host; a plan naming an unknown operator fails before upload."""
    from codl_tvm.build.runner import build
    from codl_tvm.cli import main
    from codl_tvm.core.plan import PartitionPlan, uniform_plan

    path, model = cnn
    plan = uniform_plan(model.mod, "OC", 0.25)
    plan_path = tmp_path / "plan.json"
    plan.save(plan_path)
    inputs = random_inputs(model, seed=4)
    np.savez(tmp_path / "in.npz", **inputs)
    out = tmp_path / "out.npz"
    argv = ["deploy", str(path), "--tracker", tracker, "--key", opencl_server, "--target"]
    argv += ["pocl", "--device", "coexec", "--plan", str(plan_path), "--inputs"]
    argv += [str(tmp_path / "in.npz"), "--save-outputs", str(out), "--repeat", "1"]
    argv += ["--timeout", "30"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "remote latency on coexec@127.0.0.1" in text and "matches" in text
    host = build(model.mod, "cpu")([inputs["x"]])
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["y"], host[0], rtol=1e-4, atol=1e-5)

    assert PartitionPlan.load(plan_path) == plan
    bad = plan.to_dict()
    bad["ops"][0]["op"] = "no_such_op"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    argv2 = ["deploy", str(path), "--tracker", tracker, "--key", opencl_server]
    argv2 += ["--device", "coexec", "--plan", str(tmp_path / "bad.json")]
    assert main(argv2) == 2
    assert "no_such_op" in capsys.readouterr().err


def test_coexec_needs_a_plan_and_plan_needs_coexec(cnn):
    """Missing or misplaced plan arguments fail before any network use."""
    _, model = cnn
    with pytest.raises(deploy.DeployError, match="needs a partition plan"):
        deploy.deploy(model, DeployOptions("127.0.0.1:1", "k", device="coexec"))
    with pytest.raises(deploy.DeployError, match="apply to `device` coexec only"):
        deploy.deploy(model, DeployOptions("127.0.0.1:1", "k", device="cpu", dim="OC", ratio=0.5))


@pytest.mark.opencl
def test_compile_verify_through_rpc(tracker, opencl_server, tmp_path, capsys):
    """``codl-tvm compile --verify 2 --tracker H:P --key K`` times the co-executed build and
    each processor alone on the remote device (the way to verify for a phone), with the
    calibrated re-plan where one is made, and keeps the fastest; the kept artifact's outputs
    match the reference."""
    from codl_tvm.artifact import ArtifactError, compile_artifact, load_artifact
    from codl_tvm.cli import bundled_model_path, main

    out = tmp_path / "art"
    args = ["compile", str(bundled_model_path()), "--preset", "pocl", "-o", str(out)]
    assert main([*args, "--verify", "2", "--tracker", tracker, "--key", opencl_server]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    v = manifest["verify"]
    assert f"RPC {tracker}, key {opencl_server}" in v["on"]
    # a calibrated re-plan, when the calibration makes one, is timed on the remote device too
    calibrated = manifest["plan"]["calibration"]["candidates"]
    assert set(v["median_ms"]) == {"coexec", "cpu", "opencl"} | {
        f"coexec:{m}:calibrated" for m in calibrated
    }
    assert all(x > 0 for x in v["median_ms"].values())
    assert v["chosen"] == min(v["median_ms"], key=v["median_ms"].get)
    assert manifest["device"] == v["chosen"].split(":")[0]
    art = load_artifact(out)
    inputs, want = art.reference()
    got = art([inputs[s.name] for s in art.model.inputs])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    rpc_utils.wait_for_devices(tracker, opencl_server, 1, timeout_s=30)
    # A tracker with nothing to time there, or half of tracker/key, is refused before any build.
    for bad, why in (
        (dict(verify=0, measure=False, tracker=tracker, key=opencl_server), "tracker needs"),
        (dict(verify=2, tracker=tracker), "tracker and key go together"),
    ):
        with pytest.raises(ArtifactError, match=why):
            compile_artifact(bundled_model_path(), tmp_path / "bad", log=lambda s: None, **bad)
    assert not (tmp_path / "bad" / "manifest.json").exists()
