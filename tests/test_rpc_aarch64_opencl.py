"""Co-execution on the emulated aarch64 OpenCL device through a real TVM RPC tracker.

``scripts/emulated_aarch64.py serve --opencl`` runs TVM's RPC server for aarch64 under qemu in a
chroot with Debian's arm64 PoCL (fine-grained SVM) and codl-tvm's cross-built plugin. The tests
deploy a co-executed model (an H split, an OC split and one chain) and compare it with
onnxruntime; a server without the plugin gets one uploaded; plugins that do not fit are refused
before anything is uploaded. They need root, apt and a network for the first preparation (then
cached in ``~/.cache``) and are skipped where the device cannot be prepared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.core.errors import DeployError, RemoteFailure, VersionMismatch
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.objectives import deploy
from codl_tvm.objectives.deploy import DeployOptions
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.runtime import plugin_build as _build
from tests.rpc_support import free_port, logged_lines, tracker_command

pytestmark = [pytest.mark.rpc, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "emulated_aarch64.py"


def _chain_model():
    """Four 4-channel convs with Relu on a 1x3x8x8 input (tiny: kernels compile under qemu)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = [], [], "x", 3
    for i, k in enumerate((3, 3, 3, 1)):
        w = (rng.standard_normal((4, cin, k, k)) * 0.3).astype("float32")
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype("float32"), f"b{i}"),
        ]
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[k // 2] * 4),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
        ]
        prev, cin = f"r{i}", 4
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model


PLAN = PartitionPlan(
    ops=(OpPartition("conv2d_0", "H", 0.5), OpPartition("conv2d_1", "OC", 0.5)),
    chains=(ChainPlan(("conv2d_2", "conv2d_3"), "H", 0.5),),
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("model") / "chain.onnx"
    onnx.save(_chain_model(), str(path))
    return path, load_onnx(path)


@pytest.fixture(scope="module")
def device():
    """The prepared root (PoCL + cross-built plugin), or skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("the emulated OpenCL device needs root (chroot, binfmt_misc)")
    prep = subprocess.run(
        [sys.executable, str(SCRIPT), "prepare", "--opencl", "--timeout", "900"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if prep.returncode != 0:
        pytest.skip(
            "the emulated aarch64 OpenCL device cannot be prepared here: "
            + (prep.stderr.strip().splitlines() or ["unknown error"])[-1]
        )
    # the cross-built plugin (the script prints its path, then the emulated Python's)
    return next(Path(ln) for ln in prep.stdout.splitlines() if ln.endswith(_build.PLUGIN_NAME))


@pytest.fixture(scope="module")
def tracker():
    port = free_port()
    proc = subprocess.Popen(
        tracker_command(port),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    addr = f"127.0.0.1:{port}"
    try:
        rpc_utils.wait_for_devices(addr, "none", 0, timeout_s=60)
        yield addr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


class _Servers:
    def __init__(self, tracker: str) -> None:
        self.tracker, self.ports = tracker, []

    def start(self, key: str, *extra: str) -> str:
        port = free_port()
        self.ports.append(port)
        self.last_port = port
        cmd = [sys.executable, str(SCRIPT), "serve", "--opencl", "--tracker", self.tracker,
               "--key", key, "--port", str(port), "--timeout", "300", *extra]  # fmt: skip
        start = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert start.returncode == 0, start.stderr
        return key

    def stop(self) -> None:
        for port in self.ports:
            subprocess.run(
                [sys.executable, str(SCRIPT), "stop", "--port", str(port)],
                capture_output=True,
                timeout=60,
            )


@pytest.fixture(scope="module")
def servers(device, tracker):
    s = _Servers(tracker)
    yield s
    s.stop()


def _onnxruntime(path: Path, inputs: dict) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, inputs)


def _deploy(tracker: str, key: str, model, inputs, lines: list[str], **kw):
    """Deploy ``model`` co-executed to ``key``; what the library logs goes to ``lines``."""
    options = DeployOptions(
        tracker,
        key,
        **{
            "target": "linux-arm64-pocl",
            "device": "coexec",
            "plan": PLAN,
            "number": 1,
            "repeat": 1,
            "request_timeout_s": 120,
            **kw,
        },
    )
    with logged_lines() as logged:
        try:
            return deploy.deploy(model[1], options, inputs)
        finally:
            lines.extend(logged)


def _assert_matches_onnxruntime(result, model, inputs) -> None:
    ref = _onnxruntime(model[0], inputs)[0]
    err = float(np.max(np.abs(result.outputs[0] - ref)))
    assert err <= 1e-4 * float(np.max(np.abs(ref))), err


def test_coexec_on_emulated_aarch64_opencl_matches_onnxruntime(tracker, servers, model):
    key = servers.start("emu-cl")
    inputs = random_inputs(model[1], seed=1)
    lines: list[str] = []
    result = _deploy(tracker, key, model, inputs, lines)
    info = result.remote_versions
    assert info["machine"] == "aarch64" and info["opencl"] == "1" and info["svm"] == "fine"
    assert info["plugin_machine"] == "aarch64" and "emulated" in info
    assert result.preset == "linux-arm64-pocl"
    assert not any("uploading libcodl" in ln for ln in lines)
    _assert_matches_onnxruntime(result, model, inputs)


def test_coarse_grained_svm_on_emulated_device(tracker, servers, model):
    """Devices without fine-grained SVM (NVIDIA, many mobile drivers) map and unmap around each
    switch; PoCL offers both, so the coarse path is forced here."""
    key = servers.start("emu-coarse", "--env", "CODL_OPENCL_SVM=coarse")
    inputs = random_inputs(model[1], seed=5)
    result = _deploy(tracker, key, model, inputs, [])
    assert result.remote_versions["svm"] == "coarse"
    _assert_matches_onnxruntime(result, model, inputs)


def test_device_without_svm_coexecutes_on_host_mapped_buffers(tracker, servers, model):
    """Devices without SVM (OpenCL 1.2 drivers) fall back to host-mapped buffers; deploy says
    so and the co-executed model still matches."""
    key = servers.start("emu-buffer", "--env", "CODL_OPENCL_SVM=buffer")
    inputs = random_inputs(model[1], seed=6)
    lines: list[str] = []
    result = _deploy(tracker, key, model, inputs, lines)
    assert result.remote_versions["svm"] == "buffer"
    assert any("buffer (host-mapped, no SVM)" in ln for ln in lines), lines
    _assert_matches_onnxruntime(result, model, inputs)


def test_server_without_opencl_platform_is_one_clear_error(tracker, servers, model, tmp_path):
    key = servers.start("emu-noplatform", "--env", "OCL_ICD_VENDORS=/nonexistent")
    work = tmp_path / "work"
    with pytest.raises(DeployError, match=rf"{key}@127\.0\.0\.1:\d+ has no usable OpenCL"):
        _deploy(tracker, key, model, random_inputs(model[1], seed=6), [], work_dir=work)
    assert not work.exists()


def test_server_without_plugin_gets_it_uploaded_after_checks(tracker, servers, model, tmp_path):
    key = servers.start("emu-noplugin", "--no-plugin")
    inputs = random_inputs(model[1], seed=2)
    # the host's own plugin is for this machine: refused before anything is uploaded
    wrong = Path(_build.build_plugin())
    with pytest.raises(VersionMismatch, match="built for x86_64, the device is aarch64"):
        _deploy(tracker, key, model, inputs, [], plugin=wrong)
    remote = rpc_utils.request_remote(tracker, key, timeout_s=120)
    try:
        assert rpc_utils.remote_versions(remote, 120)["plugin_state"] == "missing"
    finally:
        remote.close()
    rpc_utils.wait_for_devices(tracker, key, 1, timeout_s=60)
    lines: list[str] = []
    result = _deploy(tracker, key, model, inputs, lines)
    assert any("has no OpenCL plugin: uploading" in ln for ln in lines), lines
    assert result.remote_versions["plugin_state"] == "loaded"
    _assert_matches_onnxruntime(result, model, inputs)
    # the next session loads the uploaded plugin itself
    rpc_utils.wait_for_devices(tracker, key, 1, timeout_s=60)
    lines = []
    result = _deploy(tracker, key, model, inputs, lines)
    assert not any("uploading libcodl" in ln for ln in lines), lines
    _assert_matches_onnxruntime(result, model, inputs)


def test_server_given_a_plugin_for_another_machine_reports_why(tracker, servers, model):
    """The server loads this machine's (x86-64) plugin, which fails; deploy names both."""
    key = servers.start("emu-wrongarch", "--plugin-lib", _build.build_plugin())
    with pytest.raises(DeployError, match=rf"{key}@.* has no usable OpenCL runtime: loading the"):
        _deploy(tracker, key, model, random_inputs(model[1], seed=8), [])


def test_plugin_built_on_the_device_on_first_use(tracker, servers, model):
    """A board with a compiler builds the plugin itself (the server's start-up, under qemu)."""
    key = servers.start("emu-native", "--no-plugin", "--env", "CXX=g++-12")
    inputs = random_inputs(model[1], seed=7)
    lines: list[str] = []
    result = _deploy(tracker, key, model, inputs, lines)
    assert not any("uploading libcodl" in ln for ln in lines), lines
    info = result.remote_versions
    assert info["plugin_state"] == "loaded" and info["plugin_machine"] == "aarch64"
    assert info["plugin_sources_sha256"] == _build.sources_sha256()
    _assert_matches_onnxruntime(result, model, inputs)


def test_server_with_mismatched_plugin_is_refused_before_upload(
    tracker, servers, model, device, tmp_path
):
    # the aarch64 plugin described as built against other TVM headers
    other = tmp_path / _build.PLUGIN_NAME
    shutil.copyfile(device, other)
    desc = json.loads(Path(f"{device}.json").read_text())
    Path(f"{other}.json").write_text(json.dumps({**desc, "tvm": "0.26.0"}))
    key = servers.start("emu-mismatch", "--plugin-lib", str(other))
    work = tmp_path / "work"
    with pytest.raises(VersionMismatch, match=r"built for tvm 0\.26\.0"):
        _deploy(tracker, key, model, random_inputs(model[1], seed=3), [], work_dir=work)
    assert not work.exists()  # refused before compiling, let alone uploading


def test_compile_verify_on_emulated_device(tracker, servers, model, tmp_path, capsys):
    from codl_tvm.cli import main

    key = servers.start("emu-verify")
    plan = tmp_path / "plan.json"
    PLAN.save(plan)
    out = tmp_path / "art"
    rc = main(
        ["compile", str(model[0]), "--preset", "linux-arm64-pocl", "--device", "coexec",
         "--plan", str(plan), "--verify", "1", "--tracker", tracker, "--key", key, "-o", str(out)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    assert f"measured on {key}@127.0.0.1" in text and "[EMULATED" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["verify"]["median_ms"]) >= {"cpu", "opencl"}


def test_profile_farm_fit_and_plan_auto(tracker, servers, model, tmp_path, capsys):
    from codl_tvm.cli import main

    key = servers.start("emu-farm")
    data, fitted = tmp_path / "farm.jsonl", tmp_path / "cm.json"
    rc = main(
        ["profile", "--model", str(model[0]), "--ratios", "0.5", "--dims", "H,OC", "--preset",
         "linux-arm64-pocl", "--rpc", tracker, "--rpc-key", key, "--farm", "-o", str(data),
         "--repeats", "1", "--number", "1", "--warmup", "0", "--retries", "0"]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr()
    records = [json.loads(ln) for ln in data.read_text().splitlines() if ln.strip()]
    ops = [r for r in records if r.get("type") == "op"]
    assert {(r["processor"], r["partition"]["dim"]) for r in ops} == {
        (p, d) for p in ("cpu", "gpu") for d in ("H", "OC")
    }
    assert all(r["latency_ms"] > 0 for r in ops)
    device = next(r for r in records if r.get("type") == "device")["desc"]
    assert '"mtriple":"aarch64-linux-gnu"' in device["cpu_target"].replace(" ", "")
    assert main(["cost-model", "fit", str(data), "-o", str(fitted)]) == 0
    rpc_utils.wait_for_devices(tracker, key, 1, timeout_s=60)
    inputs = random_inputs(model[1], seed=4)
    result = deploy.deploy(
        model[1],
        DeployOptions(
            tracker,
            key,
            device="coexec",
            plan="auto",
            cost_model=fitted,
            number=1,
            repeat=1,
            request_timeout_s=120,
        ),
        inputs,
    )
    assert result.preset == "linux-arm64-pocl"  # chosen from the remote's report
    _assert_matches_onnxruntime(result, model, inputs)


def test_remote_dying_mid_run_is_one_error_naming_it(tracker, servers, model, tmp_path):
    key = servers.start("emu-dies")
    # where scripts/emulated_aarch64.py keeps it (its default_root)
    cache = Path(os.environ.get("CODL_TVM_CACHE_DIR", Path.home() / ".cache" / "codl-tvm"))
    home = Path(os.environ.get("CODL_TVM_AARCH64_ROOT") or cache / "aarch64-emu").expanduser()
    pid_file = home / f"server-{servers.last_port}.pid"
    pid = int(pid_file.read_text())

    def _kill(line: str) -> None:
        if line.startswith("uploading model"):  # the server dies while loading or running it
            threading.Timer(0.5, os.killpg, (pid, signal.SIGKILL)).start()

    # a plan of its own: its kernels are compiled on the device, which takes a while under qemu
    plan = PartitionPlan(ops=(OpPartition("conv2d_0", "OC", 0.37),))
    with pytest.raises(RemoteFailure, match=rf"remote device {key}@127\.0\.0\.1:\d+ failed"):
        options = DeployOptions(
            tracker, key, target="linux-arm64-pocl", device="coexec", plan=plan, number=1,
            repeat=1, request_timeout_s=120, work_dir=tmp_path / "w",
        )  # fmt: skip
        with logged_lines(_kill):
            deploy.deploy(model[1], options)
    assert (tmp_path / "w").is_dir()  # the host's files are kept
