"""``codl-tvm build-runtime``: cross-building the OpenCL plugin for aarch64 Linux and Android.

The aarch64 build is real (Debian's ``g++-aarch64-linux-gnu``) and checked with ``readelf``;
Android is tested up to the NDK's compiler, which this machine does not have.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codl_tvm.cli import main
from codl_tvm.core.errors import ToolchainError
from codl_tvm.runtime import plugin_build as _build

needs_cross_gxx = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None,
    reason="needs Debian's g++-aarch64-linux-gnu",
)


def _fake_ndk(root: Path) -> Path:
    """An NDK directory layout whose clang++ is this machine's clang (enough to reach the
    compiler call; it lacks Android's sysroot, so the compile itself fails)."""
    host = f"{platform.system().lower()}-x86_64"
    bin_dir = root / "toolchains" / "llvm" / "prebuilt" / host / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "clang++").symlink_to(shutil.which("clang++") or "/bin/false")
    return root


def test_linux_arm64_command_uses_cross_gxx_and_libstdcxx_abi():
    cmd = _build.cross_build_command(["aarch64-linux-gnu-g++"], "linux-arm64", "/tmp/x.so")
    assert cmd[0] == "aarch64-linux-gnu-g++"
    for flag in ("-shared", "-fPIC", "-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1"):
        assert flag in cmd
    srcs = [c for c in cmd if c.endswith(".cc")]
    assert {Path(s).name for s in srcs} == {p.name for p in _build.plugin_sources()}
    assert not any(c.startswith("-ltvm") for c in cmd)  # TVM resolves at load time
    assert cmd[cmd.index("-o") + 1] == "/tmp/x.so"


def test_linux_arm64_with_sysroot_uses_clang_target(tmp_path):
    (tmp_path / "usr" / "include" / "c++").mkdir(parents=True)
    if shutil.which("clang++") is None or shutil.which("ld.lld") is None:
        pytest.skip("needs clang and lld")
    comp = _build.cross_compiler("linux-arm64", sysroot=tmp_path)
    assert comp == [
        "clang++",
        "--target=aarch64-linux-gnu",
        f"--sysroot={tmp_path}",
        "-fuse-ld=lld",
    ]
    with pytest.raises(ToolchainError, match="no usr/include/c\\+\\+"):
        _build.cross_compiler("linux-arm64", sysroot=tmp_path / "empty")


def test_android_needs_a_valid_ndk(tmp_path):
    with pytest.raises(ToolchainError, match="needs the Android NDK"):
        _build.cross_compiler("android-arm64")
    with pytest.raises(ToolchainError, match="no such directory"):
        _build.cross_compiler("android-arm64", ndk=tmp_path / "missing")
    with pytest.raises(ToolchainError, match="clang\\+\\+ is missing"):
        _build.cross_compiler("android-arm64", ndk=tmp_path)


def test_android_command_targets_the_api_level_with_static_libcxx(tmp_path):
    ndk = _fake_ndk(tmp_path / "ndk")
    comp = _build.cross_compiler("android-arm64", ndk=ndk, android_api=29)
    assert comp[0].endswith("/bin/clang++") and comp[1] == "--target=aarch64-linux-android29"
    cmd = _build.cross_build_command(comp, "android-arm64", tmp_path / "p.so")
    assert "-static-libstdc++" in cmd and "-D_GLIBCXX_USE_CXX11_ABI=1" not in cmd


def test_cli_android_errors_are_one_line(tmp_path, capsys):
    rc = main(["build-runtime", "--target", "android-arm64", "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("codl-tvm: error: ") and "--ndk NDK_DIR" in err
    assert len(err.strip().splitlines()) == 1
    rc = main(["build-runtime", "--target", "android-arm64", "--ndk", str(tmp_path), "-o", "o"])
    assert rc == 2 and "is not an Android NDK" in capsys.readouterr().err


def test_cli_refuses_to_overwrite_without_force(tmp_path, capsys):
    (tmp_path / _build.PLUGIN_NAME).write_bytes(b"mine")
    rc = main(["build-runtime", "--target", "linux-arm64", "-o", str(tmp_path)])
    assert rc == 2 and "pass --force" in capsys.readouterr().err
    assert (tmp_path / _build.PLUGIN_NAME).read_bytes() == b"mine"


def test_elf_machine_reads_the_header(tmp_path):
    assert _build.elf_machine(sys.executable) == platform.machine()
    (tmp_path / "not.so").write_text("hello")
    with pytest.raises(ToolchainError, match="not an ELF"):
        _build.elf_machine(tmp_path / "not.so")


@needs_cross_gxx
@pytest.mark.slow
def test_cross_build_linux_arm64_is_an_aarch64_elf(tmp_path, capsys):
    rc = main(["build-runtime", "--target", "linux-arm64", "-o", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    lib = tmp_path / _build.PLUGIN_NAME
    assert _build.elf_machine(lib) == "aarch64"
    desc = json.loads((tmp_path / f"{_build.PLUGIN_NAME}.json").read_text())
    assert desc["machine"] == "aarch64" and desc["cxx_runtime"] == "libstdc++"
    assert desc["sources_sha256"] == _build.sources_sha256()
    header = subprocess.run(["readelf", "-h", str(lib)], capture_output=True, text=True).stdout
    assert "AArch64" in header and "DYN" in header
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libstdc++.so.6" in dyn and "libc++" not in dyn
    # the wheel's C++11 ABI: std::string in the plugin's symbols is std::__cxx11::basic_string
    syms = subprocess.run(["readelf", "-Ws", str(lib)], capture_output=True, text=True).stdout
    assert "__cxx11" in syms


def test_tvm_lib_dir_names_tvm_as_dependencies(tmp_path):
    cmd = _build.cross_build_command(["g++"], "android-arm64", tmp_path / "p.so", tmp_path)
    i = cmd.index(f"-L{tmp_path}")
    assert cmd[i + 1 : i + 3] == ["-ltvm_ffi", "-ltvm_runtime"]


@pytest.mark.opencl  # builds (or reuses) this machine's plugin, as first use does
def test_host_target_copies_this_machines_plugin(tmp_path, capsys):
    assert main(["build-runtime", "-o", str(tmp_path)]) == 0, capsys.readouterr().err
    lib = tmp_path / _build.PLUGIN_NAME
    assert _build.elf_machine(lib) == platform.machine()
    desc = json.loads((tmp_path / f"{_build.PLUGIN_NAME}.json").read_text())
    assert desc["target"] == "host" and desc["sources_sha256"] == _build.sources_sha256()
    assert main(["build-runtime", "--ndk", "/x", "-o", str(tmp_path / "o")]) == 2


def test_an_unwritable_cache_root_does_not_stop_driver_registration(tmp_path, monkeypatch, caplog):
    """The ICD list of pip's OpenCL drivers goes to a temporary folder, with a warning, when the
    cache root cannot be created (a file in its way): loading the runtime must not crash."""
    from importlib import metadata

    try:
        metadata.distribution("intel-opencl-rt")
    except metadata.PackageNotFoundError:
        pytest.skip("intel-opencl-rt (the pip OpenCL driver that needs an ICD file) is absent")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    with caplog.at_level("WARNING", logger="codl_tvm.runtime.plugin_build"):
        _build.register_pip_opencl_drivers(blocker / "cache")
    assert "cannot write the OpenCL driver list" in caplog.text
    icd_dir = Path(os.environ["OCL_ICD_VENDORS"])
    assert (icd_dir / "intel-cpu.icd").read_text().strip().endswith("libintelocl.so")
