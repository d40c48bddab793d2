"""``codl-tvm run`` and ``codl-tvm info``.

``codl-tvm run [MODEL.onnx] --device {cpu,opencl,coexec}`` imports an ONNX model (the bundled
CNN by default), builds it for the device, runs it and prints output shapes and latency;
``codl-tvm run ARTIFACT/`` runs a compiled artifact (TVM's runtime alone is enough);
``--tracker HOST:PORT --key KEY`` runs it on a device behind a TVM RPC tracker instead.
``codl-tvm info`` describes the OpenCL platform and devices in use.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from codl_tvm import runtime
from codl_tvm.build.coexec import compile_coexec
from codl_tvm.build.runner import build, max_abs_difference
from codl_tvm.cli.common import (
    add_run_arguments,
    building,
    check_output_file,
    load_inputs,
    one_line,
    opencl_banner,
    print_outputs_and_latency,
    save_outputs,
)
from codl_tvm.core.errors import CliError, CodlError
from codl_tvm.frontend.importer import check_inputs, load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.runtime import sync
from codl_tvm.runtime.artifact import load_artifact
from codl_tvm.runtime.staged_artifact import is_pipeline, load_pipeline
from codl_tvm.runtime.vm import Latency

__all__ = ["cmd_info", "cmd_run", "info_lines", "register"]


def cmd_run(args: argparse.Namespace) -> int:
    """Build and run an ONNX model, or run a compiled artifact."""
    check_output_file(args.save_outputs, args.force)
    if args.model and Path(args.model).is_dir():
        return _run_artifact(args)
    if args.tracker or args.key:
        raise CliError(
            "--tracker runs a compiled artifact (codl-tvm compile) on a remote device; "
            "`codl-tvm deploy` runs an ONNX model there"
        )
    if args.stream is not None:
        raise CliError(
            "--stream runs a pipeline artifact (codl-tvm compile --objective throughput)"
        )
    args.device = args.device or "opencl"
    model = load_onnx(args.model or bundled_model_path())
    inputs = load_inputs(args.inputs, model, args.seed)
    if args.device == "coexec":
        # deferred: planning needs TVM's compiler (the schedules), which a runtime-only TVM
        # lacks, and this module must import there to run artifacts
        from codl_tvm.cli.plan import plan_from_args

        choice = plan_from_args(args, model)
        if choice.device == "coexec":
            opencl_banner()
            with building(model.path, "coexec"):
                built = compile_coexec(model.mod, choice.plan, model=str(model.path))
            line = f"device: coexec (GPU + CPU), sync mode: {sync.sync_mode()}"
            return _report(args, model, inputs, built, line)
        # compile's fall-back rule: the plan is better run by one processor alone
        print(f"not co-executing: {choice.reason}")
        args.device = choice.device
    elif args.plan or args.dim or args.ratio is not None:
        raise CliError("--plan/--dim/--ratio apply to --device coexec only")
    if args.device == "opencl":
        opencl_banner()
    with building(model.path, args.device):
        built = build(model.mod, args.device, model=str(model.path))
    return _report(args, model, inputs, built, f"device: {args.device}")


def _report(args: argparse.Namespace, model, inputs, built, device_line: str) -> int:
    """Run ``built``, print outputs and latency, check and save as the flags ask."""
    # OpenCL kernels are compiled by the driver at their first launch
    with building(model.path, args.device):
        outputs = built(inputs)
    lat = built.time(inputs, number=args.number, repeat=args.repeat)
    print(f"model: {model.path}")
    print(device_line)
    print_outputs_and_latency(model, outputs, lat, args.number)
    if args.check and args.device != "cpu":
        with building(model.path, "cpu"):
            ref = build(model.mod, "cpu", model=str(model.path))(inputs)
        err = max_abs_difference(outputs, ref)
        print(f"max abs difference against the CPU build: {err:.3g}")
    if args.save_outputs:
        save_outputs(args.save_outputs, model, outputs, args.force)
    return 0


def _run_artifact(args: argparse.Namespace) -> int:
    """``codl-tvm run OUT/``: run a compiled artifact (runtime-only TVM is enough)."""
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
    if is_pipeline(args.model):
        if args.tracker:
            raise CliError(f"{args.model}: --tracker runs single-library artifacts, not pipelines")
        return _run_pipeline(args)
    if args.stream is not None:
        raise CliError(
            f"{args.model}: --stream runs a pipeline artifact (codl-tvm compile --objective "
            "throughput); this one runs single inferences"
        )
    if bool(args.tracker) != bool(args.key):
        raise CliError("--tracker HOST:PORT and --key KEY go together")
    # through a tracker the remote's CPU runs the library (run_artifact checks its machine)
    art = load_artifact(args.model, check_cpu=not args.tracker)
    model = art.model
    ref = art.reference()
    if args.inputs is None and ref is not None:
        inputs = check_inputs(model, ref[0], f"{args.model}/reference.npz")
        expected = ref[1]
    else:
        inputs = load_inputs(args.inputs, model, args.seed)
        expected = _host_reference(args, model.path, inputs) if args.check else None
    plan = art.manifest.get("plan") or {}
    how = (
        f", plan: {plan['mode']} ({plan['cost_model']['kind']} cost model)"
        if plan.get("mode")
        else ""
    )
    if args.tracker:
        outputs, lat = _run_through_tracker(args, inputs)
        how += f", through RPC tracker {args.tracker} (key {args.key})"
    else:
        if "opencl" in art.manifest["vm_devices"]:
            opencl_banner()
        try:
            outputs = art(inputs)
            lat = art.time(inputs, number=args.number, repeat=args.repeat)
        except Exception as exc:  # a library built for another machine fails to load or run
            raise CliError(
                f"{args.model}: running the artifact failed: {one_line(str(exc))}"
            ) from None
    print(f"artifact: {args.model} (model {model.path})")
    print(f"device: {art.device}{how}")
    print_outputs_and_latency(model, outputs, lat, args.number)
    gpu_dtype = (art.manifest.get("gpu") or {}).get("dtype", "float32")
    status = 0 if expected is None else _check_reference(outputs, expected, gpu_dtype)
    if args.save_outputs:
        save_outputs(args.save_outputs, model, outputs, args.force)
    return status


def _run_through_tracker(args: argparse.Namespace, inputs) -> tuple[list[np.ndarray], Latency]:
    """``run ARTIFACT --tracker H:P --key K``: the artifact run and timed on a device of the
    key (:func:`codl_tvm.objectives.deploy.run_artifact`)."""
    # deferred: codl_tvm.objectives.deploy imports TVM's compiler, which a runtime-only TVM
    # lacks, and this module must import there to run artifacts
    from codl_tvm.objectives.deploy import run_artifact

    run = run_artifact(
        args.model, args.tracker, args.key, inputs, args.number, max(1, args.repeat),
        request_timeout_s=args.timeout,
    )  # fmt: skip
    return run.outputs, Latency.of(run.samples_ms)


def _host_reference(args: argparse.Namespace, model_path, inputs) -> list[np.ndarray]:
    """``run ARTIFACT --inputs X --check``: the outputs of the unpartitioned model, built for
    this machine's CPU from the artifact's ONNX file, on the user's inputs (the reference the
    artifact stores holds its own inputs only)."""
    if not Path(model_path).is_file():
        raise CliError(
            f"{args.model}: --check with --inputs builds the unpartitioned model from "
            f"{model_path}, which is not here; without --inputs, run checks the artifact's "
            "stored reference inputs"
        )
    model = load_onnx(model_path)
    with building(model.path, "cpu"):
        built = build(model.mod, "cpu", model=str(model.path))
        return built(inputs)


def _run_pipeline(args: argparse.Namespace) -> int:
    """``codl-tvm run PIPELINE/ [--stream N]``: one inference stage after stage, or a stream of
    ``N`` frames through the stages (one thread each, pinned to its cores)."""
    if args.stream is not None and args.stream < 1:
        raise CliError(f"--stream must be a positive number of frames, got {args.stream}")
    if args.queue_size < 1:
        raise CliError(f"--queue-size must be >= 1, got {args.queue_size}")
    pipe = load_pipeline(args.model)
    model = pipe.model
    ref = pipe.reference()
    if args.inputs is None and ref is not None:  # the stored inputs, checked against its outputs
        inputs = check_inputs(model, ref[0], f"{args.model}/reference.npz")
        expected = ref[1]
    else:
        inputs = load_inputs(args.inputs, model, args.seed)
        expected = _host_reference(args, model.path, inputs) if args.check else None
    if any(s["kind"] == "gpu" for s in pipe.manifest["stages"]):
        opencl_banner()
    print(f"artifact: {args.model} (model {model.path})")
    print(f"pipeline: {pipe.describe()}")
    try:
        if args.stream is None:
            outputs = pipe(inputs)
            lat = pipe.time(inputs, number=args.number, repeat=args.repeat)
        else:
            # the frames are checked before the first runs; a failing stage stops the stream
            with pipe.stream([inputs] * args.stream, queue_size=args.queue_size) as stream:
                outputs = next(stream)
                for _ in stream:
                    pass
    except CodlError:
        raise
    except Exception as exc:  # a library built for another machine fails to load or run
        raise CliError(f"{args.model}: running the pipeline failed: {one_line(str(exc))}") from None
    if args.stream is None:
        print_outputs_and_latency(model, outputs, lat, args.number)
    else:
        st = stream.stats()
        for spec, arr in zip(model.outputs, outputs):
            print(f"output {spec.name}: shape {tuple(arr.shape)} dtype {arr.dtype}")
        print(
            f"stream: {st.frames} frames, {st.steady_frames_per_s:.2f} frames/s steady "
            f"({st.frames_per_s:.2f} with the {st.fill_ms:.3f} ms fill), latency median "
            f"{st.latency_median_ms:.3f} ms, p99 {st.latency_p99_ms:.3f} ms"
        )
        for name, busy in zip(st.stage_names, st.stage_busy_s):
            share = busy / st.wall_s if st.wall_s > 0 else 0.0
            print(f"  {name}: busy {busy * 1e3 / st.frames:.3f} ms/frame ({share:.0%} of the time)")
    status = 0 if expected is None else _check_reference(outputs, expected)
    if args.save_outputs:
        save_outputs(args.save_outputs, model, outputs, args.force)
    return status


#: How far from the float32 reference an artifact may be, relative to the outputs' scale, by
#: the GPU's data type: float16 keeps about three decimal digits, and convolutions accumulate
#: in half (``compile --gpu-dtype float16``).
CHECK_TOLERANCE = {"float32": 1e-4, "float16": 5e-2}


def _check_reference(outputs, expected, gpu_dtype: str = "float32") -> int:
    """Print how far ``outputs`` are from the stored reference; 1 where they differ by more
    than :data:`CHECK_TOLERANCE` of the GPU's data type."""
    err = max_abs_difference(outputs, expected)
    scale = max(1.0, *(float(np.max(np.abs(r[np.isfinite(r)]), initial=0)) for r in expected))
    tolerance = CHECK_TOLERANCE[gpu_dtype]
    ok = err <= tolerance * scale
    half = (
        f" (GPU in {gpu_dtype}: tolerance {tolerance:g} of the scale)"
        if gpu_dtype != "float32"
        else ""
    )
    print(
        f"max abs difference against the reference (unpartitioned, host CPU): {err:.3g}{half} "
        f"-> {'OK' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


def cmd_info(args: argparse.Namespace) -> int:
    """Describe the OpenCL platform, devices, memory mode and the platforms not used (as text,
    or as JSON with ``--json``)."""
    try:
        runtime.load()
        info = runtime.info()
    except Exception as exc:  # the plugin reports an unusable platform as a TVM error
        raise CliError(f"OpenCL is not usable here: {one_line(str(exc))}") from None
    if args.json:
        # "memory" says in words how tensors are shared, e.g. "buffer (host-mapped, no SVM)"
        described = {**asdict(info), "memory": runtime.describe_svm_mode(info.svm_mode)}
        print(json.dumps(described, indent=2))
        return 0
    print("\n".join(info_lines(info)))
    return 0


def info_lines(info: runtime.OpenCLInfo) -> list[str]:
    """``codl-tvm info``'s text: the platform in use, its devices, how tensors are shared with
    the CPU, and every platform not used with the reason."""
    lines = [
        f"platform: {info.platform} ({info.platform_vendor}; {info.platform_version})",
        f"memory:   {runtime.describe_svm_mode(info.svm_mode)}"
        + (", SVM atomics" if info.svm_atomics else ""),
    ]
    for d in info.devices:
        svm = [k for k, on in (("fine", d.svm_fine_grain), ("coarse", d.svm_coarse_grain)) if on]
        clock = f", {d.max_clock_mhz} MHz" if d.max_clock_mhz else ""
        lines += [
            f"device {d.index}: {d.name} ({d.vendor})",
            f"  {d.compute_units} compute units{clock}, {_bytes(d.global_mem_bytes)} global and "
            f"{_bytes(d.local_mem_bytes)} local memory, work groups up to "
            f"{d.max_work_group_size}",
            f"  {d.opencl_c_version.strip()}, driver {d.driver_version}; SVM: "
            f"{'/'.join(svm) or 'none'}; fp16: {'yes' if d.fp16 else 'no'}",
        ]
    if info.skipped_platforms:
        lines.append("platforms not used (CODL_OPENCL_PLATFORM picks another):")
        lines += [f"  {s['platform']}: {s['reason']}" for s in info.skipped_platforms]
    else:
        lines.append("platforms not used: none")
    return lines


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run`` and ``info`` to the ``codl-tvm`` subcommands."""
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
    add_run_arguments(p, ".npz to write outputs to, keyed by output names")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare the outputs with the unpartitioned model built for this CPU (an "
        "artifact is always checked against its stored reference unless --inputs is given)",
    )
    p.add_argument(
        "--stream",
        type=int,
        metavar="N",
        help="pipeline artifacts (compile --objective throughput): stream N frames of the "
        "inputs through the stages; report frames/s and per-frame latency (median, p99)",
    )
    p.add_argument(
        "--queue-size", type=int, default=2, help="with --stream: frames waiting per stage"
    )
    p.add_argument(
        "--tracker",
        metavar="HOST:PORT",
        help="run the artifact on a device behind this TVM RPC tracker (its server started "
        "with `codl-tvm serve --opencl` for OpenCL artifacts); --check compares as here",
    )
    p.add_argument("--key", help="with --tracker: the device key")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="with --tracker: seconds to wait for the tracker and a free device",
    )
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("info", help="describe the OpenCL platform and devices in use")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.set_defaults(func=cmd_info)
