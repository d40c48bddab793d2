"""OpenCL images on the emulated aarch64 OpenCL device, through a real TVM RPC tracker.

The device is the one of ``tests/test_rpc_aarch64_opencl.py`` (whose fixtures this module
uses): TVM's RPC server for aarch64 under qemu in a chroot with Debian's arm64 PoCL and
codl-tvm's cross-built plugin. Checked there: the plugin's image support as it reports it
(``codl.opencl.image_caps``), texture-scope tensors allocated through the RPC session
(``tvm.runtime.empty(..., mem_scope=...)``, which the plugin makes images) and copied
host -> image -> host, image <-> buffer and image -> image; then the bundled small CNN built
for ``linux-arm64-pocl`` with ``--gpu-data-type image``, GPU alone and co-executed, run there by
``codl-tvm run ARTIFACT --tracker --key --check`` against the stored reference (float32:
within 1e-4 of the outputs' scale) and, on other inputs, against onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm

from codl_tvm.build.texture import VM_DEVICE_SLOTS
from codl_tvm.cli import main
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives import deploy
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.rpc.remote_vm import remote_image_caps
from codl_tvm.runtime.artifact import LIBRARY
from tests.test_rpc_aarch64_opencl import device, servers, tracker  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.rpc, pytest.mark.slow]

PRESET = "linux-arm64-pocl"

# (scope, shape): each texture scope, layers, rows and pixels of different sizes
CASES = (
    ("global.texture", (2, 3, 5, 4)),
    ("global.texture-nhwc", (2, 3, 4, 5, 4)),
    ("global.texture-weight", (3, 2, 2, 3, 4)),
)


def test_images_through_the_rpc_session(tracker, servers):  # noqa: F811 (fixtures)
    """Image caps, and texture-scope tensors the plugin on the device makes images, copied
    whole in every direction through the session (numpy compares them exactly)."""
    key = servers.start("emu-img-rt")
    remote = rpc_utils.request_remote(tracker, key, timeout_s=120)
    try:
        caps = remote_image_caps(remote)
        assert caps is not None and caps.image_support and caps.rgba_float, caps
        dev = remote.session.cl(0)
        rng = np.random.default_rng(0)
        for scope, shape in CASES:
            x = rng.standard_normal(shape).astype("float32")
            img = tvm.runtime.empty(shape, "float32", dev, mem_scope=scope)
            img.copyfrom(x)
            np.testing.assert_array_equal(img.numpy(), x, err_msg=f"host->image->host {scope}")
            buf = tvm.runtime.empty(shape, "float32", dev)
            img.copyto(buf)
            np.testing.assert_array_equal(buf.numpy(), x, err_msg=f"image->buffer {scope}")
            img2 = tvm.runtime.empty(shape, "float32", dev, mem_scope=scope)
            tvm.runtime.tensor(-x, dev).copyto(img2)
            np.testing.assert_array_equal(img2.numpy(), -x, err_msg=f"buffer->image {scope}")
            img.copyto(img2)
            np.testing.assert_array_equal(img2.numpy(), x, err_msg=f"image->image {scope}")
    finally:
        remote.close()


def _compile_and_run(address: str, key: str, out: Path, capsys, *argv: str) -> dict:
    """``compile`` the bundled CNN for the aarch64 preset with images, then ``run ARTIFACT
    --tracker --key --check`` on the device; returns the manifest."""
    model = str(bundled_model_path())
    code = main(["compile", model, "--preset", PRESET, "--gpu-data-type", "image", "-o", str(out),
                 *argv])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert b"write_imagef" in (out / LIBRARY).read_bytes()
    rpc_utils.wait_for_devices(address, key, 1, timeout_s=120)
    code = main(["run", str(out), "--tracker", address, "--key", key, "--check",
                 "--timeout", "300", "--repeat", "1", "--number", "1"])  # fmt: skip
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0, text + captured.err
    assert "against the reference" in text and "-> OK" in text, text
    # and on other inputs, against onnxruntime (the library function behind ``run``)
    rpc_utils.wait_for_devices(address, key, 1, timeout_s=120)
    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype("float32")
    run = deploy.run_artifact(out, address, key, [x], number=1, repeat=1, request_timeout_s=300)
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = session.run(None, {session.get_inputs()[0].name: x})[0]
    err = float(np.max(np.abs(run.outputs[0] - ref)))
    assert err <= 1e-4 * max(1.0, float(np.max(np.abs(ref)))), err
    return json.loads((out / "manifest.json").read_text())


def test_gpu_image_build_of_the_bundled_cnn(tracker, servers, tmp_path, capsys):  # noqa: F811
    """``--device opencl --gpu-data-type image``: the VM gets the OpenCL device once per VM
    slot; the outputs equal the reference within 1e-4 of its scale (``run --check``)."""
    key = servers.start("emu-img-gpu")
    manifest = _compile_and_run(tracker, key, tmp_path / "gpu", capsys, "--device", "opencl")
    assert manifest["gpu"]["data_type"] == "image"
    assert manifest["vm_devices"] == ["opencl"] * VM_DEVICE_SLOTS


# The device's own kernel compiler crashes on one kernel of the OC split (issue 46): Debian's
# arm64 PoCL 3.1-3+deb12u1 (LLVM 15.0.6) under qemu, building the GPU part of the split 1x1
# conv (fused_conv2d_NCHWc_OIHWo*_add*_relu*: 32 accumulators, no bounds guards) with its
# default work-group method, loopvec, segfaults in LLVM (InlineFunction ->
# ShuffleVectorInst::clone), standalone too (clBuildProgram, then CL_PROGRAM_BINARIES, of that
# source alone, without TVM or codl-tvm); the server died "in free" while main ran. The same
# source builds with POCL_WORK_GROUP_METHOD=cbs or -cl-opt-disable, and with x86 PoCL; the
# plugin built with AddressSanitizer reports nothing (x86 PoCL; aarch64 under qemu with cbs).
# Not checked on arm64 hardware. So the OC server uses cbs; the H split keeps the default.
_POCL_WORKAROUND = {"OC": ("--env", "POCL_WORK_GROUP_METHOD=cbs")}


@pytest.mark.parametrize("dim", ["H", "OC"])
def test_coexec_image_build_of_the_bundled_cnn(tracker, servers, tmp_path, capsys, dim):  # noqa: F811
    """``--device coexec --gpu-data-type image``: GPU parts on images, CPU parts on buffers."""
    key = servers.start(f"emu-img-co-{dim}", *_POCL_WORKAROUND.get(dim, ()))
    manifest = _compile_and_run(
        tracker, key, tmp_path / "co", capsys, "--device", "coexec", "--dim", dim,
        "--ratio", "0.5",
    )  # fmt: skip
    assert manifest["gpu"]["data_type"] == "image"
    assert set(manifest["vm_devices"]) == {"opencl", "cpu"}
