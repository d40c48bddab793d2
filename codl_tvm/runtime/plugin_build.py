"""Build and load the C++ OpenCL runtime plugin.

The plugin is compiled on first use with tvm_ffi's C++ build helpers (g++ and ninja from PyPI)
against the headers of the installed TVM wheel, and cached by tvm_ffi under a hash of its sources
and flags, so later processes only ``dlopen`` it. ``CODL_TVM_PLUGIN_LIB`` names a prebuilt library
instead (used where no compiler exists, e.g. a board or a phone).

:func:`cross_build_plugin` builds the same sources for another machine (``codl-tvm
build-runtime --target linux-arm64|android-arm64``): aarch64 Linux with Debian's cross g++ (or
clang with an arm64 sysroot) against libstdc++, as PyPI's aarch64 TVM wheel uses; Android with
the NDK's clang and a static libc++. Beside the library it writes a JSON description
(:func:`plugin_description`: target, ELF machine, TVM versions, a hash of the sources) that
servers report and clients check before uploading or using a plugin.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from codl_tvm.core.errors import ToolchainError

logger = logging.getLogger(__name__)

_SRC_DIR = Path(__file__).parent / "src"
_SOURCES = ("workspace.cc", "images.cc", "opencl_plugin.cc", "coexec_sync.cc")


def plugin_sources() -> list[Path]:
    """Return the C++ source files of the plugin that exist in this installation."""
    return [_SRC_DIR / name for name in _SOURCES if (_SRC_DIR / name).exists()]


def build_plugin(build_directory: str | None = None) -> str:
    """Compile the plugin (or reuse the cached build) and return the shared library's path.

    Parameters
    ----------
    build_directory
        Where to build; by default tvm_ffi's cache directory (``TVM_FFI_CACHE_DIR`` or
        ``~/.cache/tvm-ffi``) under a name that changes with the sources.
    """
    # deferred (first use only); tvm loads libtvm_runtime so the plugin's symbols resolve
    import tvm  # noqa: F401
    import tvm_ffi.cpp

    tvm_dir = Path(importlib.util.find_spec("tvm").origin).parent
    lib_dir = tvm_dir / "lib"
    runtime_libs = ["tvm_runtime"]
    return tvm_ffi.cpp.build(
        name="codl_tvm_opencl",
        sources=[str(p) for p in plugin_sources()],
        extra_cflags=["-O2", "-Wall", "-Wno-unused-function", "-fvisibility=hidden"],
        extra_ldflags=[
            f"-L{lib_dir}",
            *[f"-l{lib}" for lib in runtime_libs],
            "-ldl",
            f"-Wl,-rpath,{lib_dir}",
        ],
        extra_include_paths=[str(tvm_dir / "include"), str(_SRC_DIR)],
        build_directory=build_directory,
    )


def pyopencl_icd_loader() -> str | None:
    """Return pyopencl's bundled OpenCL ICD loader, pointing it at the bundled PoCL.

    pyopencl's wheel carries an ICD loader that looks for ``*.icd`` files under
    ``$PYOPENCL_HOME/.libs``, where the ``pocl`` extra installs PoCL. We set the variable the same
    way ``import pyopencl`` does, without paying for that import.
    """
    spec = importlib.util.find_spec("pyopencl")
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg_dir = Path(next(iter(spec.submodule_search_locations)))
    libs = sorted(glob.glob(str(pkg_dir / ".libs" / "libOpenCL*.so*")))
    if not libs:
        return None
    os.environ.setdefault("PYOPENCL_HOME", str(pkg_dir))
    # The .icd files name their driver by file name only; pyopencl's extension finds it through
    # its rpath. Preloading each bundled driver by full path lets the loader's dlopen find it.
    for icd in glob.glob(str(pkg_dir / ".libs" / "*.icd")):
        driver = pkg_dir / ".libs" / Path(icd).read_text().strip()
        if driver.is_file():
            try:
                ctypes.CDLL(str(driver), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass  # the loader reports a missing platform with a clear message later
    return libs[0]


def register_pip_opencl_drivers(cache_root: Path) -> None:
    """Make OpenCL drivers installed by pip visible to the ICD loader.

    Intel's CPU OpenCL runtime (PyPI ``intel-opencl-rt``) ships no usable ICD file, so we write
    one into ``cache_root/icd`` beside copies of the system's ICD files and point
    ``OCL_ICD_VENDORS`` there. Nothing changes when the user set ``OCL_ICD_VENDORS`` already.
    """
    if os.environ.get("OCL_ICD_VENDORS"):
        return
    drivers: dict[str, str] = {}
    try:
        for f in metadata.files("intel-opencl-rt") or []:
            if f.name == "libintelocl.so":
                drivers["intel-cpu.icd"] = str(Path(f.locate()).resolve())
    except metadata.PackageNotFoundError:
        pass
    if not drivers:
        return
    icd_dir = cache_root / "icd"
    try:
        icd_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # The ICD files are small and rewritten on every start: any writable folder serves,
        # and an unusable cache root must not stop the OpenCL runtime from loading.
        fallback = Path(tempfile.gettempdir()) / f"codl-tvm-{os.getuid()}" / "icd"
        logger.warning(
            "cannot write the OpenCL driver list under %s (%s); using %s",
            icd_dir,
            exc.strerror,
            fallback,
        )
        icd_dir = fallback
        icd_dir.mkdir(parents=True, exist_ok=True)
    system_dir = Path("/etc/OpenCL/vendors")
    if system_dir.is_dir():
        for icd in system_dir.glob("*.icd"):
            drivers.setdefault(f"system-{icd.name}", icd.read_text().strip())
    for name, lib in drivers.items():
        target = icd_dir / name
        if not target.exists() or target.read_text().strip() != lib:
            tmp = icd_dir / f".{name}.{os.getpid()}"
            tmp.write_text(lib + "\n")
            tmp.replace(target)
    os.environ["OCL_ICD_VENDORS"] = str(icd_dir)


def load_library(path: str) -> ctypes.CDLL:
    """``dlopen`` the plugin globally; its static initialisers register the TVM globals.

    The libraries it links against are opened first by full path, so a prebuilt plugin loads
    wherever TVM is installed (its build-time rpath may point elsewhere).
    """
    # deferred, as everywhere in codl_tvm.runtime: importing it (the cost-model package does)
    # loads no TVM library; TVM and the plugin load on first use
    import tvm
    import tvm_ffi

    for lib in (
        Path(tvm_ffi.__file__).parent / "lib" / "libtvm_ffi.so",
        Path(tvm.__file__).parent / "lib" / "libtvm_runtime.so",
    ):
        if lib.is_file():
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


# ---------------------------------------------------------------------------------------------
# Cross builds and the plugin's description

PLUGIN_NAME = "libcodl_tvm_opencl.so"
#: Version of the JSON written beside a plugin (:func:`plugin_description`).
DESCRIPTION_FORMAT = 1
#: ELF ``e_machine`` values of the machines a plugin can be built for, and their names as
#: ``platform.machine()`` reports them.
_ELF_MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "aarch64", 243: "riscv64"}
#: The NDK's Android API level when none is given (Android 9; OpenCL 2.0 drivers with SVM).
DEFAULT_ANDROID_API = 28


@dataclass(frozen=True)
class CrossTarget:
    """A machine the plugin can be cross-built for.

    Attributes
    ----------
    name
        ``--target`` of ``codl-tvm build-runtime``.
    triple
        The compiler's target triple (Android adds the API level).
    machine
        The ELF machine of the result, as ``platform.machine()`` names it there.
    cxx_runtime
        The C++ standard library the plugin uses: the one TVM's runtime uses on that system.
    """

    name: str
    triple: str
    machine: str
    cxx_runtime: str


CROSS_TARGETS: dict[str, CrossTarget] = {
    t.name: t
    for t in (
        # PyPI's aarch64 apache-tvm wheel is a manylinux build against libstdc++ (C++11 ABI)
        CrossTarget("linux-arm64", "aarch64-linux-gnu", "aarch64", "libstdc++"),
        # An Android TVM runtime is built with the NDK's libc++; static, so no libc++_shared.so
        # has to be pushed beside the plugin
        CrossTarget("android-arm64", "aarch64-linux-android", "aarch64", "libc++_static"),
    )
}


def sources_sha256() -> str:
    """SHA-256 over the plugin's sources and headers: two plugins with the same hash expose the
    same builtins with the same signatures."""
    digest = hashlib.sha256()
    for path in sorted(_SRC_DIR.glob("*")):
        if path.suffix in (".cc", ".h", ".def"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def elf_machine(path: str | os.PathLike) -> str:
    """The machine an ELF file is built for (``"aarch64"``, ``"x86_64"``...), read from its
    header (``e_machine``).

    Raises
    ------
    ToolchainError
        The file is missing or not an ELF file.
    """
    path = Path(path)
    try:
        head = path.read_bytes()[:20]
    except OSError as exc:
        raise ToolchainError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise ToolchainError(f"{path} is not an ELF shared library")
    order = "<" if head[5] == 1 else ">"
    (machine,) = struct.unpack(order + "H", head[18:20])
    return _ELF_MACHINES.get(machine, f"elf-machine-{machine}")


def _tvm_dirs() -> tuple[Path, Path]:
    tvm_dir = Path(importlib.util.find_spec("tvm").origin).parent
    ffi_dir = Path(importlib.util.find_spec("tvm_ffi").origin).parent
    return tvm_dir, ffi_dir


def local_tvm_versions() -> dict[str, str]:
    """The ``tvm`` and ``tvm_ffi`` versions whose headers a plugin built here compiles against
    (as :func:`codl_tvm.rpc.client.local_versions` reports them)."""
    # deferred: importing codl_tvm.runtime loads no TVM library (see codl_tvm.runtime.load)
    import tvm
    import tvm_ffi

    return {"tvm": tvm.__version__, "tvm_ffi": getattr(tvm_ffi, "__version__", "unknown")}


def android_clang(ndk: str | os.PathLike) -> Path:
    """The NDK's ``clang++`` for this host.

    Raises
    ------
    ToolchainError
        ``ndk`` is not a directory or holds no LLVM toolchain for this host.
    """
    ndk = Path(ndk).expanduser()
    if not ndk.is_dir():
        raise ToolchainError(f"--ndk {ndk}: no such directory (give the Android NDK's root)")
    host = f"{platform.system().lower()}-x86_64"
    clang = ndk / "toolchains" / "llvm" / "prebuilt" / host / "bin" / "clang++"
    if not clang.is_file():
        raise ToolchainError(
            f"--ndk {ndk} is not an Android NDK for this {host} host: "
            f"toolchains/llvm/prebuilt/{host}/bin/clang++ is missing (NDK r21 or newer)"
        )
    return clang


def cross_compiler(
    target: str | CrossTarget,
    ndk: str | os.PathLike | None = None,
    sysroot: str | os.PathLike | None = None,
    cxx: str | None = None,
    android_api: int = DEFAULT_ANDROID_API,
) -> list[str]:
    """The compiler command (program and target options) that builds the plugin for ``target``.

    ``linux-arm64``: ``cxx`` if given; with ``sysroot`` (an arm64 root holding Debian's
    ``libc6-dev``, ``libstdc++-12-dev`` and ``libgcc-12-dev``), ``clang++ --target=
    aarch64-linux-gnu --sysroot=...`` linked by lld; else Debian's ``aarch64-linux-gnu-g++``.
    ``android-arm64``: the NDK's ``clang++ --target=aarch64-linux-android<api>``.

    Raises
    ------
    ToolchainError
        Unknown target, or the compiler it needs is missing (the message says what to install).
    """
    target = cross_target(target)
    if target.name == "android-arm64":
        if ndk is None:
            raise ToolchainError(
                "--target android-arm64 needs the Android NDK: --ndk NDK_DIR "
                "(https://developer.android.com/ndk/downloads)"
            )
        return [str(android_clang(ndk)), f"--target={target.triple}{int(android_api)}"]
    if cxx:
        if shutil.which(cxx) is None:
            raise ToolchainError(f"--cxx {cxx}: no such compiler")
        return [cxx]
    if sysroot is not None:
        root = Path(sysroot).expanduser()
        if not (root / "usr" / "include" / "c++").is_dir():
            raise ToolchainError(
                f"--sysroot {root} has no usr/include/c++: unpack Debian's arm64 libc6-dev, "
                "libstdc++-12-dev and libgcc-12-dev there (scripts/emulated_aarch64.py prepare "
                "--opencl makes such a root)"
            )
        missing = [t for t in ("clang++", "ld.lld") if shutil.which(t) is None]
        if missing:
            raise ToolchainError(
                f"building with --sysroot needs clang and lld; not found: {', '.join(missing)} "
                "(Debian/Ubuntu: apt-get install clang lld)"
            )
        return ["clang++", f"--target={target.triple}", f"--sysroot={root}", "-fuse-ld=lld"]
    gxx = f"{target.triple}-g++"
    if shutil.which(gxx) is None:
        raise ToolchainError(
            f"no {target.triple} C++ cross compiler: install Debian/Ubuntu's "
            f"g++-{target.triple} ({gxx}), or pass --sysroot DIR (clang with an arm64 root) or "
            "--cxx COMPILER"
        )
    return [gxx]


def cross_target(target: str | CrossTarget) -> CrossTarget:
    """The :class:`CrossTarget` called ``target``.

    Raises
    ------
    ToolchainError
        No such target (the message lists the valid ones).
    """
    if isinstance(target, CrossTarget):
        return target
    try:
        return CROSS_TARGETS[target]
    except KeyError:
        raise ToolchainError(
            f"unknown runtime target {target!r}; valid targets: {', '.join(CROSS_TARGETS)}"
        ) from None


def cross_build_command(
    compiler: list[str],
    target: str | CrossTarget,
    output: str | os.PathLike,
    tvm_lib_dir: str | os.PathLike | None = None,
) -> list[str]:
    """The full command that compiles and links the plugin with ``compiler``
    (:func:`cross_compiler`) into ``output``.

    By default TVM's libraries are not linked: the process that loads the plugin has loaded them
    already (:func:`load_library` opens them globally first), so their symbols resolve at load
    time and the plugin does not depend on where TVM is installed on the device. With
    ``tvm_lib_dir`` (the device's ``libtvm_ffi.so`` and ``libtvm_runtime.so``) it names them as
    dependencies, so that preloading it (``LD_PRELOAD`` into TVM's C++ ``tvm_rpc``) runs TVM's
    initialisers before the plugin's.
    """
    target = cross_target(target)
    tvm_dir, ffi_dir = _tvm_dirs()
    flags = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wall",
        "-Wno-unused-function",
        # the wheels' headers are the same on every machine; only the ABI must match
        f"-I{ffi_dir / 'include'}",
        f"-I{tvm_dir / 'include'}",
        f"-I{_SRC_DIR}",
    ]
    if target.cxx_runtime == "libstdc++":
        # The wheel's libraries export std::__cxx11 symbols: the C++11 string/list ABI
        flags.append("-D_GLIBCXX_USE_CXX11_ABI=1")
        libs = ["-ldl", "-lpthread"]
    else:
        libs = ["-static-libstdc++", "-ldl"]
    if tvm_lib_dir is not None:
        libs = [f"-L{tvm_lib_dir}", "-ltvm_ffi", "-ltvm_runtime", *libs]
    return [*compiler, *flags, *(str(p) for p in plugin_sources()), "-o", str(output), *libs]


def plugin_description(path: str | os.PathLike) -> dict[str, str]:
    """What is known about the plugin at ``path``: the JSON written beside it by
    :func:`cross_build_plugin` (``PATH.json``), else its ELF machine (and, when the sources of
    this installation built it, their hash and this machine's TVM versions)."""
    path = Path(path)
    side = Path(str(path) + ".json")
    if side.is_file():
        try:
            return {str(k): str(v) for k, v in json.loads(side.read_text()).items()}
        except (OSError, ValueError):
            pass
    info = {"machine": elf_machine(path)}
    try:
        info.update(local_tvm_versions())
        info["sources_sha256"] = sources_sha256()
    except Exception:  # no sources (a bare deployment): the machine is all there is to check
        pass
    return info


def cross_build_plugin(
    target: str | CrossTarget,
    out_dir: str | os.PathLike,
    ndk: str | os.PathLike | None = None,
    sysroot: str | os.PathLike | None = None,
    cxx: str | None = None,
    android_api: int = DEFAULT_ANDROID_API,
    timeout_s: float = 900.0,
    tvm_lib_dir: str | os.PathLike | None = None,
) -> Path:
    """Cross-build the plugin for ``target`` into ``out_dir``; return the library's path.

    Writes ``libcodl_tvm_opencl.so`` and ``libcodl_tvm_opencl.so.json`` (target, machine, C++
    runtime, the TVM versions whose headers it was built with, the sources' hash), after
    checking that the result is an ELF file for the target's machine. ``tvm_lib_dir``: see
    :func:`cross_build_command`.

    Raises
    ------
    ToolchainError
        No compiler for the target, the compile failed (with its first error lines), or the
        result is for another machine.
    """
    target = cross_target(target)
    compiler = cross_compiler(target, ndk=ndk, sysroot=sysroot, cxx=cxx, android_api=android_api)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    lib = out / PLUGIN_NAME
    tmp = out / f".{PLUGIN_NAME}.{os.getpid()}"
    cmd = cross_build_command(compiler, target, tmp, tvm_lib_dir)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolchainError(
            f"building the plugin for {target.name} timed out after {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise ToolchainError(f"cannot run {compiler[0]}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
        raise ToolchainError(
            f"building the plugin for {target.name} with {Path(compiler[0]).name} failed: "
            + " | ".join((errors or proc.stderr.strip().splitlines() or ["no output"])[:3])
        )
    machine = elf_machine(tmp)
    if machine != target.machine:
        tmp.unlink(missing_ok=True)
        raise ToolchainError(
            f"{compiler[0]} built a {machine} library, not {target.machine} for {target.name}"
        )
    tmp.replace(lib)
    version = subprocess.run(
        [compiler[0], "--version"], capture_output=True, text=True, timeout=60
    ).stdout.splitlines()
    description = {
        "format": str(DESCRIPTION_FORMAT),
        "target": target.name,
        "triple": target.triple,
        "machine": machine,
        "cxx_runtime": target.cxx_runtime,
        **local_tvm_versions(),
        "sources_sha256": sources_sha256(),
        "compiler": version[0] if version else compiler[0],
    }
    Path(str(lib) + ".json").write_text(json.dumps(description, indent=1) + "\n")
    return lib
