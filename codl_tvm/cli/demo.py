"""``codl-tvm demo``: the planner's decision for the bundled CNN, then the same model
co-executed with a fixed split, both checked, timed and the co-executed one traced.

The work is :func:`codl_tvm.demo.run_demo`; this module maps the flags onto
:class:`~codl_tvm.demo.DemoOptions` and prints the result.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from codl_tvm.cli.common import building
from codl_tvm.demo import DemoOptions, run_demo
from codl_tvm.frontend.models import bundled_model_path

__all__ = ["cmd_demo", "register"]


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo and print its summary; exit status 1 when a build disagrees with the
    unpartitioned model."""
    options = DemoOptions(
        cost_model=args.cost_model,
        dim=args.dim or "H",
        ratio=0.5 if args.ratio is None else args.ratio,
        output=Path(args.output) if args.output else None,
        force=args.force,
        trace=Path(args.trace) if args.trace else None,
        seed=args.seed,
    )
    with building(options.model or bundled_model_path(), "coexec"):
        result = run_demo(options)
    print("\n".join(result.lines()))
    return 0 if result.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``demo`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "demo", help="plan, build, co-execute and check the bundled CNN on this machine"
    )
    p.add_argument("--cost-model", help="cost model JSON (default: the shipped one)")
    p.add_argument(
        "--dim", choices=("H", "OC"), help="the co-executed build's split dimension (default H)"
    )
    p.add_argument(
        "--ratio", type=float, help="GPU share of every split operator (default 0.5, in (0, 1))"
    )
    p.add_argument(
        "-o", "--output", help="write both artifacts and the timeline here (default: a temp dir)"
    )
    p.add_argument("--force", action="store_true", help="replace an earlier demo in --output")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="write the Chrome trace JSON here (its PNG timeline beside it)")
    p.set_defaults(func=cmd_demo)
