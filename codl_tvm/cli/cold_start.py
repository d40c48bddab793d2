"""``codl-tvm cold-start ARTIFACT/``: one first inference in a fresh process, step by step.

Drops the artifact's files from the page cache, gives a fresh process empty program caches and
times each phase of its first inference (:func:`codl_tvm.profiling.cold_start.run_cold_start`;
the phases are described in :mod:`codl_tvm.profiling.cold_start`). Prints one line per phase,
or the whole report as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from codl_tvm.cli.common import check_output_file
from codl_tvm.core.errors import CliError
from codl_tvm.profiling.cold_start import MODES, NOT_COLD, cold_ms, run_cold_start
from codl_tvm.runtime.artifact import MANIFEST

__all__ = ["cmd_cold_start", "register"]


def cmd_cold_start(args: argparse.Namespace) -> int:
    """Measure one cold start and print its phases."""
    if not (Path(args.artifact) / MANIFEST).is_file():
        raise CliError(f"{args.artifact}: no {MANIFEST}; not a codl-tvm artifact directory")
    if args.warm < 0:
        raise CliError(f"--warm {args.warm}: give 0 or more warm runs")
    check_output_file(args.save, args.force, "--save")
    modes = {name: getattr(args, name) for name in MODES}
    with tempfile.TemporaryDirectory(prefix="codl-cold-") as scratch:
        try:
            report = run_cold_start(
                args.artifact,
                modes,
                warm=args.warm,
                save=args.save,
                evict_files=not args.no_evict,
                scratch=None if args.keep_caches else scratch,
            )
        except RuntimeError as exc:  # the measured process failed: its last line says why
            raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"cold start of {args.artifact} ({report['device']}), phases in time order:")
    for name, ms in report["phases_ms"].items():
        faults = report["counters"][name]["major_faults"]
        note = "  (not cold inference)" if name in NOT_COLD else ""
        print(f"  {name:18s} {ms:9.2f} ms  {faults:6d} major faults{note}")
    print(
        f"cold inference: {cold_ms(report['phases_ms']):.2f} ms (loading the model to its "
        "first output, past the libraries' import and the input's read)"
    )
    if report.get("max_abs_err") is not None:
        print(f"max abs difference against the artifact's reference: {report['max_abs_err']:.3g}")
    for i, ms in enumerate(report["warm_ms"], 1):
        print(f"warm run {i}: {ms:.2f} ms")
    if args.save:
        print(f"saved the first run's outputs to {args.save}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``cold-start`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "cold-start",
        help="measure one first inference in a fresh process, step by step",
        description="Drop the artifact's files from the page cache, start a fresh process with "
        "empty program caches and time each phase of its first inference (importing the "
        "libraries, reading the input, the OpenCL context, the weights, the OpenCL programs, "
        "the VM's set-up and the first run).",
    )
    p.add_argument("artifact", help="artifact directory (from `codl-tvm compile`)")
    p.add_argument(
        "--programs",
        choices=MODES["programs"],
        default="overlap",
        help="create the OpenCL programs at each kernel's first launch (lazy), all before the "
        "run (sequential) or on threads during it (overlap)",
    )
    p.add_argument(
        "--weights",
        choices=MODES["weights"],
        default="overlap",
        help="weights beside the library: load them during the first run or before it",
    )
    p.add_argument(
        "--context",
        choices=MODES["context"],
        default="overlap",
        help="create the OpenCL context while the library loads, or before it",
    )
    p.add_argument(
        "--pool",
        choices=MODES["pool"],
        default="overlap",
        help="start TVM's thread pool while the library loads, or in the first run",
    )
    p.add_argument("--warm", type=int, default=0, help="warm runs after the first (timed)")
    p.add_argument("--save", help=".npz to write the first run's outputs to")
    p.add_argument("--force", action="store_true", help="overwrite --save's file")
    p.add_argument(
        "--no-evict", action="store_true", help="leave the artifact's files in the page cache"
    )
    p.add_argument(
        "--keep-caches",
        action="store_true",
        help="use this environment's program caches instead of empty ones",
    )
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(func=cmd_cold_start)
