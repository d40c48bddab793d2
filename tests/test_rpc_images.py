"""Builds whose GPU tensors are OpenCL images, run and measured through a real TVM RPC tracker.

A tracker and codl-tvm's RPC server with its OpenCL plugin (``codl-tvm serve --opencl``, on
the machine's real OpenCL driver: PoCL or Intel's CPU runtime from PyPI) run on 127.0.0.1 as
separate processes. An image build's VM there gets the remote OpenCL
device once per VM slot, as its manifest lists it: ``run ARTIFACT --tracker`` checks its outputs
against the stored reference, and ``compile --gpu-data-type auto --tracker`` times buffers
against images on the remote device and keeps the faster, after the remote device's own
support (images, ``cl_khr_fp16``) is checked. Nothing here asserts which is faster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from codl_tvm.build.texture import VM_DEVICE_SLOTS
from codl_tvm.cli import main
from codl_tvm.core.errors import RemoteFailure
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives import deploy
from codl_tvm.objectives.measure import MEASURE_ROUNDS
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.rpc.remote_vm import remote_image_caps
from codl_tvm.runtime.artifact import LIBRARY, load_artifact
from codl_tvm.runtime.images import image_caps
from tests.rpc_support import free_port, logged_lines, server_command, tracker_command
from tests.texture_graphs import conv_pool_model

pytestmark = [pytest.mark.rpc, pytest.mark.opencl]

KEY = "images"


def _conv_pool_model(path: Path, h: int = 12, w: int = 12) -> Path:
    return conv_pool_model(path, h, w)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@contextlib.contextmanager
def _server(tracker: str, key: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A codl-tvm server with the OpenCL plugin (``serve --opencl``) under ``key``."""
    proc = subprocess.Popen(
        server_command(tracker, key, free_port(), "--opencl"),
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        rpc_utils.wait_for_devices(tracker, key, 1, timeout_s=90)
        yield key
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def tracker():
    """TVM's tracker and one codl-tvm server with the OpenCL plugin under :data:`KEY`."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    proc = subprocess.Popen(tracker_command(port), start_new_session=True)
    try:
        with _server(addr, KEY):
            yield addr
    finally:
        _stop(proc)


def _compile(capsys, *argv: str) -> tuple[int, str]:
    code = main(["compile", *argv])
    return code, capsys.readouterr().err


def _run_through(tracker: str, capsys, artifact: Path) -> str:
    """``codl-tvm run ARTIFACT --tracker --key --check``: its output, asserting it passed."""
    argv = ["run", str(artifact), "--tracker", tracker, "--key", KEY, "--check"]
    code = main([*argv, "--timeout", "60", "--repeat", "1", "--number", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)
    return out


def test_image_build_runs_through_the_tracker(opencl, tracker, tmp_path, capsys):
    """The remote VM gets the OpenCL device once per VM slot (one per memory scope): its
    outputs equal the stored reference (the host CPU's unpartitioned build)."""
    model = _conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"
    )
    assert code == 0, err
    assert load_artifact(out).manifest.vm_devices == ["opencl"] * VM_DEVICE_SLOTS
    assert b"write_imagef" in (out / LIBRARY).read_bytes()

    text = _run_through(tracker, capsys, out)
    assert f"through RPC tracker {tracker} (key {KEY})" in text
    assert "against the reference (unpartitioned, host CPU)" in text and "-> OK" in text

    # the library function behind it, on other inputs, against the host CPU build
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 12)).astype("float32")
    run = deploy.run_artifact(out, tracker, KEY, [x], number=1, repeat=2, request_timeout_s=60)
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)
    from codl_tvm.build.runner import build

    want = build(load_onnx(model).mod, "cpu")([x])
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=1e-4, atol=1e-4)
    assert run.repeats == 2 and len(run.samples_ms) == 2 and run.median_ms > 0


def test_image_build_needs_its_vm_slots(opencl, tracker, tmp_path, capsys):
    """Given one OpenCL device for its four slots (the remote runner before), the image build
    fails there with an error naming the device; the server serves on."""
    model = _conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    code, err = _compile(
        capsys, str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "image"
    )
    assert code == 0, err
    x = np.zeros((1, 3, 12, 12), "float32")
    remote = rpc_utils.request_remote(tracker, KEY, timeout_s=60)
    try:
        with pytest.raises(RemoteFailure, match=f"{remote.name} failed while running main"):
            deploy.run_remote(remote, out / LIBRARY, [x], "opencl", repeat=0)
    finally:
        remote.close()
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)
    _run_through(tracker, capsys, out)


def test_auto_measures_buffers_and_images_through_the_tracker(opencl, tracker, tmp_path, capsys):
    """``compile --gpu-data-type auto --tracker --key``: both builds timed on the remote
    device (not ``unchecked``), the record as a local measurement writes it, the kept library
    the faster's; the artifact then runs there and matches its reference."""
    model = _conv_pool_model(tmp_path / "m.onnx")
    out = tmp_path / "art"
    with logged_lines() as lines:
        code, err = _compile(
            capsys,
            *(str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"),
            *("--tracker", tracker, "--key", KEY),
        )
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    ms = gpu["measured_ms"]
    assert set(ms) == {"buffer", "image"} and all(v > 0 for v in ms.values())
    assert gpu["data_type"] == min(ms, key=ms.get)
    assert f"(RPC {tracker}, key {KEY})" in gpu["measured_on"]
    assert gpu["measured_on"].startswith(f"{KEY}@127.0.0.1:")
    assert gpu["rounds"] == MEASURE_ROUNDS
    assert all(len(gpu["samples_ms"][t]) == MEASURE_ROUNDS for t in ms)
    assert ms == {t: float(np.median(v)) for t, v in gpu["samples_ms"].items()}
    assert "unchecked" not in gpu and "dropped" not in gpu and "why" not in gpu
    images = gpu["data_type"] == "image"
    assert (b"write_imagef" in (out / LIBRARY).read_bytes()) == images
    assert manifest["vm_devices"] == ["opencl"] * (VM_DEVICE_SLOTS if images else 1)
    kept = [ln for ln in lines if ln.startswith("GPU data type measured on")]
    assert len(kept) == 1 and f"key {KEY})" in kept[0], lines
    assert kept[0].endswith(f"keeping {gpu['data_type']}s")
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)
    assert "-> OK" in _run_through(tracker, capsys, out)


def test_images_the_device_cannot_hold_through_the_tracker(opencl, tracker, tmp_path, capsys):
    """A model whose tensors no image of the device holds: ``image`` is one line and exit 2,
    ``auto`` measures the buffer build alone on the remote device and says why, as locally."""
    caps = image_caps()
    model = _conv_pool_model(tmp_path / "wide.onnx", h=1, w=caps.image2d_max_width + 4)
    base = [str(model), "--device", "opencl", "--tracker", tracker, "--key", KEY]
    code, err = _compile(capsys, *base, "-o", str(tmp_path / "img"), "--gpu-data-type", "image")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("codl-tvm: error: ")
    assert "CL_DEVICE_IMAGE2D_MAX_WIDTH" in lines[0] and "--gpu-data-type" in lines[0]
    assert not (tmp_path / "img").exists()

    out = tmp_path / "auto"
    with logged_lines() as logged:
        code, err = _compile(capsys, *base, "-o", str(out), "--gpu-data-type", "auto")
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    gpu = manifest["gpu"]
    assert gpu["data_type"] == "buffer" and "CL_DEVICE_IMAGE2D_MAX_WIDTH" in gpu["why"]
    assert list(gpu["measured_ms"]) == ["buffer"] and f"key {KEY})" in gpu["measured_on"]
    assert "unchecked" not in gpu and manifest["vm_devices"] == ["opencl"]
    kept = [ln for ln in logged if ln.startswith("GPU data type measured on")]
    assert len(kept) == 1 and "images not timed" in kept[0], logged
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)


def test_auto_reads_the_remote_devices_support(opencl, tracker, tmp_path, capsys):
    """Through a tracker the remote device's own support decides, not this machine's: a
    server on PoCL (no ``cl_khr_fp16``) behind a compile whose device here has it (Intel's
    CPU runtime) refuses float16 in one line naming the remote device."""
    if not image_caps().fp16:
        pytest.skip("this machine's OpenCL device lacks cl_khr_fp16: float16 fails here first")
    with _server(tracker, "pocl-images", {"CODL_OPENCL_PLATFORM": "pocl"}) as key:
        remote = rpc_utils.request_remote(tracker, key, timeout_s=60)
        try:
            caps = remote_image_caps(remote)
        finally:
            remote.close()
        assert caps is not None and caps.image_support
        if caps.fp16:
            pytest.skip(f"the remote device '{caps.device}' has cl_khr_fp16 here")
        rpc_utils.wait_for_devices(tracker, key, 1, timeout_s=30)
        model = _conv_pool_model(tmp_path / "m.onnx")
        out = tmp_path / "half"
        code, err = _compile(
            capsys,
            *(str(model), "-o", str(out), "--device", "opencl", "--gpu-data-type", "auto"),
            *("--gpu-dtype", "float16", "--tracker", tracker, "--key", key),
        )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("codl-tvm: error: "), err
    assert f"'{caps.device}' lacks cl_khr_fp16" in lines[0] and "--gpu-dtype" in lines[0]
    assert not out.exists()


def test_run_through_the_tracker_refuses_in_one_line(opencl, tracker, tmp_path, capsys):
    """What ``run ARTIFACT --tracker`` cannot do is one line and exit 2, before any upload:
    weights stored beside the library (read by codl-tvm's runtime on the device), a key no
    server registered."""
    model = _conv_pool_model(tmp_path / "m.onnx")
    base = [str(model), "--device", "opencl", "--gpu-data-type", "image"]
    for name, weights in (("beside", "beside"), ("embedded", "embedded")):
        code, err = _compile(capsys, *base, "-o", str(tmp_path / name), "--weights", weights)
        assert code == 0, err
    for name, key, why in (
        ("beside", KEY, "weights are stored beside the library"),
        ("embedded", "nosuch", "no device registered under key 'nosuch'"),
    ):
        argv = ["run", str(tmp_path / name), "--tracker", tracker, "--key", key, "--timeout", "1"]
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("codl-tvm: error: ") and why in lines[0]
    rpc_utils.wait_for_devices(tracker, KEY, 1, timeout_s=30)
