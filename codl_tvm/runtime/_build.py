"""Build and load the C++ OpenCL runtime plugin.

The plugin is compiled on first use with tvm_ffi's C++ build helpers (g++ and ninja from PyPI)
against the headers of the installed TVM wheel, and cached by tvm_ffi under a hash of its sources
and flags, so later processes only ``dlopen`` it. ``CODL_TVM_PLUGIN_LIB`` names a prebuilt library
instead (used where no compiler exists, e.g. the device machine or a phone).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from importlib import metadata
from pathlib import Path

_SRC_DIR = Path(__file__).parent / "src"
_SOURCES = ("workspace.cc", "opencl_plugin.cc", "coexec_sync.cc")


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
