"""Target presets and the export helper's link paths (no device needed)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from codl_tvm.build import targets


def _add_mod():
    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                z = R.add(x, y)
                out = R.nn.relu(z)
                R.output(out)
            return out

    return Mod


def test_every_preset_builds_a_target():
    for name in targets.preset_names():
        preset = targets.get_preset(name)
        cpu = preset.cpu_target()
        assert cpu.kind.name == "llvm"
        if preset.is_cross:
            assert cpu.attrs["mtriple"] == preset.triple
            assert "arm_cpu" in cpu.keys
            assert "+neon" in list(cpu.attrs["mattr"])
        if preset.has_gpu:
            gpu = preset.gpu_target()
            assert gpu.kind.name == "opencl"
            assert gpu.host.kind.name == "llvm"
            assert dict(gpu.host.attrs).get("mtriple") == cpu.attrs.get("mtriple")


def test_android_gpu_presets_have_vendor_keys():
    assert "adreno" in targets.get_preset("android-adreno").gpu_target().keys
    assert "mali" in targets.get_preset("android-mali").gpu_target().keys
    assert targets.get_preset("android-adreno").os == "android"


def test_mcpu_override():
    t = targets.get_preset("host").cpu_target(mcpu="x86-64")
    assert t.attrs["mcpu"] == "x86-64"
    t = targets.get_preset("linux-arm64").target("cpu", mcpu="cortex-a55")
    assert t.attrs["mcpu"] == "cortex-a55"


def test_unknown_preset_lists_valid_names():
    with pytest.raises(KeyError, match=r"unknown target preset 'pixel9'.*android-arm64"):
        targets.get_preset("pixel9")


def test_cpu_only_preset_has_no_gpu_target():
    with pytest.raises(ValueError, match=r"'android-arm64' has no OpenCL GPU.*android-adreno"):
        targets.get_preset("android-arm64").gpu_target()
    with pytest.raises(ValueError, match="unknown device 'npu'"):
        targets.get_preset("host").target("npu")


def test_link_method_follows_ndk_variable(monkeypatch):
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    assert targets.link_method(targets.get_preset("host")) == "host"
    assert targets.link_method(targets.get_preset("android-arm64")) == "clang"
    monkeypatch.setenv("TVM_NDK_CC", "/nonexistent/ndk/aarch64-linux-android29-clang")
    assert targets.link_method(targets.get_preset("android-arm64")) == "ndk"
    assert targets.link_method(targets.get_preset("linux-arm64")) == "clang"
    with pytest.raises(targets.ToolchainError, match="TVM_NDK_CC=/nonexistent/ndk"):
        targets.check_toolchain(targets.get_preset("android-arm64"))


def test_missing_clang_is_reported(monkeypatch, tmp_path):
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no clang, no lld
    with pytest.raises(targets.ToolchainError, match=r"needs clang and lld.*apt-get install"):
        targets.check_toolchain(targets.get_preset("android-arm64"))


def test_host_export_runs(tmp_path):
    ex = tvm.compile(_add_mod(), target=targets.get_preset("host").cpu_target())
    lib = targets.export_library(ex, tmp_path / "host.so", "host")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype("float32")
    y = rng.standard_normal((4, 8)).astype("float32")
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_allclose(out, np.maximum(x + y, 0), rtol=1e-6)


@pytest.mark.skipif(
    shutil.which("clang") is None or shutil.which("ld.lld") is None,
    reason="clang and lld are not installed (apt-get install clang lld)",
)
@pytest.mark.parametrize("name", ["android-arm64", "linux-arm64"])
def test_cross_export_is_aarch64_elf(tmp_path, monkeypatch, name):
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    preset = targets.get_preset(name)
    ex = tvm.compile(_add_mod(), target=preset.cpu_target())
    lib = targets.export_library(ex, tmp_path / f"{name}.so", preset)
    header = lib.read_bytes()[:20]
    assert header[:4] == b"\x7fELF"
    assert int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    if shutil.which("file"):
        assert (
            "aarch64" in subprocess.run(["file", str(lib)], capture_output=True, text=True).stdout
        )
