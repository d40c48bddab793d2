"""``codl-tvm plan MODEL.onnx [--cost-model M] [--preset P] [--mode MODE] [-o PLAN.json]
[--report R.json]``, and the ``--plan/--dim/--ratio`` flags that ``run`` and ``compile`` share.

``plan`` prints the plan report table: the decisions ``compile`` would build for the same preset
(default ``opencl``, this machine's OpenCL device and CPU) and cost model (default: the shipped
model for that preset; ``--cost-model`` takes a file or a shipped model's name). The cost model's
predictions describe the device it was fitted on; ``compile`` measures them where it can.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from codl_tvm.build.targets import PRESETS, get_preset
from codl_tvm.core.errors import CliError
from codl_tvm.core.plan import PlanError
from codl_tvm.cost_model.base import load_model
from codl_tvm.cost_model.defaults import cost_model_path
from codl_tvm.frontend.importer import OnnxModel, load_onnx
from codl_tvm.objectives.gpu_data import profiled_data_type
from codl_tvm.objectives.tune import tune_cache_dir, tune_operators, tune_unreachable
from codl_tvm.planner.placement.modes import ALL_MODES, PlacementConfig, make_plan
from codl_tvm.planner.policy import DEFAULT_PRESET, PlanChoice, planning_context, resolve_plan
from codl_tvm.planner.split.config import SPLIT_MARGINS
from codl_tvm.planner.split.search import PlannerConfig

__all__ = [
    "SPLIT_MARGINS",
    "SPLIT_MARGIN_HELP",
    "TUNE_HELP",
    "WEIGHT_GBPS_HELP",
    "cmd_plan",
    "plan_from_args",
    "register",
    "weight_gbps",
]

TUNE_HELP = (
    "measure the operators outside the cost model's data on this machine (compile: or on "
    "--tracker's device; whole on each processor and at a few GPU shares, the most expensive "
    "first) for up to SECONDS, and plan them on the measurements (the report says measured; "
    "compile's manifest and plan --report record what was measured); resumable: the "
    "measurements are cached (compile: in --build-cache DIR/tune; else $CODL_TVM_CACHE_DIR or "
    "~/.cache/codl-tvm, in tune/) and a rerun measures only what is missing"
)

SPLIT_MARGIN_HELP = (
    "which splits must predict a gain above the cost model's leave-one-model-out error: novel "
    "(default: operators outside the cost model's data), lomo (every operator), none (CoDL's "
    "rule)"
)


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
        raise argparse.ArgumentTypeError(
            f"--ratios {text!r}: expected numbers like 0,0.25,0.5"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("--ratios: give at least one ratio")
    return values


def plan_from_args(args: argparse.Namespace, model: OnnxModel) -> PlanChoice:
    """The plan ``--plan PLAN.json|auto`` or ``--dim/--ratio`` give for ``model``, validated,
    and where it runs: :func:`codl_tvm.planner.policy.resolve_plan`, the plan resolution of
    ``compile`` (its fall-back to one processor included). Neither flag: H at 0.5."""
    if (args.plan == "auto" or args.plan) and (args.dim or args.ratio is not None):
        raise CliError("give either --plan or --dim/--ratio, not both")
    if args.plan == "auto":
        choice = resolve_plan(
            model.mod,
            mode=getattr(args, "mode", "codl"),
            cost_model=args.cost_model,
            preset=getattr(args, "preset", None),
            model_name=Path(model.path).name,
        )
        if not args.cost_model:
            print(f"cost model: {choice.cost_model} (shipped default for this device pair)")
        print(choice.report.table())
        return choice
    try:
        return resolve_plan(
            model.mod,
            plan=args.plan or None,
            dim=args.dim or (None if args.plan else "H"),
            ratio=args.ratio,
        )
    except PlanError as exc:
        raise PlanError(f"{args.plan or 'plan'}: {exc}") from None


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a model with a cost model and print (and write) the plan and its report."""
    if not Path(args.model).is_file():
        raise CliError(f"plan: {args.model}: no such model file")
    if args.preset and args.preset not in PRESETS:
        raise CliError(
            f"plan: unknown target preset {args.preset!r}; valid presets: {', '.join(PRESETS)}"
        )
    settings = {
        "ratios": args.ratios or PlannerConfig().ratios,
        "chain_delta": args.chain_delta,
        "max_chain_len": args.max_chain_len,
        "min_gain_ms": args.min_gain_ms,
        "chain_min_gain": args.chain_min_gain,
        "weight_gbps": args.weight_gbps,
        "split_margin": args.split_margin,
    }
    # the preset and cost model compile uses by default, so that both make the same plan
    preset = args.preset or DEFAULT_PRESET
    _check_tune(args.tune, preset)
    path = cost_model_path(args.cost_model, preset)
    cost_model = load_model(path)
    if profiled_data_type(path, get_preset(preset)).data_type == "image":
        settings["gpu_channels"] = 4  # compile's GPU parts go on images: whole RGBA pixels
    model = load_onnx(args.model)
    placement = PlacementConfig(greedy_k=args.greedy_k, time_limit_s=args.time_limit_s)
    # the kernels `compile --preset P` builds (Winograd, packed, CPU-alone settings)
    tuned = None
    with planning_context(preset, path, **settings) as config:
        if args.tune is not None:  # measured inside the context: the parts get its kernels
            tuned = tune_operators(
                model.mod, cost_model, config, args.tune, tune_cache_dir(), preset
            )
            config = dataclasses.replace(config, tuned_parts=tuned.table)
        plan, report = make_plan(
            model.mod, cost_model, args.mode, config, str(args.model), placement
        )
    if args.cost_model is None or str(args.cost_model) != str(path):
        print(f"cost model: {path.name} (for preset {preset})")
    print(report.table())
    if args.output:
        plan.save(args.output)
        print(f"wrote plan {args.output}")
    if args.report:
        record = report.to_dict()
        if tuned is not None:  # what was measured, as a compile's manifest records it
            record["tune"] = tuned.record()
        Path(args.report).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote report {args.report}")
    return 0


def _check_tune(budget_s: float | None, preset: str) -> None:
    """``--tune SECONDS``: a positive budget, and a preset whose parts run on this machine."""
    if budget_s is None:
        return
    if not 0 < budget_s < float("inf"):
        raise CliError(f"--tune must be a time budget in seconds > 0, got {budget_s:g}")
    why = tune_unreachable(get_preset(preset))
    if why is not None:
        raise CliError(f"--tune times operator parts on this machine, but {why}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``plan`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "plan", help="plan the CPU+GPU co-execution of an ONNX model with a cost model"
    )
    p.add_argument("model", help="ONNX model with static shapes")
    p.add_argument(
        "--cost-model",
        help="fitted cost model: a .json file or a shipped model's name (default: the shipped "
        "model for --preset, as compile uses)",
    )
    p.add_argument(
        "--mode",
        choices=ALL_MODES,
        default="codl",
        help="planner or baseline (hope, hope_greedy, starpu, mosaic: each operator whole on the "
        "CPU or the GPU, independent branches on both at once; codl_hope: or split; auto: the "
        "lowest predicted latency of codl, hope, hope_greedy and codl_hope)",
    )
    p.add_argument(
        "--preset",
        help="predict the kernels `codl-tvm compile --preset P` builds (Winograd, packed convs, "
        "the CPU-alone kernels of a model profiled with them); default: direct/GEMM kernels",
    )
    p.add_argument("--tune", type=float, metavar="SECONDS", help=TUNE_HELP)
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
    p.add_argument("--split-margin", choices=SPLIT_MARGINS, default="novel", help=SPLIT_MARGIN_HELP)
    p.add_argument(
        "--greedy-k",
        type=int,
        default=PlacementConfig.greedy_k,
        help="hope_greedy: ready operators mapped at once (2**k mappings; default %(default)s)",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=PlacementConfig.time_limit_s,
        help="hope: the exact solver's time limit; past it the best schedule found is used and "
        "its proven gap reported (default %(default)s)",
    )
    p.set_defaults(func=cmd_plan)
