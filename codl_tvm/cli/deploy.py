"""``codl-tvm deploy MODEL.onnx --tracker HOST:PORT --key KEY [--target PRESET] [--device D]``.

Compiles the model for a device behind a TVM RPC tracker, runs it there and compares it with
the host (:func:`codl_tvm.objectives.deploy.deploy`). The flags become one
:class:`~codl_tvm.objectives.deploy.DeployOptions`; its errors name the option's fields, which
this command shows as its flags (:data:`FLAGS`).
"""

from __future__ import annotations

import argparse
import re

from codl_tvm.build.targets import PRESETS
from codl_tvm.cli.common import (
    add_run_arguments,
    building,
    check_output_file,
    load_npz,
    save_outputs,
)
from codl_tvm.core.errors import CliError, DeployError
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.objectives.deploy import DEVICES, DeployOptions, deploy

__all__ = ["FLAGS", "cmd_deploy", "register"]

#: The flag of each :class:`DeployOptions` field (the fields named in its error messages).
FLAGS = {
    "tracker": "--tracker",
    "key": "--key",
    "target": "--target",
    "device": "--device",
    "plan": "--plan",
    "dim": "--dim",
    "ratio": "--ratio",
    "cost_model": "--cost-model",
    "number": "--number",
    "repeat": "--repeat",
    "seed": "--seed",
    "request_timeout_s": "--timeout",
    "session_timeout_s": "--session-timeout",
    "atol": "--atol",
    "rtol": "--rtol",
    "plugin": "--plugin",
    "ndk": "--ndk",
}


def as_flags(message: str) -> str:
    """``message`` with every backquoted :class:`DeployOptions` field shown as its flag."""
    return re.sub(r"`(\w+)`", lambda m: FLAGS.get(m.group(1), m.group(0)), message)


def _options(args: argparse.Namespace) -> DeployOptions:
    return DeployOptions(
        args.tracker,
        args.key,
        target=args.target,
        device=args.device,
        plan=args.plan,
        dim=args.dim,
        ratio=args.ratio,
        cost_model=args.cost_model,
        number=args.number,
        repeat=args.repeat,
        seed=args.seed,
        request_timeout_s=args.timeout,
        session_timeout_s=args.session_timeout,
        atol=args.atol,
        rtol=args.rtol,
        plugin=args.plugin,
        ndk=args.ndk,
    )


def cmd_deploy(args: argparse.Namespace) -> int:
    """Deploy, run remotely, compare with the host build and print the remote latency."""
    if args.list_targets:
        for preset in PRESETS.values():
            print(f"{preset.name:18s} {preset.description}")
        return 0
    if not args.model:
        raise CliError("deploy: give an ONNX model (MODEL.onnx)")
    if not args.tracker or not args.key:
        raise CliError("deploy: --tracker HOST:PORT and --key KEY are required")
    check_output_file(args.save_outputs, args.force)
    try:
        options = _options(args)
        model = load_onnx(args.model)
        inputs = load_npz(args.inputs) if args.inputs else None
        with building(args.model, args.device):
            result = deploy(model, options, inputs)
    except DeployError as exc:
        raise DeployError(as_flags(str(exc))) from None
    for spec, arr in zip(model.outputs, result.outputs):
        print(f"output {spec.name}: shape {tuple(arr.shape)} dtype {arr.dtype}")
    if result.run.median_ms is not None:
        emulated = (result.remote_versions or {}).get("emulated")
        print(
            f"remote latency on {result.device}: median {result.run.median_ms:.3f} ms "
            f"(min {result.run.min_ms:.3f}, max {result.run.max_ms:.3f}, "
            f"{result.run.repeats} repeats of {args.number})"
            + (f" [EMULATED ({emulated}): not a hardware latency]" if emulated else "")
        )
    verdict = "matches" if result.matches else "DOES NOT match"
    print(
        f"max abs difference against the host build: {result.max_abs_error:.3g} ({verdict} "
        f"within atol {args.atol:g} + rtol {args.rtol:g})"
    )
    if args.save_outputs:
        save_outputs(args.save_outputs, model, result.outputs, args.force)
    return 0 if result.matches else 1


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``deploy`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "deploy",
        help="compile, upload and run an ONNX model on a device behind a TVM RPC tracker",
        description="Deploy an ONNX model to a device behind a TVM RPC tracker and check it "
        "against the host.",
    )
    p.add_argument("model", nargs="?", help="the ONNX model")
    p.add_argument("--tracker", help="HOST:PORT of the TVM RPC tracker")
    p.add_argument("--key", help="device key registered with the tracker")
    p.add_argument(
        "--target",
        help="target preset (default: from the remote's report); --list-targets shows them",
    )
    p.add_argument("--list-targets", action="store_true", help="list target presets and exit")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="processor(s) to run on (coexec: the GPU and the CPU together)",
    )
    p.add_argument(
        "--plan", help="partition plan (JSON), or 'auto' to plan with the cost model (coexec)"
    )
    p.add_argument("--cost-model", help="cost model for --plan auto (default: the preset's)")
    p.add_argument(
        "--plugin",
        help="OpenCL plugin to upload to a server that has none (default: built for the target)",
    )
    p.add_argument("--ndk", help="Android NDK for building the plugin for android-* targets")
    p.add_argument("--dim", choices=("H", "OC"), help="uniform plan dimension (--device coexec)")
    p.add_argument("--ratio", type=float, help="uniform plan GPU ratio 0..1 (--device coexec)")
    add_run_arguments(p, ".npz to write the remote outputs to", "timing repeats (0: no timing)")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the tracker and a free device",
    )
    p.add_argument(
        "--session-timeout",
        type=float,
        default=600.0,
        help="seconds the remote session may last (0: no limit)",
    )
    p.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance vs the host")
    p.add_argument(
        "--rtol", type=float, default=1e-3, help="tolerance relative to the largest reference value"
    )
    p.set_defaults(func=cmd_deploy)
