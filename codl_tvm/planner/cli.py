"""``codl-tvm plan MODEL.onnx --cost-model M.json [--mode MODE] [-o PLAN.json] [--report R.json]``.

Prints the plan report table. A cost model is required: the cost-model package has no unfitted
default (a ``CodlModel`` predicts only after ``fit``, its presets fix the blocking but not the
coefficients), so there is nothing honest to plan with before a model is fitted on measurements
(``codl-tvm cost-model fit``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["cmd_plan", "register_cli"]

_NO_MODEL = (
    "plan: --cost-model M.json is required: the cost-model package has no unfitted default "
    "model (CodlModel presets fix the blocking, not the coefficients). Fit one on measured "
    "latencies with `codl-tvm cost-model fit DATA.jsonl -o M.json`"
)


def _error(message: str) -> Exception:
    from codl_tvm.cli import CliError

    return CliError(message)


def weight_gbps(text: str) -> tuple[float, float]:
    """``--weight-gbps CPU,GPU``: two positive rates in GB/s."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 2 or not all(v > 0 and v != float("inf") for v in values):
        raise argparse.ArgumentTypeError(
            f"--weight-gbps {text!r}: expected two positive rates in GB/s, CPU,GPU (e.g. 22,34)"
        )
    return values


WEIGHT_GBPS_HELP = (
    "CPU,GPU: predict every part (and whole operator) no faster than its float32 weights' "
    "bytes over these in-model streaming rates (GB/s; scripts/plan_vs_timeline.py measures "
    "them from timelines). Default: off"
)


def _ratios(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ratios {text!r}: expected numbers like 0,0.25,0.5")
    if not values:
        raise argparse.ArgumentTypeError("--ratios: give at least one ratio")
    return values


def cmd_plan(args: argparse.Namespace) -> int:
    from codl_tvm.cost_model.base import ModelFileError, load_model
    from codl_tvm.frontend import load_onnx
    from codl_tvm.plan import PlanError
    from codl_tvm.planner.search import PlannerConfig, PlannerError, plan_model

    if not args.cost_model:
        raise _error(_NO_MODEL)
    if not Path(args.model).is_file():
        raise _error(f"plan: {args.model}: no such model file")
    settings = {
        "ratios": args.ratios or PlannerConfig().ratios,
        "chain_delta": args.chain_delta,
        "max_chain_len": args.max_chain_len,
        "min_gain_ms": args.min_gain_ms,
        "chain_min_gain": args.chain_min_gain,
        "weight_gbps": args.weight_gbps,
    }
    try:
        cost_model = load_model(args.cost_model)
        model = load_onnx(args.model)
        if args.preset:
            # the kernels `compile --preset P` builds (Winograd, packed, CPU-alone settings)
            from codl_tvm.artifact import planning_context
            from codl_tvm.targets import PRESETS

            if args.preset not in PRESETS:
                raise _error(
                    f"plan: unknown target preset {args.preset!r}; valid presets: "
                    f"{', '.join(PRESETS)}"
                )
            with planning_context(args.preset, args.cost_model, **settings) as config:
                plan, report = plan_model(model.mod, cost_model, args.mode, config, str(args.model))
        else:
            config = PlannerConfig(**settings)
            plan, report = plan_model(model.mod, cost_model, args.mode, config, str(args.model))
    except (ModelFileError, PlannerError, PlanError) as exc:
        raise _error(f"plan: {exc}") from None
    print(report.table())
    if args.output:
        plan.save(args.output)
        print(f"wrote plan {args.output}")
    if args.report:
        report.save(args.report)
        print(f"wrote report {args.report}")
    return 0


def register_cli(subparsers) -> None:
    """Add ``plan`` to an argparse subparsers object."""
    from codl_tvm.planner.search import MODES, PlannerConfig

    p = subparsers.add_parser(
        "plan", help="plan the CPU+GPU co-execution of an ONNX model with a cost model"
    )
    p.add_argument("model", help="ONNX model with static shapes")
    p.add_argument("--cost-model", help="fitted cost model file (.json); required")
    p.add_argument("--mode", choices=MODES, default="codl", help="planner or baseline")
    p.add_argument(
        "--preset",
        help="predict the kernels `codl-tvm compile --preset P` builds (Winograd, packed convs, "
        "the CPU-alone kernels of a model profiled with them); default: direct/GEMM kernels",
    )
    p.add_argument("-o", "--output", help="write the plan (JSON) here")
    p.add_argument("--report", help="write the plan report (JSON) here")
    p.add_argument(
        "--ratios", type=_ratios, help="GPU shares to try, comma-separated (default 0,0.1,...,1)"
    )
    p.add_argument("--chain-delta", type=float, default=0.3, help="chain rho search radius")
    p.add_argument("--max-chain-len", type=int, default=8, help="longest chain tried")
    p.add_argument(
        "--min-gain-ms", type=float, default=0.0, help="least predicted gain to split or chain"
    )
    p.add_argument(
        "--chain-min-gain",
        type=float,
        default=PlannerConfig.chain_min_gain,
        help="least predicted gain of a chain, as a fraction of its operators planned one by "
        "one (default %(default)s; 0: CoDL's Algorithm 1 as published)",
    )
    p.add_argument("--weight-gbps", type=weight_gbps, metavar="CPU,GPU", help=WEIGHT_GBPS_HELP)
    p.set_defaults(func=cmd_plan)
