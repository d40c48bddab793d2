"""``codl-tvm serve --tracker HOST:PORT --key KEY [--opencl]``: the RPC server a board runs.

Starts TVM's RPC server registered with the tracker under the key, answering codl-tvm's version
report and, with ``--opencl``, serving codl-tvm's OpenCL plugin (:mod:`codl_tvm.rpc.server`),
until it is stopped (Ctrl-C). ``codl-tvm deploy`` and ``codl-tvm profile --farm`` on the
workstation then find the board through the tracker.

This module imports nothing of codl-tvm but :mod:`codl_tvm.rpc.server` and
:mod:`codl_tvm.core.errors`, so a board with a minimal copy of the package
(``scripts/emulated_aarch64.py`` copies ``core``, ``runtime`` and ``rpc`` beside this file)
runs it as a script: ``python serve.py --tracker HOST:PORT --key KEY`` (:func:`main`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from codl_tvm.core.errors import CliError, CodlError
from codl_tvm.rpc.server import start_server

__all__ = ["add_arguments", "cmd_serve", "main", "register"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``codl-tvm serve``."""
    p.add_argument("--tracker", required=True, help="HOST:PORT of the TVM RPC tracker")
    p.add_argument("--key", required=True, help="device key to register under (e.g. rk3588)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (0.0.0.0 to be reachable from other machines)",
    )
    p.add_argument("--port", type=int, default=9090, help="first port to try")
    p.add_argument("--port-end", type=int, help="last port to try (default: --port + 100)")
    p.add_argument(
        "--opencl",
        action="store_true",
        help="load codl-tvm's OpenCL plugin (CODL_TVM_PLUGIN_LIB, one uploaded earlier, or built "
        "here) so that OpenCL and co-executed models run",
    )
    p.add_argument("--silent", action="store_true", help="hide TVM's server messages")
    p.add_argument(
        "--plugin-dir", help="where uploaded OpenCL plugins are kept (default: codl-tvm's cache)"
    )
    p.add_argument(
        "--python",
        help="interpreter for the server's worker processes (sets sys.executable; the emulated "
        "aarch64 device runs its workers under qemu this way)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until it is stopped."""
    if args.python:
        sys.executable = args.python
    try:
        server = start_server(
            args.tracker,
            args.key,
            args.host,
            args.port,
            args.port_end,
            args.opencl,
            args.silent,
            args.plugin_dir,
        )
    except ValueError as exc:  # a tracker that is not HOST:PORT
        raise CliError(f"--tracker: {exc}") from None
    print(
        f"codl-tvm RPC server on {args.host}:{server.port}, key '{args.key}', tracker "
        f"{args.tracker}" + (" (OpenCL plugin)" if args.opencl else ""),
        flush=True,
    )
    try:
        server.proc.join()
    finally:
        server.terminate()  # also on Ctrl-C: the server's process does not outlive the command
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "serve",
        help="on a board: the RPC server that `deploy` and `profile --farm` talk to",
        description="Run TVM's RPC server registered with a tracker, reporting its versions and "
        "(--opencl) serving codl-tvm's OpenCL plugin. `python -m tvm.exec.query_rpc_tracker` "
        "lists what a tracker holds.",
    )
    add_arguments(p)


def main(argv: list[str] | None = None) -> int:
    """``codl-tvm serve`` alone, for a board that has only the RPC part of codl-tvm."""
    parser = argparse.ArgumentParser(prog="codl-tvm serve", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return cmd_serve(args)
    except CodlError as exc:
        print(f"codl-tvm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("codl-tvm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
