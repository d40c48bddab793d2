#!/usr/bin/env python3
"""An emulated aarch64 device for codl-tvm's RPC tests: TVM's RPC server under qemu-user.

``prepare`` builds an aarch64 root (no chroot, binfmt or debootstrap needed):

1. Debian's arm64 ``python3``, ``libstdc++6`` and ``libgcc-s1`` with their dependencies, fetched by
   the host's apt with a private configuration (``APT::Architecture "arm64"``, its own lists,
   cache and status) and unpacked with ``dpkg -x``;
2. PyPI's aarch64 wheels of apache-tvm (this machine's version), tornado, cloudpickle and psutil,
   downloaded with ``pip download --platform`` and installed with ``pip install --target`` into
   the root's ``dist-packages``; TVM's compiler library is removed (runtime-only, faster import);
3. ``bin/python-aarch64``: a wrapper running the root's Python with ``qemu-aarch64-static -L``.

``serve`` (prepares first when needed) starts ``codl-tvm serve`` (``codl_tvm/cli/serve.py`` run
as a script beside a minimal ``codl_tvm``: TVM's RPC server that reports its versions) under
that Python, registered with a tracker on 127.0.0.1, and waits until the tracker lists it.
TVM's server re-executes ``sys.executable`` for its workers; the wrapper is passed as that
executable because without binfmt an aarch64 binary cannot be exec'ed. ``stop`` ends a server
this script started. Each step is skipped when already done.

``--opencl`` adds an OpenCL device: Debian's arm64 PoCL (``pocl-opencl-icd``, its CPU
``pthread`` device, which offers fine-grained SVM) and g++-12 (for building the plugin on the
device: ``serve --opencl --no-plugin --env CXX=g++-12``) unpacked into the same root, and codl-tvm's
OpenCL plugin cross-built on the host (``codl-tvm build-runtime --target linux-arm64``). PoCL
runs helper programs (its kernel compiler links with ``ld``), which an aarch64 process can only
start through binfmt_misc: the server then runs in a chroot of the root, with binfmt_misc
mounted and qemu-aarch64 registered (as root), and ``/proc``, ``/sys`` and ``/dev`` bound into
the root (hwloc reads the CPU topology there). ``--no-plugin`` starts it without the plugin
(clients upload one); uploaded plugins are kept in a directory emptied at each such start.

Host requirements are installed with apt-get when missing and running as root:
qemu-user-static, plus clang and lld for cross-linking model libraries. Only Debian/Ubuntu hosts
with apt are supported.

Examples::

    python scripts/emulated_aarch64.py prepare
    python scripts/emulated_aarch64.py serve --tracker 127.0.0.1:9190 --key aarch64-emu
    python scripts/emulated_aarch64.py stop --port 9300
    sudo python scripts/emulated_aarch64.py serve --opencl --key aarch64-emu-cl --port 9301
    sudo python scripts/emulated_aarch64.py serve --opencl --no-plugin --env CXX=g++-12 ...

``stop`` unmounts what ``--opencl`` bound into the root once no server of the root is left.

The root lives in ``--root`` (default ``$CODL_TVM_AARCH64_ROOT`` or
``~/.cache/codl-tvm/aarch64-emu``, holding the aarch64 ``sysroot``, the wrapper and logs).
Every step has a time limit (``--timeout`` seconds) and fails
with a message naming the step.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

DEBS = ("python3", "libstdc++6", "libgcc-s1")
WHEELS = ("tornado", "cloudpickle", "psutil")
# PoCL, and what building the plugin on the device itself needs (tvm_ffi's build runs ninja,
# which runs its commands with /bin/sh); the compiler is named g++-12 only, so a server builds
# with it only when told (CXX=g++-12), as a board with g++ would on first use
OPENCL_DEBS = ("pocl-opencl-icd", "ocl-icd-libopencl1", "g++-12", "ninja-build", "dash")
HOST_PACKAGES = {
    "qemu-aarch64-static": "qemu-user-static",
    "clang": "clang",
    "ld.lld": "lld",
    "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
}
BASE_TOOLS = ("qemu-aarch64-static", "clang", "ld.lld")
#: Inside the root: the server script, its package and the plugin.
CODL_DIR = "opt/codl-tvm"
PLUGIN = "libcodl_tvm_opencl.so"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
#: Bound into the chroot for PoCL: /proc (its own mount), /sys (hwloc), /dev (/dev/null, urandom).
CHROOT_MOUNTS = ("proc", "sys", "dev")
STAMP = ".codl-tvm-ready.json"
REPO = Path(__file__).resolve().parent.parent


class StepError(RuntimeError):
    """A preparation or start-up step failed; the message names it."""


def say(msg: str) -> None:
    print(f"[emulated-aarch64] {msg}", flush=True)


def default_root() -> Path:
    env = os.environ.get("CODL_TVM_AARCH64_ROOT")
    if env:
        return Path(env).expanduser()
    cache = Path(os.environ.get("CODL_TVM_CACHE_DIR", Path.home() / ".cache" / "codl-tvm"))
    return cache.expanduser() / "aarch64-emu"


def run(
    cmd: list[str],
    step: str,
    timeout_s: float,
    env: dict | None = None,
    quiet: bool = True,
    announce: bool = True,
) -> str:
    if announce:
        say(f"{step}: {' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}")
    try:
        proc = subprocess.run(
            cmd,
            capture_output=quiet,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        raise StepError(f"{step}: timed out after {timeout_s:g} s") from None
    except FileNotFoundError as exc:
        raise StepError(f"{step}: {exc}") from None
    if proc.returncode != 0:
        tail = ((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()[-15:]
        raise StepError(f"{step}: exit status {proc.returncode}\n" + "\n".join(tail))
    return proc.stdout or ""


def tvm_version() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import tvm; print(tvm.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise StepError(f"cannot import tvm with {sys.executable}: {out.stderr.strip()[-300:]}")
    return out.stdout.strip().splitlines()[-1]


def ensure_host_tools(timeout_s: float, tools=tuple(HOST_PACKAGES)) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return
    pkgs = sorted({HOST_PACKAGES[t] for t in missing})
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StepError(
            f"missing host tools {missing}; install the Debian/Ubuntu packages "
            f"{pkgs} (apt-get install {' '.join(pkgs)})"
        )
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], "apt-get update", timeout_s, env)
    run(["apt-get", "install", "-y", "-qq", *pkgs], f"install {' '.join(pkgs)}", timeout_s, env)


def _source_files() -> list[str]:
    files = sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    files += sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    if Path("/etc/apt/sources.list").is_file():
        files.append("/etc/apt/sources.list")
    return files


def fetch_debs(work: Path, root: Path, timeout_s: float, debs: tuple[str, ...] = DEBS) -> None:
    """Download the arm64 Debian packages with a private apt configuration and unpack them."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise StepError("the aarch64 root needs apt-get and dpkg (Debian/Ubuntu hosts only)")
    apt = work / "apt"
    for sub in ("lists/partial", "archives/partial", "sources.list.d", "etc"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    sources = _source_files()
    if not sources:
        raise StepError("no apt sources in /etc/apt; cannot download arm64 packages")
    for i, src in enumerate(sources):
        suffix = ".sources" if src.endswith(".sources") else ".list"
        shutil.copy(src, apt / "sources.list.d" / f"{i:02d}-{Path(src).stem}{suffix}")
    (apt / "status").write_text("")
    conf = apt / "apt.conf"
    conf.write_text(
        "\n".join(
            [
                'APT::Architecture "arm64";',
                'APT::Architectures { "arm64"; };',
                f'Dir::State "{apt}";',
                f'Dir::State::Lists "{apt}/lists";',
                f'Dir::State::status "{apt}/status";',
                f'Dir::Cache "{apt}";',
                f'Dir::Cache::archives "{apt}/archives";',
                f'Dir::Etc::SourceList "{apt}/none.list";',
                f'Dir::Etc::SourceParts "{apt}/sources.list.d";',
                'APT::Install-Recommends "false";',
                'Debug::NoLocking "true";',
                "",
            ]
        )
    )
    env = {"APT_CONFIG": str(conf), "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], "apt-get update (arm64 lists)", timeout_s, env)
    run(
        ["apt-get", "install", "-y", "-qq", "--download-only", *debs],
        f"download arm64 {' '.join(debs)}",
        timeout_s,
        env,
    )
    debs = sorted((apt / "archives").glob("*.deb"))
    if not debs:
        raise StepError("download arm64 packages: apt downloaded nothing")
    say(f"unpacking {len(debs)} arm64 packages into {root}")
    for deb in debs:
        run(["dpkg", "-x", str(deb), str(root)], f"dpkg -x {deb.name}", timeout_s, announce=False)


def root_python(root: Path) -> Path:
    found = sorted(root.glob("usr/bin/python3.[0-9]*"))
    found = [p for p in found if p.name.replace("python", "").replace(".", "").isdigit()]
    if not found:
        raise StepError(f"no python3.X in {root}/usr/bin; the root is incomplete (delete it)")
    return found[-1]


def install_wheels(work: Path, root: Path, py: Path, version: str, timeout_s: float) -> None:
    pyver = py.name.replace("python", "")
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platform_args = [
        "--only-binary=:all:",
        "--platform",
        "manylinux_2_28_aarch64",
        "--platform",
        "manylinux2014_aarch64",
        "--python-version",
        pyver,
        "--implementation",
        "cp",
    ]
    pkgs = [f"apache-tvm=={version}", *WHEELS]
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--dest",
            str(wheels),
            *platform_args,
            *pkgs,
        ],
        "pip download aarch64 wheels",
        timeout_s,
    )
    site = root / "usr" / "lib" / "python3" / "dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(wheels),
            "--target",
            str(site),
            "--upgrade",
            *platform_args,
            *pkgs,
        ],
        "pip install wheels into the root",
        timeout_s,
    )
    for lib in site.glob("tvm/lib/libtvm_compiler*.so"):
        say(f"removing {lib.name} (runtime-only TVM imports faster under emulation)")
        lib.unlink()


def write_wrapper(root: Path, py: Path) -> Path:
    wrapper = root.parent / "bin" / "python-aarch64"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    qemu = shutil.which("qemu-aarch64-static") or "qemu-aarch64-static"
    wrapper.write_text(f'#!/bin/sh\nexec "{qemu}" -L "{root}" "{py}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def install_server_script(root: Path) -> Path:
    """Copy ``codl-tvm serve`` into the sysroot with the minimal package it imports: the script
    (``codl_tvm/cli/serve.py``, run as ``serve.py``) beside a ``codl_tvm`` of ``core/``,
    ``runtime/`` (with the plugin's sources, for a server that builds the plugin on the device)
    and ``rpc/{client,server}.py``, which import nothing else of codl-tvm; returns the script's
    path."""
    codl = root / CODL_DIR
    src, dst = REPO / "codl_tvm", codl / "codl_tvm"
    shutil.rmtree(dst, ignore_errors=True)  # keep in step with the checkout, nothing stale
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("core", "runtime"):
        shutil.copytree(src / package, dst / package, ignore=ignore)
    (dst / "rpc").mkdir(parents=True)
    for name in ("__init__.py", "rpc/__init__.py", "rpc/client.py", "rpc/server.py"):
        shutil.copy(src / name, dst / name)
    script = codl / "serve.py"
    shutil.copy(src / "cli" / "serve.py", script)
    return script


def prepare(root: Path, timeout_s: float, force: bool = False, version: str | None = None) -> Path:
    """Build the aarch64 root if needed; return the Python wrapper.

    ``version`` is the apache-tvm version to install (default: this machine's); another one
    makes a device that the version check must refuse.
    """
    ensure_host_tools(timeout_s, BASE_TOOLS)
    version = version or tvm_version()
    stamp = root / STAMP
    if stamp.is_file() and not force:
        data = json.loads(stamp.read_text())
        if data.get("tvm") == version and Path(data.get("wrapper", "")).is_file():
            say(f"aarch64 root ready at {root} (TVM {version})")
            return Path(data["wrapper"])
        say(f"aarch64 root at {root} is for TVM {data.get('tvm')}; rebuilding for {version}")
    t0 = time.monotonic()
    if root.exists():
        unmount_chroot(root)
        shutil.rmtree(root)
    root.mkdir(parents=True)
    work = root.parent / "work"
    fetch_debs(work, root, timeout_s)
    py = root_python(root)
    install_wheels(work, root, py, version, timeout_s)
    wrapper = write_wrapper(root, py)
    install_server_script(root)
    out = run(
        [str(wrapper), "-c", "import platform, tvm; print(platform.machine(), tvm.__version__)"],
        "check: import tvm under qemu",
        timeout_s,
    )
    say(f"emulated python reports: {out.strip()}")
    if not out.strip().startswith("aarch64"):
        raise StepError(f"the emulated python reports {out.strip()!r}, expected aarch64")
    stamp.write_text(json.dumps({"tvm": version, "wrapper": str(wrapper)}))
    say(f"prepared {root} in {time.monotonic() - t0:.0f} s")
    return wrapper


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def unmount_chroot(root: Path) -> None:
    """Unmount what :func:`mount_chroot` bound into ``root`` (before deleting it)."""
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    left = _mounts_under(root)
    if left:
        raise StepError(f"cannot unmount {left} (unmount them before deleting {root})")


def mount_chroot(root: Path, timeout_s: float) -> None:
    """binfmt_misc with qemu-aarch64 registered, and /proc, /sys, /dev inside ``root``."""
    if os.geteuid() != 0:
        raise StepError("--opencl serving needs root (chroot, mounts, binfmt_misc)")
    if not (BINFMT / "register").exists():
        run(
            ["mount", "binfmt_misc", "-t", "binfmt_misc", str(BINFMT)],
            "mount binfmt_misc",
            timeout_s,
        )
    if not (BINFMT / "qemu-aarch64").exists():
        conf = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
        if not conf.is_file():
            raise StepError(f"{conf} is missing (install qemu-user-static)")
        # Flag F (in Debian's entry) opens the interpreter now, so it works inside the chroot.
        (BINFMT / "register").write_text(conf.read_text().strip() + "\n")
        say("registered qemu-aarch64 with binfmt_misc")
    mounted = set(_mounts_under(root))
    for name in CHROOT_MOUNTS:
        point = root / name
        point.mkdir(exist_ok=True)
        if str(point) in mounted:
            continue
        if name == "proc":
            cmd = ["mount", "-t", "proc", "proc", str(point)]
        else:
            cmd = ["mount", "--rbind", f"/{name}", str(point)]
        run(cmd, f"mount /{name} in the root", timeout_s)
        if name != "proc":
            run(["mount", "--make-rslave", str(point)], f"mount /{name} as slave", timeout_s)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)


def plugin_sha(lib: Path) -> str | None:
    side = Path(str(lib) + ".json")
    if not side.is_file():
        return None
    return json.loads(side.read_text()).get("sources_sha256")


def prepare_opencl(root: Path, timeout_s: float, force: bool = False) -> Path:
    """Add PoCL to the root and cross-build the plugin into it; return the plugin's path."""
    ensure_host_tools(timeout_s)
    stamp = root / STAMP
    data = json.loads(stamp.read_text())
    if data.get("opencl") != list(OPENCL_DEBS) or force:
        fetch_debs(root.parent / "work", root, timeout_s, (*DEBS, *OPENCL_DEBS))
        data["opencl"] = list(OPENCL_DEBS)
        stamp.write_text(json.dumps(data))
    out = root / CODL_DIR / "plugin"
    lib = out / PLUGIN
    want = subprocess.run(
        [
            sys.executable,
            "-c",
            "from codl_tvm.runtime import plugin_build; print(plugin_build.sources_sha256())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    if not lib.is_file() or plugin_sha(lib) != want or force:
        run(
            [
                sys.executable,
                "-m",
                "codl_tvm.cli",
                "build-runtime",
                "--target",
                "linux-arm64",
                "-o",
                str(out),
                "--force",
            ],
            "cross-build the OpenCL plugin for aarch64",
            timeout_s,
        )
    return lib


def _tracker_free(tracker: tuple[str, int], key: str, timeout_s: float) -> int | None:
    """Free devices of ``key`` (None when the tracker does not answer)."""
    try:
        with socket.create_connection(tracker, timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<i", 0x2F271))
            sock.recv(4)
            data = json.dumps([6]).encode()
            sock.sendall(struct.pack("<i", len(data)) + data)
            size = struct.unpack("<i", sock.recv(4))[0]
            buf = b""
            while len(buf) < size:
                chunk = sock.recv(size - len(buf))
                if not chunk:
                    return None
                buf += chunk
    except OSError:
        return None
    summary = json.loads(buf)[1]
    return int(summary.get("queue_info", {}).get(key, {}).get("free", 0))


def _pid_file(root: Path, port: int) -> Path:
    return root.parent / f"server-{port}.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def serve(
    root: Path,
    tracker: str,
    key: str,
    port: int,
    timeout_s: float,
    version: str | None = None,
    opencl: bool = False,
    plugin: bool = True,
    plugin_lib: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Start the emulated RPC server (once per port) and wait until the tracker lists it.

    ``opencl`` serves in a chroot with PoCL and (unless not ``plugin``) codl-tvm's plugin, the
    cross-built one or ``plugin_lib`` (copied into the root with its ``.json``); ``extra_env``
    is added to the server's environment (e.g. ``CODL_OPENCL_SVM=coarse``, ``POCL_DEBUG=1``).
    """
    host, _, tport = tracker.rpartition(":")
    if not host or not tport.isdigit():
        raise StepError(f"--tracker {tracker!r} is not HOST:PORT")
    addr = (host, int(tport))
    if _tracker_free(addr, key, 5.0) is None:
        raise StepError(
            f"no TVM RPC tracker answers at {tracker}; start one first "
            f"(python -m tvm.exec.rpc_tracker --host {host} --port {tport})"
        )
    pid_file = _pid_file(root, port)
    if pid_file.is_file():
        pid = int(pid_file.read_text().strip() or 0)
        if pid and _alive(pid):
            say(f"server already running (pid {pid}, port {port})")
            return pid
        pid_file.unlink()
    wrapper = prepare(root, timeout_s, version=version)
    before = _tracker_free(addr, key, 5.0) or 0
    log = root.parent / f"server-{port}.log"
    script = install_server_script(root)  # keep in step with the checkout
    env = dict(os.environ)
    if opencl:
        lib = prepare_opencl(root, timeout_s)
        mount_chroot(root, timeout_s)
        inside = "/" + CODL_DIR
        store = f"/tmp/codl-tvm-plugins-{port}"
        shutil.rmtree(root / store.lstrip("/"), ignore_errors=True)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "PYTHONPATH": inside,
            "CODL_TVM_EMULATED": "qemu-aarch64, PoCL pthread device",
        }
        env.update(extra_env or {})
        if plugin_lib is not None:
            own = root / CODL_DIR / f"plugin-{port}"
            own.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plugin_lib, own / PLUGIN)
            if Path(f"{plugin_lib}.json").is_file():
                shutil.copyfile(f"{plugin_lib}.json", own / f"{PLUGIN}.json")
            env["CODL_TVM_PLUGIN_LIB"] = f"{inside}/{own.name}/{PLUGIN}"
        elif plugin:
            env["CODL_TVM_PLUGIN_LIB"] = f"{inside}/plugin/{lib.name}"
        # the chroot's own python runs the server; binfmt starts its aarch64 workers
        chroot = shutil.which("chroot") or "/usr/sbin/chroot"
        prefix = [chroot, str(root), "/usr/bin/" + root_python(root).name]
        script_arg = f"{inside}/{script.name}"
        extra = ["--opencl", "--plugin-dir", store]
    else:
        prefix, script_arg, extra = [str(wrapper)], str(script), ["--python", str(wrapper)]
    cmd = [
        *prefix,
        script_arg,
        "--tracker",
        tracker,
        "--key",
        key,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--port-end",
        str(port + 1),
        *extra,
    ]
    what = "OpenCL (PoCL) " if opencl else ""
    say(f"starting the emulated {what}RPC server on 127.0.0.1:{port}, key '{key}' (log: {log})")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(root.parent),
            env=env,
        )
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-10:]
            raise StepError(
                f"the emulated server exited with status {proc.returncode}:\n" + "\n".join(tail)
            )
        free = _tracker_free(addr, key, 5.0)
        if free is not None and free > before:
            say(f"registered with the tracker {tracker} as '{key}' (pid {proc.pid})")
            return proc.pid
        time.sleep(0.5)
    stop(root, port)
    raise StepError(
        f"the emulated server did not register with {tracker} within {timeout_s:g} s (log: {log})"
    )


def _live_servers(root: Path) -> list[int]:
    pids = []
    for pid_file in root.parent.glob("server-*.pid"):
        text = pid_file.read_text().strip()
        if text.isdigit() and _alive(int(text)):
            pids.append(int(text))
    return pids


def stop(root: Path, port: int) -> bool:
    """End the server on ``port``; once none is left, unmount what ``--opencl`` bound into the
    root (a bound /dev or /sys inside a cache folder is a hazard for ``rm -rf``)."""
    pid_file = _pid_file(root, port)
    stopped = False
    if not pid_file.is_file():
        say(f"no server started by this script on port {port}")
    else:
        pid = int(pid_file.read_text().strip() or 0)
        pid_file.unlink()
        if pid and _alive(pid):
            say(f"stopping the server (process group {pid})")
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            stopped = True
    if root.is_dir() and _mounts_under(root) and not _live_servers(root):
        say(f"unmounting /proc, /sys and /dev from {root}")
        unmount_chroot(root)
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("prepare", "serve", "stop"))
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="directory of the emulated device: sysroot, wrapper, logs "
        "(default: $CODL_TVM_AARCH64_ROOT or ~/.cache/codl-tvm/aarch64-emu)",
    )
    parser.add_argument("--tracker", default="127.0.0.1:9190", help="tracker HOST:PORT")
    parser.add_argument("--key", default="aarch64-emu", help="device key to register under")
    parser.add_argument("--port", type=int, default=9300, help="server port")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds allowed per step (download, install, start-up)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild the root")
    parser.add_argument(
        "--opencl",
        action="store_true",
        help="add PoCL and codl-tvm's cross-built OpenCL plugin; serve in a chroot (root only)",
    )
    parser.add_argument(
        "--no-plugin",
        action="store_true",
        help="with --opencl: start without the plugin (clients upload one)",
    )
    parser.add_argument(
        "--plugin-lib",
        type=Path,
        default=None,
        help="with --opencl: load this plugin instead of the cross-built one",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --opencl: add to the server's environment (repeatable), e.g. "
        "CODL_OPENCL_SVM=coarse",
    )
    parser.add_argument(
        "--tvm-version",
        default=None,
        help="apache-tvm version for the device (default: this machine's); use another --root",
    )
    args = parser.parse_args(argv)
    root = (args.root or default_root()).expanduser().resolve() / "sysroot"
    bad = [e for e in args.env if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        parser.error(f"--env {bad[0]!r} is not NAME=VALUE")
    extra_env = dict(e.split("=", 1) for e in args.env)
    try:
        if args.command == "prepare":
            wrapper = prepare(root, args.timeout, args.force, args.tvm_version)
            if args.opencl:
                print(prepare_opencl(root, args.timeout, args.force))
            print(wrapper)
        elif args.command == "serve":
            serve(
                root,
                args.tracker,
                args.key,
                args.port,
                args.timeout,
                args.tvm_version,
                opencl=args.opencl,
                plugin=not args.no_plugin,
                plugin_lib=args.plugin_lib,
                extra_env=extra_env,
            )
        else:
            stop(root, args.port)
    except StepError as exc:
        print(f"[emulated-aarch64] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
