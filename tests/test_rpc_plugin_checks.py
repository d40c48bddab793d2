"""Checks on the OpenCL plugin of an RPC server before anything is uploaded: the plugin's
machine, TVM versions and sources against the device's; co-execution on a device without shared
virtual memory (a real server on 127.0.0.1 whose OpenCL runs in buffer mode); and a stock TVM
server with the plugin preloaded, as TVM's C++ ``tvm_rpc`` on a phone is run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from codl_tvm import runtime
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives import deploy
from codl_tvm.objectives.deploy import DeployOptions
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.rpc import plugin as rpc_plugin
from codl_tvm.runtime import plugin_build
from tests.rpc_support import free_port, logged_lines, server_command, tracker_command


def test_plugin_mismatches_names_each_difference():
    remote = {"machine": "aarch64", "tvm": "0.27.0", "tvm_ffi": "0.1.15"}
    same = {"machine": "aarch64", "tvm": "0.27.0", "tvm_ffi": "0.1.15", "sources_sha256": "ab"}
    assert rpc_plugin.plugin_mismatches(same, remote, "ab") == []
    wrong = {**same, "machine": "x86_64", "tvm": "0.26.0", "sources_sha256": "cd" * 8}
    problems = rpc_plugin.plugin_mismatches(wrong, {**remote, "machine": "arm64"}, "ab" * 8)
    assert problems == [
        "it is built for x86_64, the device is aarch64",
        "it is built for tvm 0.26.0, the device runs 0.27.0",
        "it is built from other codl-tvm runtime sources (cdcdcdcdcdcd there, abababababab here)",
    ]


def test_remote_plugin_reads_the_servers_report():
    info = {"machine": "aarch64", "plugin_machine": "aarch64", "plugin_tvm": "0.27.0"}
    assert rpc_plugin.remote_plugin(info) == {"machine": "aarch64", "tvm": "0.27.0"}


@pytest.mark.slow  # 10 s on 2 cores; CI runs it on the emulated aarch64 device (RPC step)
@pytest.mark.rpc
@pytest.mark.opencl
def test_coexec_on_a_device_without_svm_runs_on_host_mapped_buffers(opencl, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    port = free_port()
    tracker = f"127.0.0.1:{port}"
    procs = [
        subprocess.Popen(
            tracker_command(port),
            start_new_session=True,
        )
    ]
    try:
        sport = free_port()
        procs.append(
            subprocess.Popen(
                server_command(tracker, "nosvm", sport, "--opencl"),
                start_new_session=True,
                env={**os.environ, "CODL_OPENCL_SVM": "buffer"},
            )
        )
        rpc_utils.wait_for_devices(tracker, "nosvm", 1, timeout_s=90)
        model = load_onnx(bundled_model_path())
        inputs = random_inputs(model, seed=1)
        options = DeployOptions(
            tracker,
            "nosvm",
            target="pocl",
            device="coexec",
            dim="OC",
            ratio=0.5,
            number=1,
            repeat=1,
            request_timeout_s=60,
        )
        with logged_lines() as lines:
            result = deploy.deploy(model, options, inputs)
        assert result.remote_versions["svm"] == "buffer"
        assert any("buffer (host-mapped, no SVM)" in ln for ln in lines), lines
        want = ort.InferenceSession(str(bundled_model_path())).run(None, inputs)
        for got, ref in zip(result.outputs, want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.rpc
@pytest.mark.opencl
def test_stock_server_with_preloaded_plugin_coexecutes(opencl, tmp_path):
    """TVM's own server loading the plugin as a library (``--load-library``), which cannot
    report versions: deploy warns and co-executes through the plugin it finds."""
    plugin = runtime.load()
    loader = plugin_build.pyopencl_icd_loader()  # the ICD loader the runtime uses here
    env = dict(os.environ)
    if loader:  # the stock server does not set it up: point the plugin and the loader at it
        env["CODL_OPENCL_LIBRARY"] = loader
        libs = os.path.dirname(loader)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libs, env.get("LD_LIBRARY_PATH")]))
    port = free_port()
    tracker = f"127.0.0.1:{port}"
    procs = [subprocess.Popen(tracker_command(port), start_new_session=True)]
    try:
        sport = free_port()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", tracker, "--key",
                 "stock", "--host", "127.0.0.1", "--port", str(sport), "--port-end",
                 str(sport + 1), "--load-library", plugin],
                start_new_session=True,
                env=env,
            )
        )  # fmt: skip
        rpc_utils.wait_for_devices(tracker, "stock", 1, timeout_s=90)
        model = load_onnx(bundled_model_path())
        options = DeployOptions(
            tracker, "stock", target="pocl", device="coexec", dim="H", ratio=0.5, number=1,
            repeat=1, request_timeout_s=60,
        )  # fmt: skip
        with logged_lines() as lines:
            result = deploy.deploy(model, options)
        assert result.matches, result.max_abs_error
        assert result.remote_versions is None
        assert any("cannot report its TVM and plugin versions" in ln for ln in lines), lines
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
