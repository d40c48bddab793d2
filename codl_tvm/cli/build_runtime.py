"""``codl-tvm build-runtime [--target T] -o DIR``: build the OpenCL runtime plugin for a device.

``--target host`` (the default) builds for this machine, as first use does; ``linux-arm64``
cross-builds for aarch64 Linux boards (Debian's ``g++-aarch64-linux-gnu``, or clang with
``--sysroot``); ``android-arm64`` uses the NDK given by ``--ndk``. The library and a JSON
description go to ``DIR`` (:func:`codl_tvm.runtime.plugin_build.cross_build_plugin`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from codl_tvm.core.errors import CliError
from codl_tvm.runtime import plugin_build as _build

__all__ = ["cmd_build_runtime", "register"]

TARGETS = ("host", *_build.CROSS_TARGETS)


def _check_out_dir(out_dir: Path, force: bool) -> Path:
    """The plugin's path in ``out_dir``, refused when a file would be overwritten without
    ``--force``."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"-o {out_dir}: exists and is not a directory")
    lib = out_dir / _build.PLUGIN_NAME
    if lib.exists() and not force:
        raise CliError(f"-o {out_dir}: {lib.name} exists; pass --force to overwrite it")
    return lib


def cmd_build_runtime(args: argparse.Namespace) -> int:
    """Build the plugin and print where it is and what it is for."""
    out_dir = Path(args.output).expanduser()
    lib = _check_out_dir(out_dir, args.force)
    if args.target == "host":
        if args.ndk or args.sysroot or args.cxx or args.tvm_lib_dir:
            raise CliError("--ndk/--sysroot/--cxx/--tvm-lib-dir apply to cross targets only")
        out_dir.mkdir(parents=True, exist_ok=True)
        built = _build.build_plugin()
        shutil.copyfile(built, lib)
        info = _build.plugin_description(lib)
        Path(str(lib) + ".json").write_text(json.dumps({"target": "host", **info}, indent=1))
    else:
        if args.ndk and args.target != "android-arm64":
            raise CliError(f"--ndk applies to --target android-arm64, not {args.target}")
        lib = _build.cross_build_plugin(
            args.target,
            out_dir,
            ndk=args.ndk,
            sysroot=args.sysroot,
            cxx=args.cxx,
            android_api=args.android_api,
            tvm_lib_dir=args.tvm_lib_dir,
        )
        info = _build.plugin_description(lib)
    print(f"built {lib} ({info.get('machine')}, TVM {info.get('tvm')}, {args.target})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``build-runtime`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "build-runtime",
        help="build the OpenCL runtime plugin for this machine, an aarch64 board or Android",
        description="Build codl-tvm's OpenCL runtime plugin (libcodl_tvm_opencl.so) for a "
        "device, with a JSON description beside it.",
    )
    p.add_argument("--target", choices=TARGETS, default="host", help="machine to build for")
    p.add_argument("-o", "--output", required=True, help="directory to write the plugin to")
    p.add_argument("--ndk", help="Android NDK root (--target android-arm64)")
    p.add_argument(
        "--android-api",
        type=int,
        default=_build.DEFAULT_ANDROID_API,
        help="Android API level to build for",
    )
    p.add_argument("--sysroot", help="arm64 root for clang (linux-arm64; default: cross g++)")
    p.add_argument("--cxx", help="C++ compiler to use instead (linux-arm64)")
    p.add_argument(
        "--tvm-lib-dir",
        help="the device's TVM libraries (libtvm_ffi.so, libtvm_runtime.so) to link against, "
        "for preloading the plugin into TVM's C++ tvm_rpc (Android)",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing plugin")
    p.set_defaults(func=cmd_build_runtime)
