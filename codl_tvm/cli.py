"""The ``codl-tvm`` command line.

``codl-tvm run [MODEL.onnx] --device {cpu,opencl}`` imports an ONNX model (the bundled CNN by
default), builds it for the device, runs it and prints output shapes and latency. Inputs come
from ``--inputs IN.npz`` (keyed by the graph's input names) or are seeded random;
``--save-outputs OUT.npz`` stores outputs keyed by the graph's output names.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = ["bundled_model_path", "main"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def bundled_model_path() -> Path:
    """Path of the small CNN shipped with the package."""
    return Path(str(resources.files("codl_tvm") / "data" / "codl_small_cnn.onnx"))


def _load_inputs(path: str | None, model, seed: int) -> list[np.ndarray]:
    from codl_tvm.frontend import ModelError, check_inputs, random_inputs

    if path is None:
        values = random_inputs(model, seed)
        source = "random inputs"
    else:
        if not Path(path).is_file():
            raise CliError(f"--inputs {path}: no such file")
        try:
            with np.load(path, allow_pickle=False) as data:
                values = {k: data[k] for k in data.files}
        except Exception as exc:
            raise CliError(f"--inputs {path}: not a readable .npz file ({exc})") from None
        source = f"--inputs {path}"
    try:
        return check_inputs(model, values, source)
    except ModelError as exc:
        raise CliError(str(exc)) from None


def _save_outputs(path: str, model, outputs: list[np.ndarray], force: bool) -> None:
    out = Path(path)
    if out.exists() and not force:
        raise CliError(f"--save-outputs {path}: file exists; pass --force to overwrite it")
    if out.suffix != ".npz":
        raise CliError(f"--save-outputs {path}: the file name must end in .npz")
    np.savez(out, **{spec.name: arr for spec, arr in zip(model.outputs, outputs)})


def cmd_run(args: argparse.Namespace) -> int:
    if args.save_outputs and Path(args.save_outputs).exists() and not args.force:
        raise CliError(
            f"--save-outputs {args.save_outputs}: file exists; pass --force to overwrite it"
        )
    if args.model and Path(args.model).is_dir():
        return _run_artifact(args)
    from codl_tvm.frontend import ModelError, load_onnx
    from codl_tvm.runner import build

    args.device = args.device or "opencl"
    model_path = args.model or str(bundled_model_path())
    try:
        model = load_onnx(model_path)
    except ModelError as exc:
        raise CliError(str(exc)) from None
    inputs = _load_inputs(args.inputs, model, args.seed)
    if args.device == "coexec":
        return _run_coexec(args, model, inputs)
    if args.plan or args.dim or args.ratio is not None:
        raise CliError("--plan/--dim/--ratio apply to --device coexec only")
    if args.device == "opencl":
        _opencl_banner()
    built = build(model.mod, args.device)
    return _report(args, model, inputs, built, f"device: {args.device}")


def _report(args: argparse.Namespace, model, inputs, built, device_line: str) -> int:
    """Run ``built``, print outputs and latency, check and save as the flags ask."""
    from codl_tvm.runner import build

    outputs = built(inputs)
    lat = built.time(inputs, number=args.number, repeat=args.repeat)
    print(f"model: {model.path}")
    print(device_line)
    for spec, arr in zip(model.outputs, outputs):
        print(f"output {spec.name}: shape {tuple(arr.shape)} dtype {arr.dtype}")
    print(
        f"latency: median {lat.median_ms:.3f} ms (min {lat.min_ms:.3f}, max {lat.max_ms:.3f}, "
        f"{lat.repeats} repeats of {args.number})"
    )
    if args.check and args.device != "cpu":
        ref = build(model.mod, "cpu")(inputs)
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs, ref))
        print(f"max abs difference against the CPU build: {err:.3g}")
    if args.save_outputs:
        _save_outputs(args.save_outputs, model, outputs, args.force)
        print(f"saved outputs to {args.save_outputs}")
    return 0


def _run_artifact(args: argparse.Namespace) -> int:
    """``codl-tvm run OUT/``: run a compiled artifact (runtime-only TVM is enough)."""
    from codl_tvm.artifact import ArtifactError, load_artifact

    given = [
        f"--{k.replace('_', '-')}"
        for k in ("device", "plan", "cost_model", "dim", "ratio")
        if getattr(args, k) is not None
    ]
    if given:
        raise CliError(
            f"{args.model} is a compiled artifact: {', '.join(given)} were fixed at compile "
            "time (recompile with `codl-tvm compile` to change them)"
        )
    try:
        art = load_artifact(args.model)
    except ArtifactError as exc:
        raise CliError(str(exc)) from None
    model = art.model
    ref = art.reference()
    if args.inputs is None and ref is not None:
        inputs = _load_inputs_from(ref[0], model, f"{args.model}/reference.npz")
        expected = ref[1]
    else:
        inputs = _load_inputs(args.inputs, model, args.seed)
        expected = None
    if "opencl" in art.manifest["vm_devices"]:
        _opencl_banner()
    plan = art.manifest.get("plan") or {}
    how = (
        f", plan: {plan['mode']} ({plan['cost_model']['kind']} cost model)"
        if plan.get("mode")
        else ""
    )
    try:
        outputs = art(inputs)
        lat = art.time(inputs, number=args.number, repeat=args.repeat)
    except Exception as exc:  # a library built for another machine fails to load or run
        raise CliError(f"{args.model}: running the artifact failed: {exc}") from None
    print(f"artifact: {args.model} (model {model.path})")
    print(f"device: {art.device}{how}")
    for spec, arr in zip(model.outputs, outputs):
        print(f"output {spec.name}: shape {tuple(arr.shape)} dtype {arr.dtype}")
    print(
        f"latency: median {lat.median_ms:.3f} ms (min {lat.min_ms:.3f}, max {lat.max_ms:.3f}, "
        f"{lat.repeats} repeats of {args.number})"
    )
    status = 0
    if expected is not None:
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs, expected))
        scale = max(1.0, max(float(np.max(np.abs(r))) for r in expected))
        ok = err <= 1e-4 * scale
        print(
            f"max abs difference against the reference (unpartitioned, host CPU): {err:.3g} "
            f"-> {'OK' if ok else 'MISMATCH'}"
        )
        status = 0 if ok else 1
    if args.save_outputs:
        _save_outputs(args.save_outputs, model, outputs, args.force)
        print(f"saved outputs to {args.save_outputs}")
    return status


def _load_inputs_from(values: dict, model, source: str) -> list[np.ndarray]:
    from codl_tvm.frontend import ModelError, check_inputs

    try:
        return check_inputs(model, values, source)
    except ModelError as exc:
        raise CliError(str(exc)) from None


def cmd_compile(args: argparse.Namespace) -> int:
    """``codl-tvm compile MODEL.onnx -o OUT/``: plan, build and write a deployable artifact."""
    from codl_tvm.artifact import ArtifactError, compile_artifact
    from codl_tvm.frontend import ModelError
    from codl_tvm.targets import ToolchainError

    model_path = args.model or str(bundled_model_path())
    plan = None
    if args.plan == "auto":  # the default: plan with the cost model
        args.plan = None
    if args.plan or args.dim or args.ratio is not None:
        if args.device != "coexec":
            raise CliError("--plan/--dim/--ratio apply to --device coexec only")
        from codl_tvm.frontend import load_onnx

        try:
            model = load_onnx(model_path)
        except ModelError as exc:
            raise CliError(str(exc)) from None
        plan = _plan_from_args(args, model)
    try:
        compile_artifact(
            model_path,
            args.output,
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
            verify=args.verify,
            verify_modes=[m for m in (args.verify_modes or "").split(",") if m],
            tracker=args.tracker,
            key=args.key,
            build_cache=args.build_cache,
            coexec_cpu_alone=args.coexec_cpu_alone_kernels,
            split_channel_blocks=args.split_channel_blocks,
            split_row_blocks=args.split_row_blocks,
            verify_calibrate=args.verify_calibrate,
            refine=args.refine,
            refine_traces=args.refine_traces,
            weight_gbps=args.weight_gbps,
        )
    except (ArtifactError, ModelError, ToolchainError) as exc:
        raise CliError(str(exc)) from None
    print(f"run it with: codl-tvm run {args.output}")
    return 0


def cmd_refine(args: argparse.Namespace) -> int:
    """``codl-tvm refine ARTIFACT -o OUT/``: rebalance a co-executed artifact's splits from
    timelines measured on this machine."""
    from codl_tvm.artifact import ArtifactError, refine_artifact
    from codl_tvm.frontend import ModelError
    from codl_tvm.targets import ToolchainError

    if not 0.0 < args.step <= 1.0:
        raise CliError(f"--step must be in (0, 1], got {args.step}")
    if args.rounds < 1:
        raise CliError(f"--rounds must be >= 1, got {args.rounds}")
    prev = args.artifact
    try:
        for i in range(args.rounds):
            out = args.output if i == args.rounds - 1 else f"{args.output}.round{i + 1}"
            refine_artifact(
                prev,
                out,
                traces=args.traces,
                model_path=args.model,
                step=args.step,
                force=args.force,
            )
            prev = out
    except (ArtifactError, ModelError, ToolchainError) as exc:
        raise CliError(str(exc)) from None
    print(f"run it with: codl-tvm run {args.output}")
    return 0


def _plan_from_args(args: argparse.Namespace, model):
    from codl_tvm.plan import PartitionPlan, PlanError, uniform_plan

    try:
        if args.plan == "auto":
            if args.dim or args.ratio is not None:
                raise CliError("give either --plan or --dim/--ratio, not both")
            return _auto_plan(args, model)
        if args.plan:
            if args.dim or args.ratio is not None:
                raise CliError("give either --plan or --dim/--ratio, not both")
            if not Path(args.plan).is_file():
                raise CliError(f"--plan {args.plan}: no such file")
            plan = PartitionPlan.load(args.plan)
        else:
            dim = args.dim or "H"
            ratio = 0.5 if args.ratio is None else args.ratio
            plan = uniform_plan(model.mod, dim, ratio)
        plan.validate(model.mod)
    except PlanError as exc:
        raise CliError(f"{args.plan or 'plan'}: {exc}") from None
    return plan


def _auto_plan(args: argparse.Namespace, model):
    """Plan with the CoDL planner and the cost model given by --cost-model."""
    from codl_tvm.cost_model.base import ModelFileError, load_model
    from codl_tvm.cost_model.defaults import NoDefaultModelError, default_model_path
    from codl_tvm.planner import plan_model

    if args.cost_model and not Path(args.cost_model).is_file():
        raise CliError(f"--cost-model {args.cost_model}: no such file")
    try:
        path = args.cost_model or default_model_path(None)
        cost_model = load_model(path)
    except (ModelFileError, NoDefaultModelError) as exc:
        raise CliError(str(exc)) from None
    if not args.cost_model:
        print(f"cost model: {path} (shipped default for this device pair)")
    plan, report = plan_model(model.mod, cost_model)
    print(report.table())
    return plan


def _opencl_banner() -> None:
    from codl_tvm import runtime

    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:
        raise CliError(f"OpenCL is not usable here: {exc}") from None
    print(
        f"OpenCL: {info.platform} / {info.devices[0].name} "
        f"({info.devices[0].compute_units} CUs, SVM {info.svm_mode})"
    )


def _print_placements(placements: list[dict]) -> None:
    print(f"{'operators':28s} {'dim':>3s} {'ratio':>6s}  placement")
    for row in placements:
        parts = ", ".join(
            f"{p['processor']} {row['dim']}[{p['region'][0]}:{p['region'][1]})"
            for p in row["parts"]
        )
        print(f"{'+'.join(row['ops'])[:28]:28s} {row['dim']:>3s} {row['ratio']:6.2f}  {parts}")


def _run_coexec(args: argparse.Namespace, model, inputs) -> int:
    from codl_tvm.coexec import compile_coexec
    from codl_tvm.runtime import coexec as sync

    plan = _plan_from_args(args, model)
    _opencl_banner()
    built = compile_coexec(model.mod, plan)
    return _report(
        args, model, inputs, built, f"device: coexec (GPU + CPU), sync mode: {sync.sync_mode()}"
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job on the embedded default: plan the bundled CNN with the shipped cost model
    for the local device pair (or split it uniformly with --dim/--ratio), build it for the
    local OpenCL device + CPU, run it and check it against the unpartitioned model."""
    import tempfile

    from codl_tvm.artifact import ArtifactError, compile_artifact, load_artifact
    from codl_tvm.frontend import load_onnx

    model_path = bundled_model_path()
    plan = None
    if args.dim or args.ratio is not None:
        from codl_tvm.plan import uniform_plan

        plan = uniform_plan(
            load_onnx(model_path).mod, args.dim or "H", 0.5 if args.ratio is None else args.ratio
        )
    _opencl_banner()
    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="codl-demo-")) / "cnn"
    try:
        compile_artifact(
            model_path, out, cost_model=args.cost_model, plan=plan, seed=args.seed, force=args.force
        )
        art = load_artifact(out)
    except ArtifactError as exc:
        raise CliError(str(exc)) from None
    inputs, expected = art.reference()
    ordered = [inputs[s.name] for s in art.model.inputs]
    outputs = art(ordered)
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs, expected))
    fallback = (art.manifest.get("plan") or {}).get("fallback")
    if art.device == "coexec":
        placements = json.loads((out / "placement.json").read_text())
        split = [row for row in placements if len(row["parts"]) == 2]
        print(
            f"co-executed {model_path.name}: {len(split)} operators/chains split between the "
            "GPU and the CPU; sync mode: " + _sync_mode()
        )
        _print_placements(placements)
    else:
        print(f"{model_path.name} runs on the {art.device} alone: {fallback}")
    ok = err <= 1e-4 * max(1.0, max(float(np.max(np.abs(r))) for r in expected))
    print(
        f"max abs difference against the unpartitioned model (host CPU): {err:.3g} "
        f"-> {'OK' if ok else 'MISMATCH'}"
    )
    print(f"artifact: {out} (run it again with: codl-tvm run {out})")
    if args.trace and art.device == "coexec":
        from codl_tvm.trace import trace_inference

        trace = trace_inference(art, ordered)
        trace.save_chrome(args.trace)
        png = str(Path(args.trace).with_suffix(".png"))
        trace.save_png(png)
        print(f"trace: {args.trace} (Chrome trace), {png} (timeline)")
    return 0 if ok else 1


def _sync_mode() -> str:
    from codl_tvm.runtime import coexec as sync

    return sync.sync_mode()


def cmd_info(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from codl_tvm import runtime

    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:
        raise CliError(f"OpenCL is not usable here: {exc}") from None
    print(json.dumps(asdict(info), indent=2))
    return 0


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="build and run an ONNX model, or run a compiled artifact")
    p.add_argument(
        "model",
        nargs="?",
        help="ONNX model (default: the bundled CNN) or an artifact directory from `compile`",
    )
    p.add_argument(
        "--device", choices=("cpu", "opencl", "coexec"), help="processor(s) (default: opencl)"
    )
    p.add_argument(
        "--plan", help="PartitionPlan JSON, or 'auto' to plan with --cost-model (--device coexec)"
    )
    p.add_argument("--cost-model", help="cost model JSON for --plan auto")
    p.add_argument("--dim", choices=("H", "OC"), help="split every operator along this dim")
    p.add_argument("--ratio", type=float, help="GPU share of every split operator, in [0, 1]")
    p.add_argument("--inputs", help=".npz of inputs keyed by graph input names")
    p.add_argument("--save-outputs", help=".npz to write outputs to, keyed by output names")
    p.add_argument("--force", action="store_true", help="overwrite --save-outputs if it exists")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--repeat", type=int, default=3, help="timing repeats")
    p.add_argument("--number", type=int, default=5, help="runs per timing repeat")
    p.add_argument("--check", action="store_true", help="compare with the CPU build")
    p.set_defaults(func=cmd_run)


def _add_compile(sub) -> None:
    from codl_tvm.targets import preset_names

    p = sub.add_parser(
        "compile", help="plan and build an ONNX model into a deployable artifact directory"
    )
    p.add_argument("model", nargs="?", help="ONNX model (default: the bundled CNN)")
    p.add_argument("-o", "--output", required=True, help="artifact directory to create")
    p.add_argument("--device", choices=("coexec", "cpu", "opencl"), default="coexec")
    p.add_argument(
        "--mode",
        default="codl",
        help="planner mode: codl (default), codl_no_chain, h_only, oc_only, ulayer_like, "
        "cpu_only, gpu_only",
    )
    p.add_argument(
        "--cost-model", help="cost model JSON (default: the shipped model for the preset)"
    )
    p.add_argument("--plan", help="a PartitionPlan JSON instead of planning")
    p.add_argument("--dim", choices=("H", "OC"), help="split every operator along this dim")
    p.add_argument("--ratio", type=float, help="GPU share of every split operator, in [0, 1]")
    p.add_argument(
        "--preset",
        choices=preset_names(),
        help="target preset (default: opencl, this machine's OpenCL device and CPU)",
    )
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
    from codl_tvm.planner.cli import WEIGHT_GBPS_HELP, weight_gbps

    p.add_argument("--weight-gbps", type=weight_gbps, metavar="CPU,GPU", help=WEIGHT_GBPS_HELP)
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
        "--verify",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also build for each processor alone, time the three builds on this machine "
        "(ROUNDS round-robin rounds) and keep the fastest: never slower than one processor. "
        "Where the two processors missed their predicted latencies by different factors, the "
        "plans are re-made with predictions calibrated to the measurements and timed too",
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
        help="with --verify: time the builds on a device behind this TVM RPC tracker",
    )
    p.add_argument("--key", help="with --tracker: the device key")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codl-tvm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    try:
        _add_compile(sub)
    except ImportError:  # runtime-only TVM: nothing to compile with
        pass
    p = sub.add_parser(
        "demo", help="plan, build, co-execute and check the bundled CNN on this machine"
    )
    p.add_argument("--cost-model", help="cost model JSON (default: the shipped one)")
    p.add_argument("--dim", choices=("H", "OC"), help="split every operator along this dim")
    p.add_argument("--ratio", type=float, help="GPU share of every split operator")
    p.add_argument("-o", "--output", help="keep the artifact here (default: a temp dir)")
    p.add_argument("--force", action="store_true", help="replace an artifact in --output")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="write a Chrome trace JSON (and a PNG timeline beside it)")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("info", help="describe the OpenCL platform and devices in use")
    p.set_defaults(func=cmd_info)
    # Subcommands of optional components register themselves when present.
    for module in (
        "codl_tvm.cost_model.evaluate",
        "codl_tvm.deploy",
        "codl_tvm.planner.cli",
        "codl_tvm.profiling.cli",
    ):
        try:
            mod = __import__(module, fromlist=["register_cli"])
        except Exception:
            # Runtime-only TVM (a device without the compiler) cannot import compiler-side
            # modules (their import registers Relax ops); their subcommands are then absent.
            continue
        if hasattr(mod, "register_cli"):
            mod.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"codl-tvm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
