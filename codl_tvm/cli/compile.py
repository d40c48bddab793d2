"""``codl-tvm compile`` and ``codl-tvm refine``.

``codl-tvm compile MODEL.onnx -o OUT/`` plans, builds and writes a deployable artifact
(:func:`codl_tvm.objectives.latency.compile_artifact`, its flags gathered in one
:class:`~codl_tvm.options.CompileOptions`, whose errors name its fields: they are shown here as
the flags that set them); ``codl-tvm refine ARTIFACT -o OUT/`` rebalances a co-executed
artifact's splits from timelines measured on this machine
(:func:`codl_tvm.objectives.refine.refine_artifact`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping

from codl_tvm.build.targets import preset_names
from codl_tvm.cli.common import building
from codl_tvm.cli.plan import (
    SPLIT_MARGIN_HELP,
    SPLIT_MARGINS,
    TUNE_HELP,
    WEIGHT_GBPS_HELP,
    plan_from_args,
    weight_gbps,
)
from codl_tvm.core.errors import CliError, CodlError, DeviceSupportError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.cold import ColdOptions, compile_cold
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.objectives.refine import refine_artifact
from codl_tvm.objectives.throughput import ThroughputOptions, compile_throughput, parse_isa
from codl_tvm.options import GPU_DATA_TYPES, GPU_DTYPES, CompileOptions, OptionsError
from codl_tvm.runtime.weights import PLACEMENTS

__all__ = ["cmd_compile", "cmd_refine", "register"]


#: What ``compile --objective`` optimises; each objective other than latency has its own module.
OBJECTIVES = ("latency", "throughput", "cold")


def cmd_compile(args: argparse.Namespace) -> int:
    """``codl-tvm compile MODEL.onnx -o OUT/``: plan, build and write a deployable artifact."""
    model_path = args.model or str(bundled_model_path())
    if args.objective == "throughput":
        return _compile_throughput(args, model_path)
    if (
        args.groups
        or args.isa
        or args.pipe_model
        or args.layer_timing
        or args.stage_rounds is not None
    ):
        raise CliError(
            "--groups/--isa/--pipe-model/--layer-timing/--stage-rounds apply to --objective "
            "throughput only"
        )
    if args.tune is not None and args.no_measure:
        raise CliError("--tune times operator parts on this machine; drop --no-measure")
    if args.tune is not None and args.objective == "cold":
        raise CliError("--tune applies to --objective latency, not cold")
    plan = None
    if args.plan == "auto":  # the default: plan with the cost model
        args.plan = None
    if args.plan or args.dim or args.ratio is not None:
        if args.device != "coexec":
            raise CliError("--plan/--dim/--ratio apply to --device coexec only")
        plan = plan_from_args(args, load_onnx(model_path)).plan
    try:
        options = _compile_options(args, plan)
        with building(model_path, args.device):
            if args.objective == "cold":  # the lowest measured cold start, --verify N rounds
                compile_cold(model_path, args.output, _cold_options(args, options))
            else:
                compile_artifact(model_path, args.output, options)
    except (OptionsError, DeviceSupportError) as exc:
        raise _in_flags(exc, COMPILE_FLAGS) from None
    print(f"run it with: codl-tvm run {args.output}")
    return 0


#: The flag that sets each :class:`~codl_tvm.options.CompileOptions` field, for its messages.
COMPILE_FLAGS = {
    "device": "--device",
    "mode": "--mode",
    "cost_model": "--cost-model",
    "plan": "--plan",
    "preset": "--preset",
    "reference": "--no-reference",
    "seed": "--seed",
    "force": "--force",
    "winograd": "--winograd",
    "packed": "--packed",
    "measure": "--no-measure",
    "verify": "--verify",
    "verify_modes": "--verify-modes",
    "tracker": "--tracker",
    "key": "--key",
    "build_cache": "--build-cache",
    "coexec_cpu_alone": "--coexec-cpu-alone-kernels",
    "verify_calibrate": "--verify-calibrate",
    "split_channel_blocks": "--split-channel-blocks",
    "split_row_blocks": "--split-row-blocks",
    "issue_ahead": "--issue-ahead",
    "refine": "--refine",
    "refine_traces": "--refine-traces",
    "weight_gbps": "--weight-gbps",
    "weights": "--weights",
    "split_margin": "--split-margin",
    "gpu_data_type": "--gpu-data-type",
    "gpu_dtype": "--gpu-dtype",
    "tune_budget_s": "--tune",
}


def _compile_options(args: argparse.Namespace, plan) -> CompileOptions:
    """The :class:`~codl_tvm.options.CompileOptions` of ``compile``'s flags."""
    return CompileOptions(
        device=args.device,
        mode=args.mode,
        cost_model=args.cost_model,
        plan=plan,
        preset=args.preset,
        reference=not args.no_reference,
        seed=args.seed,
        force=args.force,
        winograd=args.winograd,
        packed=args.packed,
        measure=not args.no_measure,
        verify=args.verify or 0,
        verify_modes=tuple(m for m in (args.verify_modes or "").split(",") if m),
        tracker=args.tracker,
        key=args.key,
        build_cache=args.build_cache,
        coexec_cpu_alone=args.coexec_cpu_alone_kernels,
        split_channel_blocks=args.split_channel_blocks,
        split_row_blocks=args.split_row_blocks,
        issue_ahead=args.issue_ahead,
        verify_calibrate=args.verify_calibrate,
        refine=args.refine,
        refine_traces=args.refine_traces,
        weight_gbps=args.weight_gbps,
        weights=args.weights or "embedded",
        split_margin=args.split_margin,
        gpu_data_type=args.gpu_data_type,
        gpu_dtype=args.gpu_dtype,
        tune_budget_s=args.tune,
    )


def _compile_throughput(args: argparse.Namespace, model_path: str) -> int:
    """``compile --objective throughput``: a pipeline of stages on processor groups."""
    if not args.groups:
        raise CliError("--objective throughput needs --groups (e.g. big:0-7,little:8-11,gpu)")
    given = [
        flag
        for flag, on in (
            ("--plan", args.plan not in (None, "auto")),
            ("--dim", args.dim),
            ("--ratio", args.ratio is not None),
            ("--refine", args.refine),
            ("--device", args.device != "coexec"),
            ("--mode", args.mode != "codl"),
            ("--weights", args.weights is not None),
            ("--gpu-data-type", args.gpu_data_type is not None),
            ("--gpu-dtype", args.gpu_dtype != "float32"),
            ("--tune", args.tune is not None),
        )
        if on
    ]
    if given:
        raise CliError(f"{', '.join(given)} apply to --objective latency, not throughput")
    if args.layer_timing and args.pipe_model:
        raise CliError("--layer-timing times the layers here; --pipe-model predicts them instead")
    if args.verify is not None and args.verify < 2:
        raise CliError(
            f"--verify N streams N frames through each candidate pipeline; N must be >= 2, "
            f"got {args.verify}"
        )
    if args.verify and args.layer_timing:
        raise CliError("--verify times the layers both under load and alone: drop --layer-timing")
    try:
        options = ThroughputOptions(
            groups=args.groups,
            isa=parse_isa(args.isa),
            pipe_model=args.pipe_model,
            under_load=args.layer_timing != "alone",
            **({} if args.stage_rounds is None else {"stage_rounds": args.stage_rounds}),
            force=args.force,
            verify_frames=args.verify or 0,
            seed=args.seed,
            reference=not args.no_reference,
        )
    except CodlError as exc:
        raise _in_flags(exc, _THROUGHPUT_FLAGS) from None
    with building(model_path, "pipeline"):
        plan = compile_throughput(model_path, args.output, options)
    print(f"pipeline: {plan.describe()} (predicted {plan.throughput_fps:.1f} frames/s)")
    print(f"run it with: codl-tvm run {args.output} --stream 100")
    return 0


#: The flags that set :class:`ThroughputOptions`' and :class:`ColdOptions`' fields, for their
#: messages (which name the fields).
_THROUGHPUT_FLAGS = {
    "groups": "--groups",
    "isa": "--isa",
    "pipe_model": "--pipe-model",
    "stage_rounds": "--stage-rounds",
    "verify_frames": "--verify",
    "seed": "--seed",
}
_COLD_FLAGS = {"rounds": "--verify", "weights": "--weights"}


def _in_flags(exc: CodlError, flags: Mapping[str, str]) -> CliError:
    """``exc`` as a command-line error: the option fields it names (an
    :class:`~codl_tvm.options.OptionsError`'s ``fields``) as the flags that set them."""
    text = str(exc)
    for name in getattr(exc, "fields", ()):
        if name in flags:
            text = re.sub(rf"(?<![\w-]){name}(?![\w-])", flags[name], text)
    return CliError(text)


def _cold_options(args: argparse.Namespace, options: CompileOptions) -> ColdOptions:
    """``compile --objective cold``'s options: ``--verify N`` cold starts per candidate
    (default 3), ``--weights`` fixing the placement."""
    try:
        return ColdOptions(options, rounds=args.verify or 3, weights=args.weights)
    except CodlError as exc:
        raise _in_flags(exc, _COLD_FLAGS) from None


def cmd_refine(args: argparse.Namespace) -> int:
    """``codl-tvm refine ARTIFACT -o OUT/``: rebalance a co-executed artifact's splits from
    timelines measured on this machine."""
    if not 0.0 < args.step <= 1.0:
        raise CliError(f"--step must be in (0, 1], got {args.step}")
    if args.rounds < 1:
        raise CliError(f"--rounds must be >= 1, got {args.rounds}")
    prev = args.artifact
    for i in range(args.rounds):
        out = args.output if i == args.rounds - 1 else f"{args.output}.round{i + 1}"
        with building(prev, "coexec"):
            refine_artifact(
                prev,
                out,
                traces=args.traces,
                model_path=args.model,
                step=args.step,
                force=args.force,
            )
        prev = out
    print(f"run it with: codl-tvm run {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``compile`` and ``refine`` to the ``codl-tvm`` subcommands."""
    _add_compile(sub)
    _add_refine(sub)


def _add_compile(sub: argparse._SubParsersAction) -> None:
    """``codl-tvm compile``'s parser, its flags by concern."""
    p = sub.add_parser(
        "compile", help="plan and build an ONNX model into a deployable artifact directory"
    )
    p.add_argument("model", nargs="?", help="ONNX model (default: the bundled CNN)")
    p.add_argument("-o", "--output", required=True, help="artifact directory to create")
    p.add_argument("--device", choices=("coexec", "cpu", "opencl"), default="coexec")
    _objective_flags(p)
    _planning_flags(p)
    _kernel_flags(p)
    _verify_flags(p)
    p.add_argument(
        "--build-cache",
        metavar="DIR",
        help="reuse libraries built by earlier compiles of the same model, plan, targets and "
        "code from DIR, and store new ones there (e.g. compile each mode, then --verify)",
    )
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="skip storing the host CPU reference outputs (saves a second build)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the reference inputs")
    p.add_argument("--force", action="store_true", help="replace an earlier artifact in -o")
    p.set_defaults(func=cmd_compile)


def _objective_flags(p: argparse.ArgumentParser) -> None:
    """``--objective`` and the throughput objective's flags."""
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="latency",
        help="latency (default): one inference as fast as possible; throughput: frames/s of a "
        "stream, as a pipeline of stages on --groups (Pipe-it); cold: the first inference after "
        "start-up (builds each processor's and the co-executed build, measures their cold "
        "starts here, --verify N rounds, default 3, and keeps the fastest)",
    )
    p.add_argument(
        "--groups",
        metavar="NAME:CORES,...",
        help="with --objective throughput: processor groups, e.g. big:0-7,little:8-11,gpu "
        "(a group named gpu is the OpenCL device)",
    )
    p.add_argument(
        "--isa",
        metavar="GROUP=ISA,...",
        help="with --objective throughput: instruction set per CPU group (host, x86-64-v2, "
        "x86-64; default: x86-64-v2 for a group named little on x86-64, else host)",
    )
    p.add_argument(
        "--pipe-model",
        metavar="JSON",
        help="with --objective throughput: a fitted Pipe-it model predicting layer latencies "
        "(default: measure every layer on every group here)",
    )
    p.add_argument(
        "--layer-timing",
        choices=("under-load", "alone"),
        help="with --objective throughput: time each layer while the other cores run the "
        "model, as a stream's other stages do (under-load, the default), or alone (Pipe-it)",
    )
    p.add_argument(
        "--stage-rounds",
        type=int,
        metavar="N",
        help="with --objective throughput: time the chosen pipeline's stages running together "
        "and search again on those times, up to N pipelines (default 0: plan on the sums of "
        "the layers' times, as Pipe-it)",
    )


def _planning_flags(p: argparse.ArgumentParser) -> None:
    """How the plan is made: planner mode, cost model, a given or uniform plan, the preset."""
    p.add_argument(
        "--mode",
        default="codl",
        # checked by the plan resolution, whose one-line error names the modes
        help="planner mode: codl (default), codl_no_chain, h_only, oc_only, ulayer_like, "
        "cpu_only, gpu_only; hope, hope_greedy, starpu, mosaic (each operator whole on the CPU "
        "or the GPU, independent branches on both at once), codl_hope (or split); auto: the "
        "lowest predicted latency of codl, hope, hope_greedy and codl_hope",
    )
    p.add_argument(
        "--cost-model",
        help="cost model: a .json file or a shipped model's name (emulated-soc, device-h100, "
        "emulated-soc-k12, emulated-soc-k12-alone, emulated-soc-k14; default: the shipped model "
        "for the preset)",
    )
    p.add_argument("--plan", help="a PartitionPlan JSON instead of planning")
    p.add_argument("--dim", choices=("H", "OC"), help="split every operator along this dim")
    p.add_argument("--ratio", type=float, help="GPU share of every split operator, in [0, 1]")
    p.add_argument(
        "--preset",
        choices=preset_names(),
        help="target preset (default: opencl, this machine's OpenCL device and CPU)",
    )
    p.add_argument("--tune", type=float, metavar="SECONDS", help=TUNE_HELP)


def _kernel_flags(p: argparse.ArgumentParser) -> None:
    """The kernels built, where the weights go, and the co-executed build's blocks."""
    p.add_argument(
        "--winograd",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build 3x3 stride-1 convs as Winograd convs on both processors where the preset "
        "allows (the shipped cost models know direct kernels only, so the planner still "
        "predicts direct); --no-winograd never; default: only builds for the CPU alone, on "
        "CPUs where Winograd measured faster (AVX-512)",
    )
    p.add_argument(
        "--packed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build CPU convs as channel-packed convs (vectorised over output channels, weight "
        "packed at compile time), co-executed CPU parts included; --no-packed never; default: "
        "only builds for the CPU alone, on AVX-512",
    )
    p.add_argument(
        "--coexec-cpu-alone-kernels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="co-executed builds: give every CPU function the kernels of the build for the CPU "
        "alone (Winograd, packed convs and their CPU-alone settings). Default: when the cost "
        "model was profiled with them (codl-tvm profile --cpu-alone), so the planner predicts "
        "the kernels the build makes",
    )
    p.add_argument("--weight-gbps", type=weight_gbps, metavar="CPU,GPU", help=WEIGHT_GBPS_HELP)
    p.add_argument("--split-margin", choices=SPLIT_MARGINS, default="novel", help=SPLIT_MARGIN_HELP)
    p.add_argument(
        "--weights",
        choices=PLACEMENTS,
        default=None,
        help="where the weights are stored: embedded in model.so (read and placed on the device "
        "before the first operator runs) or beside it in weights.bin (read on a thread while "
        "the first inference runs, each awaited before its first use). Default: embedded; "
        "with --objective cold, the placement with the lower measured cold start",
    )
    p.add_argument(
        "--gpu-data-type",
        choices=GPU_DATA_TYPES,
        default=None,
        help="default: the data type the cost model's profile chose for this device (`codl-tvm "
        "profile --data-type`), else buffers. --device opencl: keep GPU tensors in buffers or, "
        "for convs, pools and "
        "elementwise ops, in OpenCL images (CoDL's GPU data type; a device without images or "
        "too small for the model's tensors is an error); auto: build both (images where the "
        "device can hold them), time them on this machine (or on --tracker's device) and "
        "keep the faster; with --no-measure or a preset that cross-compiles without "
        "--tracker, images where the device can hold them, else buffers (recorded as "
        "unchecked). --device coexec: image puts the GPU parts of split operators on images "
        "where covered (the CPU parts keep buffers; the manifest's kernel_splits.gpu_parts "
        "says which and why; OC cuts give the GPU whole 4-channel pixels where that costs "
        "little); auto builds the plan both ways and times them beside each processor alone",
    )
    p.add_argument(
        "--gpu-dtype",
        choices=GPU_DTYPES,
        default="float32",
        help="GPU tensors in float32 (default) or float16 (convs accumulate in half; inputs "
        "and outputs stay float32; needs cl_khr_fp16): the GPU alone (--device opencl), or "
        "the GPU parts on images of co-executed builds",
    )
    p.add_argument(
        "--split-channel-blocks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="co-executed builds: split an InstanceNorm-like block that reads a split's output "
        "along channels (at the plan's block_ratio), instead of running it whole on one "
        "processor while the other waits (default: on)",
    )
    p.add_argument(
        "--split-row-blocks",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="co-executed builds: split an LRN-like block (channel pads and slices, elementwise "
        "ops) that reads an H split's output along rows at that split's ratio, instead of "
        "running it whole on one processor while the other waits (default: off; AlexNet at "
        "k = 12 measured 1.04-1.07x slower split)",
    )
    p.add_argument(
        "--issue-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="co-executed builds: enqueue each GPU kernel as early as its inputs allow instead "
        "of when the host reaches it between CPU kernels (default: on)",
    )


def _verify_flags(p: argparse.ArgumentParser) -> None:
    """``--verify`` and the candidates it times: calibration, refinement, modes, RPC."""
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="do not time the builds: by default a co-executed compile also builds the model "
        "for each processor alone, times the three on this machine (or on --tracker's device) "
        "and keeps the fastest, so the artifact is never slower than one processor; with "
        "--no-measure (cross-compiling without a device) the cost model's choice stands, "
        "unchecked",
    )
    p.add_argument(
        "--verify",
        type=int,
        default=None,
        metavar="ROUNDS",
        help="also build for each processor alone, time the three builds on this machine "
        "(ROUNDS round-robin rounds) and keep the fastest: never slower than one processor. "
        "Where the two processors missed their predicted latencies by different factors, the "
        "plans are re-made with predictions calibrated to the measurements and timed too. "
        "With --objective throughput: build the plans searched on the layers timed under load "
        "and alone and the whole model as one stage, stream ROUNDS frames through each here "
        "(3 rounds, rotated) and keep the highest median frames/s",
    )
    p.add_argument(
        "--verify-calibrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --verify: re-plan with predictions calibrated to the measured "
        "single-processor latencies and time those plans too (default: on)",
    )
    p.add_argument(
        "--refine",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="with --verify: take timelines of the fastest co-executed build on this machine, "
        "balance each split from them (as `codl-tvm refine`) and time the refined build too; "
        "ROUNDS > 1 refines the refined build again",
    )
    p.add_argument(
        "--refine-traces",
        type=int,
        default=5,
        metavar="N",
        help="with --refine: timelines per round (each split's time is their median)",
    )
    p.add_argument(
        "--verify-modes",
        metavar="MODE,...",
        help="with --verify: also time the plans of these planner modes (e.g. "
        "codl_no_chain,h_only,oc_only) and keep the fastest of all",
    )
    p.add_argument(
        "--tracker",
        metavar="HOST:PORT",
        help="with --verify: time the builds on a device behind this TVM RPC tracker; with "
        "--tune: measure the tuned operators there too",
    )
    p.add_argument("--key", help="with --tracker: the device key")


def _add_refine(sub: argparse._SubParsersAction) -> None:
    """``codl-tvm refine``'s parser."""
    p = sub.add_parser(
        "refine",
        help="time a co-executed artifact's splits inside the model on this machine and "
        "rebuild it with each split balanced",
    )
    p.add_argument("artifact", help="a co-executed artifact directory (codl-tvm compile)")
    p.add_argument("-o", "--output", required=True, help="the refined artifact's directory")
    p.add_argument("--traces", type=int, default=5, help="timelines per round (median)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="trace-refine-build rounds (earlier rounds go to OUTPUT.roundN)",
    )
    p.add_argument(
        "--step", type=float, default=1.0, help="fraction of the way to the balanced shares"
    )
    p.add_argument("--model", help="the ONNX model, if the artifact's path to it is gone")
    p.add_argument("--force", action="store_true", help="replace earlier artifacts in -o")
    p.set_defaults(func=cmd_refine)
