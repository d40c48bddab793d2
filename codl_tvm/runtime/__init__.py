"""The codl-tvm OpenCL runtime plugin for TVM's PyPI wheel.

TVM's wheel generates OpenCL kernels but has no OpenCL runtime. :func:`load` builds (once, cached)
and loads a small C++ plugin that registers ``device_api.opencl``, the OpenCL module loader and an
event timer with the stock TVM runtime. Device tensors live in shared virtual memory (SVM), so the
CPU can address them: :func:`cpu_view` gives a CPU tensor over the same bytes, with no copy.

Device selection, by argument or environment variable (arguments win):

- ``CODL_OPENCL_PLATFORM``: part of the platform's name or vendor (case-insensitive), or a short
  name: ``pocl`` (Portable Computing Language), ``intel``, ``nvidia``, ``amd``, ``mali``,
  ``adreno``;
- ``CODL_OPENCL_DEVICE``: index of the one device to use on that platform (default: all);
- ``CODL_OPENCL_SVM``: force ``fine``, ``coarse`` or ``buffer`` allocation (default: the best the
  devices support);
- ``CODL_TVM_CACHE_DIR``: root of codl-tvm's caches (program binaries go to ``opencl-programs``
  below it; default ``~/.cache/codl-tvm``); ``CODL_OPENCL_PROGRAM_CACHE=0`` disables the disk cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from codl_tvm.core.errors import BuildError, CodlError
from codl_tvm.core.interrupts import is_interrupt, sigint_count, watching_sigint
from codl_tvm.runtime import plugin_build as _build

__all__ = [
    "DeviceInfo",
    "KernelEvent",
    "OpenCLInfo",
    "add_program_binary_dir",
    "buffer_stats",
    "build_error",
    "build_programs",
    "cache_stats",
    "cpu_view",
    "default_cache_dir",
    "describe_svm_mode",
    "exporting_program_binaries",
    "host_clock_ns",
    "info",
    "is_available",
    "load",
    "log_dir",
    "opencl_module_from_source",
    "plugin_function",
    "record_kernels",
    "start_context",
    "svm_map",
    "svm_mode",
    "svm_unmap",
    "workspace_stats",
]

_lock = threading.Lock()
_loaded_path: str | None = None
_configured = [False]


@dataclass(frozen=True)
class DeviceInfo:
    """One OpenCL device of the selected platform."""

    index: int
    name: str
    vendor: str
    version: str
    driver_version: str
    opencl_c_version: str
    compute_units: int
    max_clock_mhz: int
    global_mem_bytes: int
    local_mem_bytes: int
    max_work_group_size: int
    svm_fine_grain: bool
    svm_coarse_grain: bool
    svm_atomics: bool
    fp16: bool


@dataclass(frozen=True)
class OpenCLInfo:
    """The platform in use, its selected devices and the allocation mode."""

    platform: str
    platform_version: str
    platform_vendor: str
    svm_mode: str
    svm_atomics: bool
    devices: tuple[DeviceInfo, ...] = field(default_factory=tuple)
    skipped_platforms: tuple[dict[str, str], ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class KernelEvent:
    """One OpenCL kernel launch with its device timestamps (ns, the device's profiling clock)."""

    name: str
    device: int
    queued_ns: int
    start_ns: int
    end_ns: int

    @property
    def duration_ms(self) -> float:
        """Execution time of the kernel in milliseconds."""
        return (self.end_ns - self.start_ns) / 1e6


def default_cache_dir() -> Path:
    """Root of codl-tvm's on-disk caches (``CODL_TVM_CACHE_DIR`` or ``~/.cache/codl-tvm``)."""
    root = os.environ.get("CODL_TVM_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "codl-tvm"


def plugin_function(name: str):
    """The global function ``name`` that the OpenCL runtime plugin (or TVM) registers; call
    :func:`load` first for the plugin's own (``codl.opencl.*``, ``codl.coexec.*``)."""
    import tvm_ffi  # deferred: importing codl_tvm.runtime loads no TVM library (see load)

    return tvm_ffi.get_global_func(name)


def load(
    platform: str | None = None,
    device: int | None = None,
    svm: str | None = None,
    program_cache_dir: str | os.PathLike | None = None,
) -> str:
    """Build (first time only) and load the OpenCL runtime plugin; return the library path.

    Idempotent. Selection arguments apply only before the first OpenCL use in the process;
    asking for a different selection afterwards raises.

    Parameters
    ----------
    platform
        Part of the OpenCL platform's name or vendor, or a short name (``pocl``, ``intel``,
        ``nvidia``, ...); default ``CODL_OPENCL_PLATFORM`` or the first platform whose devices
        build a test kernel.
    device
        Index of the single device to use; default ``CODL_OPENCL_DEVICE`` or all devices.
    svm
        ``"fine"``, ``"coarse"`` or ``"buffer"`` to force an allocation mode (tests, debugging).
    program_cache_dir
        Directory of cached program binaries; ``""`` disables the disk cache.
    """
    global _loaded_path
    with _lock:
        if _loaded_path is None:
            _build.register_pip_opencl_drivers(default_cache_dir())
            icd = _build.pyopencl_icd_loader()
            path = os.environ.get("CODL_TVM_PLUGIN_LIB") or _build.build_plugin()
            _build.load_library(path)
            if icd:
                plugin_function("codl.opencl.set_library_path")(icd)
            _loaded_path = path
        first = not _configured[0]
        _configured[0] = True
    explicit = any(v is not None for v in (platform, device, svm, program_cache_dir))
    if not first and not explicit:
        return _loaded_path
    if platform is None:
        platform = os.environ.get("CODL_OPENCL_PLATFORM", "")
    if device is None:
        env_dev = os.environ.get("CODL_OPENCL_DEVICE", "")
        device = int(env_dev) if env_dev.strip() else -1
    if svm is None:
        svm = os.environ.get("CODL_OPENCL_SVM", "")
    if svm not in ("", "fine", "coarse", "buffer"):
        raise ValueError(f"svm must be 'fine', 'coarse' or 'buffer', not {svm!r}")
    if program_cache_dir is None:
        if os.environ.get("CODL_OPENCL_PROGRAM_CACHE", "1").lower() in ("0", "off", "false"):
            program_cache_dir = ""
        else:
            program_cache_dir = default_cache_dir() / "opencl-programs"
    plugin_function("codl.opencl.configure")(platform, device, svm, str(program_cache_dir))
    return _loaded_path


def is_available() -> bool:
    """Whether an OpenCL device can be used (loads the plugin; never raises)."""
    try:
        load()
        info()
    except Exception:
        return False
    return True


def info() -> OpenCLInfo:
    """Describe the platform, devices and SVM mode in use (initialises OpenCL)."""
    load()
    raw = json.loads(plugin_function("codl.opencl.info")())
    devices = tuple(DeviceInfo(**d) for d in raw.pop("devices"))
    skipped = tuple(raw.pop("skipped_platforms"))
    return OpenCLInfo(devices=devices, skipped_platforms=skipped, **raw)


def start_context() -> threading.Thread:
    """Create the OpenCL context and queues (:func:`info`) on a thread, so that it overlaps
    what the caller does next, typically loading a library (TVM's calls release the GIL, and
    the plugin initialises its workspace once, under a lock, whichever thread comes first).
    Join the returned thread before the process may exit. An error is not raised here: the
    caller's next OpenCL call meets it and raises it with its own context.
    """

    def create() -> None:
        with contextlib.suppress(Exception):  # raised again by the caller's next OpenCL call
            info()

    thread = threading.Thread(target=create, name="codl-opencl-context", daemon=True)
    thread.start()
    return thread


def svm_mode() -> str:
    """The allocation mode: ``"fine"``, ``"coarse"`` (map/unmap) or ``"buffer"`` (copies)."""
    return info().svm_mode


def cache_stats() -> dict[str, int]:
    """Program-cache counters: source builds, binary loads, disk hits, writes and errors; the
    ahead-of-time binaries' loads, fallbacks, corrupt and rejected files and exports; and
    ``build_ns``, the time spent creating programs (summed over threads)."""
    load()
    return json.loads(plugin_function("codl.opencl.cache_stats")())


def buffer_stats() -> dict[str, int]:
    """Buffer mode (devices without SVM): ``host_maps`` (buffers mapped for the CPU),
    ``sub_buffers`` (byte-offset views given to kernels as sub-buffers) and ``staged_views``
    (views at offsets the device cannot align a sub-buffer to, run on a temporary copy)."""
    load()
    return json.loads(plugin_function("codl.opencl.buffer_stats")())


def describe_svm_mode(mode: str) -> str:
    """How OpenCL tensors are shared with the CPU in allocation mode ``mode``, in words (what
    ``codl-tvm info`` and ``deploy`` print)."""
    return {
        "fine": "fine-grained SVM (no maps)",
        "coarse": "coarse-grained SVM (mapped around GPU use)",
        "buffer": "buffer (host-mapped, no SVM)",
    }.get(mode, mode)


def add_program_binary_dir(path: str | os.PathLike) -> None:
    """Offer the ahead-of-time program binaries in ``path`` (an artifact's ``program_binaries``)
    to every later program creation. A binary is used only where its name, the program cache's
    key (source, device, driver, options), matches and its hash checks; otherwise the kernel is
    built as before (counted in :func:`cache_stats` as ``aot_fallbacks``, ``aot_corrupt``,
    ``aot_rejected``)."""
    load()
    plugin_function("codl.opencl.add_binary_dir")(str(path))


@contextlib.contextmanager
def exporting_program_binaries(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, write the binary of every program created (built, cached or not) to
    ``path``, named by its cache key and with its hash (what :func:`add_program_binary_dir`
    reads)."""
    load()
    plugin_function("codl.opencl.set_binary_export_dir")(str(path))
    try:
        yield
    finally:
        plugin_function("codl.opencl.set_binary_export_dir")("")


def build_programs(module, device: int = 0, threads: int = 1, wait: bool = True) -> None:
    """Create the programs of every kernel of the OpenCL ``module`` on OpenCL device
    ``device`` with ``threads`` threads. With ``wait`` False it returns at once: the programs
    are created while the caller goes on, and each kernel's first launch waits for its own
    program only (one lock per kernel)."""
    load()
    plugin_function("codl.opencl.build_programs")(module, device, threads, wait)


def workspace_stats() -> dict[str, int]:
    """Kernel workspaces (temporaries TVM allocates around each call, e.g. split-K partial
    sums): ``workspace_allocs`` made, ``workspace_reuses`` served from the pool, and
    ``workspace_bytes`` the pool holds."""
    load()
    return json.loads(plugin_function("codl.opencl.workspace_stats")())


def host_clock_ns() -> int:
    """Host ``CLOCK_MONOTONIC_RAW`` in ns, the time base PoCL's event timestamps use."""
    load()
    return int(plugin_function("codl.opencl.host_clock_ns")())


def cpu_view(tensor):
    """A CPU tensor over the same SVM bytes as an OpenCL ``tensor`` (no copy).

    The view keeps ``tensor`` alive. With coarse-grained SVM, bracket host access with
    :func:`svm_map` / :func:`svm_unmap`; finish queued GPU work before reading results. In buffer
    mode (no SVM) the view is over the buffer's host mapping, valid until the next GPU command.
    """
    load()
    return plugin_function("codl.opencl.cpu_view")(tensor)


def svm_map(tensor, write: bool = True) -> None:
    """Map a coarse-grained SVM tensor or a buffer (buffer mode) for host access (a no-op for
    fine-grained SVM)."""
    load()
    plugin_function("codl.opencl.svm_map")(tensor, write)


def svm_unmap(tensor) -> None:
    """Unmap a tensor mapped with :func:`svm_map` before the GPU uses it again."""
    load()
    plugin_function("codl.opencl.svm_unmap")(tensor)


@contextlib.contextmanager
def record_kernels() -> Iterator[list[KernelEvent]]:
    """Record every OpenCL kernel launched inside the ``with`` block.

    The yielded list is filled when the block exits (waiting for the kernels to finish).
    """
    load()
    events: list[KernelEvent] = []
    plugin_function("codl.opencl.record_start")()
    try:
        yield events
    finally:
        raw = json.loads(plugin_function("codl.opencl.record_stop")())
        events.extend(KernelEvent(**r) for r in raw)


_DTYPE_CODES = {"int": 0, "uint": 1, "float": 2, "handle": 3}


def _pack_type(type_str: str) -> bytes:
    if type_str == "handle":
        return struct.pack("<BBH", 3, 64, 1)
    for prefix, code in _DTYPE_CODES.items():
        if type_str.startswith(prefix) and type_str[len(prefix) :].isdigit():
            return struct.pack("<BBH", code, int(type_str[len(prefix) :]), 1)
    raise ValueError(f"unsupported OpenCL kernel argument type {type_str!r}")


def _pack_str(s: str | bytes) -> bytes:
    data = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(data)) + data


def opencl_module_from_source(
    source: str, functions: Mapping[str, tuple[Sequence[str], Sequence[str]]]
):
    """Create an OpenCL module from hand-written OpenCL C, through TVM's module format.

    Parameters
    ----------
    source
        OpenCL C source holding every kernel named in ``functions``.
    functions
        Kernel name -> (argument types, launch tags). Argument types are ``"handle"`` (a tensor
        data pointer) or scalars like ``"int32"``/``"float32"``; launch tags are TVM's, e.g.
        ``("blockIdx.x", "threadIdx.x")``: the call then takes one int per tag after the
        arguments and launches grid x block work-items per dimension.

    Returns
    -------
    tvm.runtime.Module
        A module whose functions launch the kernels on the current OpenCL device.
    """
    load()
    blob = _pack_str("cl") + struct.pack("<Q", len(functions))
    for name, (arg_types, tags) in functions.items():
        blob += _pack_str(name) + _pack_str(name) + struct.pack("<Q", len(arg_types))
        blob += b"".join(_pack_type(t) for t in arg_types)
        blob += struct.pack("<Q", len(tags)) + b"".join(_pack_str(t) for t in tags)
        blob += struct.pack("<Q", 0)
    blob += _pack_str(source)
    return plugin_function("ffi.Module.load_from_bytes.opencl")(blob)


# The plugin's message for a kernel that does not compile (opencl_plugin.cc, BuildProgram).
_CL_BUILD_FAILURE = re.compile(
    r"clBuildProgram failed: (?P<code>\S+).*?: kernel (?P<kernel>\S+) on '(?P<device>[^']*)'; "
    r"build log:\n(?P<log>.*)",
    re.S,
)
_LOG_LINES = 3  # build-log lines quoted in the one-line message (the rest goes to the file)


def log_dir() -> Path:
    """Where codl-tvm writes the full logs of failed builds (``logs`` under the cache root)."""
    return default_cache_dir() / "logs"


def _write_log(text: str, kind: str) -> Path:
    folder = log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(text)
    return path


def _first_lines(log: str, n: int = _LOG_LINES) -> str:
    """The build log's error lines (or its first lines), joined on one line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    lines = [ln for ln in lines if ln not in ("Compilation started", "Compilation failed")]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return " | ".join((errors or lines)[:n]) or "<empty build log>"


@contextlib.contextmanager
def build_errors(model: str, device: str) -> Iterator[None]:
    """Raise a failure inside the block (a pass, TVM's compiler, exporting the library, or a
    first run, where OpenCL kernels are compiled) as :func:`build_error`'s one-line error; the
    original stays its ``__cause__``, and the project's own errors pass unchanged.

    A Ctrl-C inside the block stays a ``KeyboardInterrupt``, also where TVM's FFI turned it
    into another error (:func:`codl_tvm.core.interrupts.is_interrupt`) or code inside caught
    it as a failure and went on (raised when the block ends)."""
    with watching_sigint():
        before = sigint_count()
        try:
            yield
        except Exception as exc:
            if is_interrupt(exc, before):
                raise KeyboardInterrupt from exc
            err = build_error(exc, model, device)
            if err is exc:
                raise
            raise err from exc
        # Code between here and the SIGINT may have caught the interrupt as an ordinary
        # failure (a schedule rule that declines on any error): stop now all the same.
        if sigint_count() > before:
            raise KeyboardInterrupt


def build_error(exc: BaseException, model: str, device: str) -> CodlError:
    """The one-line error for a build (or a first run, where OpenCL kernels are compiled) of
    ``model`` for ``device`` that failed with ``exc``.

    An OpenCL kernel that does not compile is named with its device and the build log's first
    error lines; any other failure (a pass, TVM's code generation) with its exception. The full
    text (the whole build log, or the traceback) goes to a file under :func:`log_dir`, whose
    path the message ends with. A :class:`~codl_tvm.core.errors.CodlError` is returned unchanged.
    """
    if isinstance(exc, CodlError):
        return exc
    text = str(exc)
    m = _CL_BUILD_FAILURE.search(text)
    if m:
        path = _write_log(m["log"], "opencl-build")
        return BuildError(
            f"{model}: OpenCL kernel {m['kernel']} does not compile on '{m['device']}' "
            f"({m['code']}): {_first_lines(m['log'])}; full build log: {path}"
        )
    full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    path = _write_log(full, "build")
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return BuildError(
        f"{model}: building for {device} failed: {type(exc).__name__}: {first[:300]}; "
        f"full error: {path}"
    )
