"""``codl-tvm profile``: measure operator parts and sharing costs into a latency dataset.

Examples
--------
Locally, 20 CoDL-sampled convolutions at three ratios along H and OC::

    codl-tvm profile --sample 20 --ratios 0,0.5,1 --dims H,OC -o data/local.jsonl

The operators of a model, compiled here and measured on another machine::

    codl-tvm profile --model m.onnx --compile-dir build/prof --preset P --threads 8  # here
    codl-tvm profile --run-dir build/prof -o data/device.jsonl   # there (directory copied)

Through a TVM RPC tracker (the server must load the codl-tvm runtime plugin)::

    codl-tvm profile --sample 20 --rpc 127.0.0.1:9190 --rpc-key soc -o data/soc.jsonl

Over every free device of the key in parallel (a device farm; a job whose device fails is
retried on another)::

    codl-tvm profile --sample 20 --rpc 127.0.0.1:9190 --rpc-key soc --farm -o data/soc.jsonl

The CPU kernels that builds for the CPU alone use (Winograd and channel-packed convs), into
their own dataset, fitted together with the direct one::

    codl-tvm profile --sample 20 --winograd --packed -o data/local-algos.jsonl
    codl-tvm cost-model fit data/local.jsonl data/local-algos.jsonl --kind gbdt -o m.json

The GPU data type of this machine's OpenCL device, buffers against images on common operators
(:mod:`codl_tvm.profiling.data_type`), into a copy of a cost model (``meta["gpu_data_type"]``,
which ``compile`` then follows on this device) or a file of its own::

    codl-tvm profile --data-type --cost-model m.json --out m-images.json
    codl-tvm profile --data-type --out gpu-data-type.json
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from codl_tvm.core.errors import CliError, ProfileError
from codl_tvm.cost_model.base import CostModel
from codl_tvm.cost_model.defaults import cost_model_path
from codl_tvm.cost_model.features import DIMS
from codl_tvm.cost_model.part_ir import algorithm_switches
from codl_tvm.profiling.data_type import (
    META_KEY,
    OPERATORS,
    operators_named,
    profile_data_type,
    write_record,
    write_with_record,
)
from codl_tvm.profiling.farm import FarmOptions, profile_farm
from codl_tvm.profiling.profile import (
    compile_jobs,
    make_jobs,
    model_ops,
    profile,
    run_compiled,
    sampled_ops,
)
from codl_tvm.profiling.sessions import LocalSession, RPCSession
from codl_tvm.profiling.timing import TimingConfig
from codl_tvm.rpc.client import request_remote
from codl_tvm.runtime.threads import pin_tvm_threads

__all__ = ["cmd_profile", "register"]


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"ratios must be numbers in [0, 1], got {text!r}")
    return values


def _dims(text: str) -> tuple[str, ...]:
    dims = tuple(d.strip() for d in text.split(",") if d.strip())
    bad = [d for d in dims if d not in DIMS]
    if not dims or bad:
        raise argparse.ArgumentTypeError(f"dims must be among {DIMS}, got {text!r}")
    return dims


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure operator parts (and sharing costs) into a dataset, or compile them for later."""
    # imported here: the schedules need TVM's compiler, and `profile --run-dir` runs on devices
    # with a runtime-only TVM
    from codl_tvm.schedules import cpu_alone_settings, packed_enabled, winograd_enabled

    if args.data_type:
        return _profile_data_type(args)
    for flag, given in (("--cost-model", args.cost_model), ("--data-type-ops", args.data_type_ops)):
        if given:
            raise CliError(f"{flag} goes with --data-type")
    if args.cpu_alone and not (args.winograd or args.packed):
        raise CliError(
            "--cpu-alone changes only the Winograd and packed CPU kernels: add --winograd "
            "and/or --packed"
        )
    with (
        winograd_enabled("all") if args.winograd else contextlib.nullcontext(),
        packed_enabled("all") if args.packed else contextlib.nullcontext(),
        cpu_alone_settings(args.cpu_alone),
    ):
        return _profile(args)


def _profile(args: argparse.Namespace) -> int:
    try:
        timing = TimingConfig(
            args.warmup, args.repeats, args.number, args.flush_weights, args.min_repeat_ms
        )
    except ValueError as exc:  # TimingConfig checks its numbers with plain ValueErrors
        raise CliError(str(exc)) from None
    sharing = () if args.no_sharing else args.sharing_sizes
    meta = {"command": "codl-tvm profile", "seed": args.seed, "sampler": args.sampler}
    if args.flush_weights:
        meta["flush_weights"] = True
    if algorithm_switches():
        meta["algorithms"] = algorithm_switches()
    remote = None
    try:
        if args.tvm_cpus:
            _pin(args)
        if args.run_dir:
            if args.model or args.sample:
                raise ProfileError("--run-dir measures a prepared directory; drop --model/--sample")
            if args.winograd or args.packed or args.cpu_alone:
                raise ProfileError(
                    "--winograd/--packed/--cpu-alone choose how parts are compiled; --run-dir "
                    "measures the parts its directory holds (their manifest records the "
                    "switches): drop them"
                )
            if not args.output:
                raise ProfileError("--run-dir needs -o DATA.jsonl")
            session = LocalSession()
            if args.rpc:
                remote = _connect(args)
                session = RPCSession(remote.session)
            counts = run_compiled(args.run_dir, args.output, session, timing, sharing, meta)
            _report(counts, args.output)
            return 0
        ops = []
        if args.model:
            ops += model_ops(args.model)
        if args.sample:
            ops += sampled_ops(args.sample, args.seed, args.sampler, args.max_gflops)
        if not ops:
            raise ProfileError("nothing to profile: give --model M.onnx and/or --sample N")
        jobs = make_jobs(ops, args.dims, args.ratios)
        if args.compile_dir:
            path = compile_jobs(jobs, args.compile_dir, threads=args.threads, preset=args.preset)
            print(f"compiled {len(jobs)} parts into {path.parent} (run it with --run-dir)")
            return 0
        if not args.output:
            raise ProfileError("-o DATA.jsonl is required (or --compile-dir DIR)")
        if args.farm:
            return _profile_farm(args, jobs, timing, sharing, meta)
        session = LocalSession()
        if args.rpc:
            remote = _connect(args)
            session = RPCSession(remote.session)
        counts = profile(jobs, args.output, session, args.work_dir, timing, sharing, meta=meta)
        _report(counts, args.output)
        return 0
    finally:
        if remote is not None:
            remote.close()


def _profile_data_type(args: argparse.Namespace) -> int:
    """``--data-type``: buffers against images on this machine's OpenCL device, recorded."""
    others = [
        flag
        for flag, given in (
            ("--model", args.model),
            ("--sample", args.sample),
            ("--compile-dir", args.compile_dir),
            ("--run-dir", args.run_dir),
            ("--rpc", args.rpc),
            ("--farm", args.farm),
            ("--winograd", args.winograd),
            ("--packed", args.packed),
            ("--cpu-alone", args.cpu_alone),
        )
        if given
    ]
    if others:
        raise CliError(
            f"--data-type measures this machine's OpenCL device on its own operators; drop "
            f"{', '.join(others)}"
        )
    if not args.output:
        raise CliError(
            "--data-type needs --out FILE.json: the record, or with --cost-model M the copy of M "
            "that carries it"
        )
    out = Path(args.output)
    if out.exists():
        raise CliError(f"--out {out} exists; give a new file (nothing is overwritten)")
    source = None
    if args.cost_model:
        source = cost_model_path(args.cost_model)
        CostModel.load(source)  # a file that is no cost model fails now, not after measuring
    operators = operators_named(args.data_type_ops) if args.data_type_ops else OPERATORS
    if args.tvm_cpus:
        _pin(args)
    record = profile_data_type(operators, args.repeats, args.preset or "opencl", args.work_dir)
    if source is None:
        write_record(record, out)
        print(f"GPU data type {record.data_type}: wrote {out}")
    else:
        write_with_record(source, record, out)
        print(f"GPU data type {record.data_type}: wrote {out}, {source.name} with meta.{META_KEY}")
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


#: The flag of each FarmOptions field that ``--farm`` sets.
_FARM_FLAGS = {
    "tracker": "--rpc",
    "key": "--rpc-key",
    "sharing_sizes": "--sharing-sizes",
    "job_timeout_s": "--job-timeout",
    "retries": "--retries",
    "request_timeout_s": "--rpc-timeout",
}


def _profile_farm(args, jobs, timing, sharing, meta) -> int:
    """``--farm``: spread the jobs over every free device of ``--rpc-key``."""
    if not args.rpc or not args.rpc_key:
        raise CliError("--farm needs --rpc HOST:PORT and --rpc-key KEY")
    try:
        options = FarmOptions(
            args.rpc,
            args.rpc_key,
            timing=timing,
            sharing_sizes=tuple(sharing),
            preset=args.preset,
            job_timeout_s=args.job_timeout,
            retries=args.retries,
            request_timeout_s=args.rpc_timeout,
            work_dir=args.work_dir,
        )
    except ProfileError as exc:  # it names FarmOptions' fields: show them as the flags
        text = str(exc)
        for name, flag in _FARM_FLAGS.items():
            text = text.replace(f"`{name}`", flag)
        raise ProfileError(text) from None
    counts = profile_farm(jobs, args.output, options, meta)
    _report(counts, args.output)
    return 0


def _pin(args) -> None:
    if args.rpc:
        raise ProfileError("--tvm-cpus pins this machine's threads; drop it with --rpc")
    try:
        pin_tvm_threads(args.tvm_cpus)
    except ValueError as exc:
        raise ProfileError(f"--tvm-cpus {exc}") from None


def _connect(args):
    if not args.rpc_key:
        raise CliError("--rpc needs --rpc-key KEY")
    return request_remote(args.rpc, args.rpc_key, timeout_s=args.rpc_timeout)


def _report(counts: dict[str, int], output) -> None:
    print(
        f"measured {counts['measured']} parts ({counts['skipped']} already in the dataset), "
        f"{counts['sharing']} sharing records; wrote {output}"
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile`` to the ``codl-tvm`` subcommands."""
    p = sub.add_parser(
        "profile",
        help="measure operator parts on GPU and CPU and data-sharing costs into a dataset",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--model", help="profile the partitionable operators of this ONNX model")
    p.add_argument("--sample", type=int, default=0, help="profile N sampled conv2d shapes")
    p.add_argument("--sampler", choices=("codl", "pow2"), default="codl")
    p.add_argument("--max-gflops", type=float, default=2.0, help="reject sampled shapes above this")
    p.add_argument("--ratios", type=_floats, default=(0.0, 0.25, 0.5, 0.75, 1.0))
    p.add_argument("--dims", type=_dims, default=("H", "OC"))
    p.add_argument(
        "-o",
        "--output",
        "--out",
        help="dataset to write or resume (.jsonl); with --data-type the record's new file",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--compile-dir", help="only compile the parts into DIR (run with --run-dir)")
    g.add_argument("--run-dir", help="measure the parts compiled into DIR")
    p.add_argument(
        "--preset",
        help="with --compile-dir or --farm: target preset of the device (codl_tvm.build.targets)",
    )
    p.add_argument(
        "--threads", type=int, help="with --compile-dir: CPU threads of the device (recorded)"
    )
    p.add_argument("--work-dir", help="keep the built libraries here (default: temporary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--repeats",
        type=int,
        default=10,
        help="timed samples per part (the median is kept, with the fastest and slowest)",
    )
    p.add_argument(
        "--number", type=int, default=1, help="runs per sample at least (see --min-repeat-ms)"
    )
    p.add_argument(
        "--min-repeat-ms",
        type=float,
        default=2.0,
        help="run each sample enough times to last this long (ms; a probe run sizes it; 0: "
        "exactly --number). The timing settings are one per dataset: a resume must match them "
        "(datasets from before they were recorded: --repeats 5 --number 3 --min-repeat-ms 0)",
    )
    p.add_argument(
        "--flush-weights",
        action="store_true",
        help="time CPU parts one run at a time with their weights flushed from the caches "
        "first, as inside a whole model (a dataset keeps one setting)",
    )
    p.add_argument(
        "--sharing-sizes",
        type=_ints,
        default=(4096, 65536, 1 << 20, 1 << 22),
        help="bytes at which transform/map/unmap are measured",
    )
    p.add_argument("--no-sharing", action="store_true", help="skip the sharing costs")
    p.add_argument(
        "--winograd",
        action="store_true",
        help="build conv parts with the algorithm an imported model's conv gets with Winograd on "
        "where the presets allow (weight an input in the transformed layout); the records name "
        "the algorithm each part got",
    )
    p.add_argument(
        "--packed",
        action="store_true",
        help="likewise with channel-packed CPU convs on (one algorithm setting per dataset)",
    )
    p.add_argument(
        "--cpu-alone",
        action="store_true",
        help="with --winograd/--packed: build those kernels with the settings of builds for the "
        "CPU alone (CPU_ALONE_SETTINGS); a cost model fitted with such a dataset makes "
        "co-executed builds use these kernels too",
    )
    p.add_argument(
        "--tvm-cpus",
        help="pin TVM's CPU thread pool to cores LO-HI (one worker per core), as the emulated "
        "SoC's benchmarks do (PoCL on the other cores with POCL_AFFINITY=1); local runs only",
    )
    p.add_argument("--rpc", help="measure through a TVM RPC tracker HOST:PORT")
    p.add_argument("--rpc-key", help="device key at the tracker")
    p.add_argument("--rpc-timeout", type=float, default=30.0)
    p.add_argument(
        "--farm",
        action="store_true",
        help="measure on every free device of --rpc-key in parallel (a device farm)",
    )
    p.add_argument("--job-timeout", type=float, default=300.0, help="seconds per job (--farm)")
    p.add_argument("--retries", type=int, default=2, help="extra attempts per failed job (--farm)")
    p.add_argument(
        "--data-type",
        action="store_true",
        help="measure this machine's OpenCL device's GPU data type instead: common operators "
        "built for the GPU alone with buffers and with images, timed round-robin (--repeats "
        "rounds, the median kept); images are kept only where clearly faster (geometric mean "
        "below 0.95x); a device without images records buffers and why. Written to --out, "
        "or with --cost-model into a copy of that model (meta.gpu_data_type), which compile "
        "follows on this device",
    )
    p.add_argument(
        "--cost-model",
        help="with --data-type: the cost model (a file or a shipped model's name) to copy to "
        "--out with the record (the file itself is never changed)",
    )
    p.add_argument(
        "--data-type-ops",
        type=_names,
        metavar="NAMES",
        help=f"with --data-type: only these operators ({', '.join(o.name for o in OPERATORS)})",
    )
    p.set_defaults(func=cmd_profile)
