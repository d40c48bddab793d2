"""Whole-model CPU latency: codl-tvm's CPU path against onnxruntime on the same threads.

onnx's light models with seeded random weights, or the paper's models (``posenet``, ``yolov2``,
...: :mod:`codl_tvm.frontend.zoo`). By default weights are inputs of the compiled
library so it stays small enough to carry. Compile here, run on the device machine:

    python scripts/bench_cpu_models.py compile --out .device/cpu_models
    python scripts/bench_cpu_models.py run --dir .device/cpu_models --threads 8 \\
        --rounds 5 --out out/cpu_models.json

Weights as inputs hide them from build-time folding that onnxruntime (which gets them as
initializers) does: batch norms cannot fold into the convs (ResNet50: 53 extra kernels).
``compile --constant-weights`` builds what a user's ``codl-tvm compile`` builds (weights constant,
batch norms folded); its libraries are large (VGG19 ~550 MB), so compile on the device machine.
``compile --cpu-config conv1x1_pad_pixels=false`` builds a variant with one CPU schedule
parameter changed (:func:`codl_tvm.schedules.cpu_overrides`), for A/B runs on one machine;
``--winograd`` one with Winograd 3x3 convs (what ``codl-tvm compile --winograd`` builds),
``--packed`` one with channel-packed convs; both together are what ``codl-tvm compile --device
cpu`` builds for an AVX-512 CPU.
``layers`` lists where the time goes: each TVM kernel's time and onnxruntime's per-node times
on the same cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _model(name: str):
    """The ONNX model benchmarked as ``name``: an onnx light model with seeded weights, or one
    of the paper's models (:mod:`codl_tvm.frontend.zoo`) as the planner benchmark builds it. Gemm
    weights are stored pre-transposed, so no transpose runs per inference when weights are
    library inputs (constant folding removes it for constants)."""
    from codl_tvm.frontend.models import (
        LIGHT_MODELS,
        benchmark_model,
        light_model,
        pretranspose_gemm_weights,
    )

    model = light_model(name, seed=3) if name in LIGHT_MODELS else benchmark_model(name)
    return pretranspose_gemm_weights(model)


def _cpu_config_fields(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings as CPUConfig overrides (true/false, integers, else strings)."""
    fields: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--cpu-config {item!r}: expected KEY=VALUE")
        low = value.lower()
        if low in ("true", "false"):
            fields[key] = low == "true"
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                fields[key] = value
    return fields


def cmd_compile(args: argparse.Namespace) -> None:
    import tvm
    from codl_tvm.schedules import (
        cpu_alone_settings,
        cpu_overrides,
        packed_enabled,
        winograd_enabled,
    )
    from tvm.relax.frontend.onnx import from_onnx

    from codl_tvm.build.pipeline import single_device_pipeline

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu})
    overrides = _cpu_config_fields(args.cpu_config)
    suffix = f"-{args.tag}" if args.tag else ""
    manifest = {}
    for name in args.models.split(","):
        mod = from_onnx(_model(name), keep_params_in_input=not args.constant_weights)
        main = mod["main"]
        n_in = int(main.attrs["num_input"])
        with (
            cpu_overrides(**overrides),
            winograd_enabled(args.winograd or ()),
            packed_enabled(args.packed or ()),
            cpu_alone_settings(args.cpu_alone),
        ):
            ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
        library = f"{name}{suffix}_cpu.so"
        ex.export_library(str(out / library))
        manifest[f"{name}{suffix}"] = {
            "model": name,
            "library": library,
            "inputs": [[p.name, [int(v) for v in p.ty.shape.values]] for p in main.params[:n_in]],
            "params": [p.name for p in main.params[n_in:]],
            "cpu_config": {
                **overrides,
                **({"winograd": True} if args.winograd else {}),
                **({"conv_packed": True} if args.packed else {}),
                **({"cpu_alone_settings": True} if args.cpu_alone else {}),
            },
        }
        print("compiled", name, args.tag or "", flush=True)
    # One manifest per tag, merged under a lock: variants and models can be compiled into one
    # directory at the same time (processes that overwrote it lost each other's entries).
    import fcntl

    with open(out / ".manifest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = out / f"manifest{suffix}.json"
        merged = json.loads(path.read_text()) if path.exists() else {}
        merged.update(manifest)
        path.write_text(json.dumps(merged, indent=2))


def _pin_tvm(threads: int) -> list[int]:
    """TVM's thread pool: ``threads`` workers on cores 0..threads-1 (returns those cores).

    TVM sizes its pool from ``TVM_NUM_THREADS`` when first used: without it the pool has a
    worker per core of the machine, pinned onto the given cores (measured 1.2-1.5x slower on
    the device machine)."""
    os.environ["TVM_NUM_THREADS"] = str(threads)
    import tvm

    cpus = list(range(threads))
    tvm.get_global_func("runtime.config_threadpool")(-2, threads, [str(c) for c in cpus])
    return cpus


def _manifest(root: Path) -> dict:
    """Every library of a compile directory (one manifest per tag)."""
    manifest: dict = {}
    for path in sorted(root.glob("manifest*.json")):
        manifest.update(json.loads(path.read_text()))
    return manifest


def _feeds(entry: dict) -> dict[str, np.ndarray]:
    """The seeded inputs of a manifest entry, by ONNX input name."""
    rng = np.random.default_rng(11)
    return {
        n: rng.random(shape, dtype=np.float64).astype("float32") for n, shape in entry["inputs"]
    }


def _vm_args(entry: dict, proto, feeds: dict, dev) -> list:
    """The library's arguments: the inputs, then the weights it takes as inputs (if any)."""
    import tvm
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    args = [tvm.runtime.tensor(feeds[n], dev) for n, _ in entry["inputs"]]
    return args + [tvm.runtime.tensor(init[p], dev) for p in entry["params"]]


def _ort_ms(sess, feeds: dict, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def cmd_run(args: argparse.Namespace) -> None:
    """Check every library against onnxruntime, then time them in ``--rounds`` rounds: each
    library once (``--number`` runs), then onnxruntime on each model (same cores, same
    thread count), with a pause before each onnxruntime session and after the last.
    Medians over rounds, so the machine's drift favours neither a variant nor onnxruntime;
    ``paired_ratio`` is the median of the per-round ratios.

    The pauses (``--switch-s``) matter: both runtimes' thread pools spin after a run, and on
    the device machine onnxruntime timed right after TVM measured 2-3x slower than alone
    (ResNet50 36 vs 17 ms). Timed once after all TVM rounds instead of in every round,
    onnxruntime's ResNet50 median moved from 10.7 to 15.3 ms between runs minutes apart on one
    machine.
    """
    cpus = _pin_tvm(args.threads)
    import onnxruntime as ort
    import tvm
    from bench_util import envelope, write_json
    from tvm.runtime.vm import VirtualMachine

    root = Path(args.dir)
    manifest = _manifest(root)
    dev = tvm.cpu(0)
    models: dict[str, tuple] = {}  # model name -> (ONNX model, feeds, reference output)
    timed: dict[str, tuple] = {}  # entry -> (vm, args)
    rows: dict[str, dict] = {}
    for key, entry in manifest.items():
        name = entry.get("model", key)
        if name not in models:
            proto = _model(name)
            feeds = _feeds(entry)
            sess = ort.InferenceSession(
                proto.SerializeToString(), providers=["CPUExecutionProvider"]
            )
            models[name] = (proto, feeds, sess.run(None, feeds)[0])
            del sess
        proto, feeds, ref = models[name]
        library = root / entry.get("library", f"{key}_cpu.so")
        vm = VirtualMachine(tvm.runtime.load_module(str(library)), dev)
        vm_args = _vm_args(entry, proto, feeds, dev)
        out = vm["main"](*vm_args)
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        err = float(np.max(np.abs(got.reshape(ref.shape) - ref)) / max(np.max(np.abs(ref)), 1e-12))
        timed[key] = (vm, vm_args)
        rows[key] = {"model": name, "max_rel_err": err, "cpu_config": entry.get("cpu_config", {})}
    os.sched_setaffinity(0, cpus)  # onnxruntime's threads on TVM's cores
    sessions = {}
    for name, (proto, feeds, _) in models.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        sessions[name] = ort.InferenceSession(
            proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
    samples: dict[str, list[float]] = {k: [] for k in timed}
    ort_samples: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for key, (vm, vm_args) in timed.items():
            res = vm.time_evaluator("main", dev, number=args.number, repeat=1)(*vm_args)
            samples[key].append(float(res.mean) * 1e3)
        for name, sess in sessions.items():
            # after TVM's pool and each session's own pool: one session's threads spinning
            # on the cores of the next made onnxruntime 2x slower
            time.sleep(args.switch_s)
            feeds = models[name][1]
            _ort_ms(sess, feeds, 1)  # warm-up after the switch
            ort_samples[name].append(_ort_ms(sess, feeds, args.number))
        time.sleep(args.switch_s)
    timed.clear()
    ort_ms = {name: float(np.median(v)) for name, v in ort_samples.items()}
    for key, row in rows.items():
        tvm_ms = float(np.median(samples[key]))
        ort_rounds = ort_samples[row["model"]]
        row.update(
            codl_tvm_cpu_ms=tvm_ms,
            onnxruntime_ms=ort_ms[row["model"]],
            ratio=tvm_ms / ort_ms[row["model"]],
            # per round, against onnxruntime timed in the same round: slow drift cancels
            paired_ratio=float(np.median([t / o for t, o in zip(samples[key], ort_rounds)])),
            min_ratio=min(samples[key]) / min(ort_rounds),
            samples_ms=samples[key],
            onnxruntime_samples_ms=ort_rounds,
        )
        print(
            f"{key:24s} codl-tvm {tvm_ms:8.2f} ms  onnxruntime {ort_ms[row['model']]:8.2f} ms  "
            f"x{row['ratio']:.2f} (paired x{row['paired_ratio']:.2f}, min x{row['min_ratio']:.2f})"
            f"  err {row['max_rel_err']:.1e}",
            flush=True,
        )
    write_json(
        args.out,
        envelope(
            sys.argv,
            {"threads": args.threads, "rounds": args.rounds, "models": rows},
            env={"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS")},
        ),
    )


def cmd_layers(args: argparse.Namespace) -> None:
    """Per-kernel time of the CPU libraries, and onnxruntime's per-node time, on the same cores.

    TVM 0.27's Relax VM has no profiler; its instrument hook is called before and after every
    call, and a CPU kernel returns when it is done, so the time between the two calls is the
    kernel's (plus a few microseconds of Python). Median of ``--runs`` runs per kernel.
    onnxruntime's own profiler gives its per-node times (``dur``, us).
    """
    cpus = _pin_tvm(args.threads)
    import onnxruntime as ort
    import tvm
    import tvm_ffi
    from bench_util import envelope, write_json
    from tvm.runtime.vm import VirtualMachine

    root = Path(args.dir)
    manifest = _manifest(root)
    wanted = args.models.split(",") if args.models else list(manifest)
    dev = tvm.cpu(0)
    out: dict[str, dict] = {}
    for key in wanted:
        entry = manifest[key]
        proto = _model(entry.get("model", key))
        vm = VirtualMachine(tvm.runtime.load_module(str(root / entry["library"])), dev)
        vm_args = _vm_args(entry, proto, _feeds(entry), dev)
        vm["main"](*vm_args)  # warm-up
        samples: dict[str, list[float]] = {}
        shapes: dict[str, list] = {}
        started: dict[str, float] = {}

        def instrument(func, name, before, ret, *call_args):
            now = time.perf_counter()
            if before:
                started[name] = now
                if name not in shapes:
                    shapes[name] = [list(a.shape) for a in call_args if hasattr(a, "shape")]
            elif name in started:
                samples.setdefault(name, []).append((now - started.pop(name)) * 1e3)
            return 0

        vm.set_instrument(tvm_ffi.convert(instrument))
        for _ in range(args.runs):
            vm["main"](*vm_args)
        # one sample per call site and run; a kernel called n times per run has n per run
        kernels = sorted(
            (
                {
                    "kernel": name,
                    "calls_per_run": len(v) // args.runs,
                    "ms_per_run": float(np.median(v)) * len(v) / args.runs,
                    "arg_shapes": shapes.get(name, []),
                }
                for name, v in samples.items()
            ),
            key=lambda k: -k["ms_per_run"],
        )
        total = sum(k["ms_per_run"] for k in kernels)
        out[key] = {"model": entry.get("model", key), "kernels_ms": total, "kernels": kernels}
        print(f"{key}: {total:.2f} ms in {len(kernels)} kernels", flush=True)
        for k in kernels[: args.top]:
            print(f"  {k['ms_per_run']:8.3f} ms  {k['kernel']}  {k['arg_shapes']}", flush=True)
    os.sched_setaffinity(0, cpus)
    time.sleep(1.0)  # let TVM's pool stop spinning
    for key in wanted:
        name = out[key]["model"]
        if "onnxruntime_nodes" in next((v for v in out.values() if v["model"] == name), {}):
            continue
        proto = _model(name)
        feeds = _feeds(manifest[key])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(args.out).with_suffix("")) + f"-ort-{name}"
        sess = ort.InferenceSession(
            proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        for _ in range(args.runs + 1):
            sess.run(None, feeds)
        profile = Path(sess.end_profiling())
        trace = json.loads(profile.read_text())
        profile.unlink()  # the per-node summary below is what is kept
        nodes: dict[str, list[float]] = {}
        kinds: dict[str, str] = {}
        for ev in trace:
            if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
                node = ev["name"][: -len("_kernel_time")]
                nodes.setdefault(node, []).append(ev["dur"] / 1e3)
                kinds[node] = ev.get("args", {}).get("op_name", "")
        rows = sorted(
            (
                {"node": n, "op": kinds[n], "ms_per_run": float(np.median(v[1:] or v))}
                for n, v in nodes.items()
            ),
            key=lambda r: -r["ms_per_run"],
        )
        out[key]["onnxruntime_nodes"] = rows
        out[key]["onnxruntime_nodes_ms"] = sum(r["ms_per_run"] for r in rows)
        print(f"{name} onnxruntime: {out[key]['onnxruntime_nodes_ms']:.2f} ms in nodes")
    write_json(
        args.out,
        envelope(sys.argv, {"threads": args.threads, "runs": args.runs, "models": out}),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="squeezenet,bvlc_alexnet,resnet50,inception_v1,vgg19")
    p.add_argument("--mcpu", default="skylake-avx512")
    p.add_argument(
        "--constant-weights",
        action="store_true",
        help="weights as constants of the library (folded at build time, as in `codl-tvm compile`)",
    )
    p.add_argument(
        "--cpu-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="CPUConfig field override for every CPU preset (A/B builds), repeatable",
    )
    p.add_argument("--tag", default="", help="name suffix of this variant's libraries")
    p.add_argument(
        "--cpu-alone",
        action="store_true",
        help="the CPUConfig settings of builds for the CPU alone (CPU_ALONE_SETTINGS), as "
        "`codl-tvm compile --device cpu` builds them; --cpu-config overrides them",
    )
    p.add_argument(
        "--winograd",
        action="store_const",
        const=("avx2", "avx512", "neon"),
        help="Winograd for qualifying 3x3 convs (codl-tvm compile --winograd)",
    )
    p.add_argument(
        "--packed",
        action="store_const",
        const=("avx2", "avx512", "neon"),
        help="channel-packed convs (codl-tvm compile --packed)",
    )
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run")
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--number", type=int, default=3, help="runs averaged per sample")
    p.add_argument("--rounds", type=int, default=5, help="round-robin samples per library")
    p.add_argument(
        "--switch-s",
        type=float,
        default=1.0,
        help="pause before each onnxruntime session in a round and after the last (pools spin)",
    )
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("layers", help="per-kernel times (TVM) and per-node times (onnxruntime)")
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="", help="manifest entries (default: all)")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=12, help="kernels printed per model")
    p.set_defaults(func=cmd_layers)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
