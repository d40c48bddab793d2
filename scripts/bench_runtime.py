"""Benchmark the OpenCL runtime plugin.

Measures, per OpenCL platform (one process each, since selection is per process):
  * onnx's light models (seeded random weights) on OpenCL, with max error against onnxruntime;
  * per-launch overhead of a tiny kernel through the plugin against pyopencl's;
  * cold start (process start to first output) with an empty and a warm program cache.

Compile here (full TVM), run on the device machine (runtime-only TVM):

    python scripts/bench_runtime.py compile --out .device/runtime
    # on the device machine:
    python scripts/bench_runtime.py all --dir .device/runtime --platforms nvidia,portable \\
        --out out/runtime.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TINY_SRC = "__kernel void tiny(__global float* y) { y[get_global_id(0)] += 1.0f; }"
TINY_FUNCS = {"tiny": (["handle"], ["blockIdx.x", "threadIdx.x"])}


def cmd_compile(args: argparse.Namespace) -> None:
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    from codl_tvm.build.pipeline import single_device_pipeline
    from codl_tvm.frontend.models import light_model
    from codl_tvm.runtime.plugin_build import build_plugin

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(build_plugin(), out / "libcodl_tvm_opencl.so")
    host = {"kind": "llvm", "mcpu": args.mcpu} if args.mcpu else {"kind": "llvm"}
    target = tvm.target.Target({"kind": "opencl"}, host=host)
    manifest = {"models": {}, "target": str(target)}
    for name in args.models.split(","):
        proto = light_model(name, seed=3)
        mod = from_onnx(proto, keep_params_in_input=True)
        main = mod["main"]
        n_in = int(main.attrs["num_input"])
        params = [p.name for p in main.params[n_in:]]
        inputs = [(p.name, [int(v) for v in p.ty.shape.values]) for p in main.params[:n_in]]
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
        ex.export_library(str(out / f"{name}_opencl.so"))
        manifest["models"][name] = {
            "inputs": inputs,
            "params": params,
            "compile_s": time.perf_counter() - t0,
        }
        print(f"compiled {name} ({len(params)} params)", flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _model_args(name: str, entry: dict, dev):
    import tvm
    from onnx import numpy_helper

    from codl_tvm.frontend.models import light_model

    proto = light_model(name, seed=3)
    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    rng = np.random.default_rng(11)
    feeds = {
        n: rng.random(shape, dtype=np.float64).astype("float32") for n, shape in entry["inputs"]
    }
    args = [tvm.runtime.tensor(feeds[n], dev) for n, _ in entry["inputs"]]
    args += [tvm.runtime.tensor(init[p], dev) for p in entry["params"]]
    return proto, feeds, args


def _reference(proto, feeds):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def cmd_run(args: argparse.Namespace) -> None:
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm import runtime
    from codl_tvm.profiling.stats import time_host_us

    runtime.load(platform=args.platform)
    info = runtime.info()
    dev = tvm.opencl(0)
    result = {
        "platform": info.platform,
        "device": info.devices[0].name,
        "compute_units": info.devices[0].compute_units,
        "svm_mode": info.svm_mode,
        "models": {},
    }
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    for name, entry in manifest["models"].items():
        lib = tvm.runtime.load_module(str(Path(args.dir) / f"{name}_opencl.so"))
        vm = VirtualMachine(lib, dev)
        proto, feeds, vm_args = _model_args(name, entry, dev)
        out = vm["main"](*vm_args)
        got = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
        ref = _reference(proto, feeds)
        err = None
        if ref is not None:
            err = float(
                np.max(np.abs(got.reshape(ref[0].shape) - ref[0]))
                / max(float(np.max(np.abs(ref[0]))), 1e-12)
            )
        res = vm.time_evaluator("main", dev, number=args.number, repeat=args.repeat)(*vm_args)
        times = [r * 1e3 for r in res.results]
        result["models"][name] = {
            "median_ms": float(np.median(times)),
            "min_ms": float(np.min(times)),
            "repeats": len(times),
            "number": args.number,
            "max_rel_err_vs_onnxruntime": err,
        }
        print(
            f"{info.platform[:20]:20s} {name:14s} {np.median(times):9.3f} ms  err {err}", flush=True
        )
    # Per-launch overhead of a tiny kernel: enqueue only, and launch + finish.
    mod = runtime.opencl_module_from_source(TINY_SRC, TINY_FUNCS)
    y = tvm.runtime.tensor(np.zeros(64, np.float32), dev)
    f = mod["tiny"]
    launch = time_host_us(lambda: f(y, 1, 64), repeat=2000, warmup=200)
    dev.sync()
    launch_sync = time_host_us(lambda: (f(y, 1, 64), dev.sync()), repeat=2000, warmup=200)
    result["tiny_kernel_plugin"] = {"enqueue": launch, "enqueue_and_finish": launch_sync}
    result["tiny_kernel_pyopencl"] = _pyopencl_launch(info.platform)
    print(
        json.dumps({k: result[k] for k in ("tiny_kernel_plugin", "tiny_kernel_pyopencl")}),
        flush=True,
    )
    Path(args.out).write_text(json.dumps(result, indent=2))


def _pyopencl_launch(platform_name: str) -> dict | None:
    try:
        import pyopencl as cl
    except ImportError:
        return None
    from codl_tvm.profiling.stats import time_host_us

    plats = [p for p in cl.get_platforms() if p.name == platform_name]
    if not plats:
        return None
    ctx = cl.Context(plats[0].get_devices()[:1])
    q = cl.CommandQueue(ctx)
    prog = cl.Program(ctx, TINY_SRC).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 256)
    knl = prog.tiny
    knl.set_args(buf)

    def launch():
        cl.enqueue_nd_range_kernel(q, knl, (64,), (64,))

    enqueue = time_host_us(launch, repeat=2000, warmup=200)
    q.finish()
    both = time_host_us(lambda: (launch(), q.finish()), repeat=2000, warmup=200)
    return {"enqueue": enqueue, "enqueue_and_finish": both}


def cmd_coldstart(args: argparse.Namespace) -> None:
    """Run in a fresh process: time to the first output of one model."""
    t0 = time.perf_counter()
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm import runtime

    runtime.load(platform=args.platform, program_cache_dir=args.cache_dir)
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    entry = manifest["models"][args.model]
    dev = tvm.opencl(0)
    t_import = time.perf_counter()
    lib = tvm.runtime.load_module(str(Path(args.dir) / f"{args.model}_opencl.so"))
    vm = VirtualMachine(lib, dev)
    _, _, vm_args = _model_args(args.model, entry, dev)
    t_load = time.perf_counter()
    vm["main"](*vm_args)
    dev.sync()
    t_first = time.perf_counter()
    vm["main"](*vm_args)
    dev.sync()
    t_second = time.perf_counter()
    print(
        json.dumps(
            {
                "import_ms": (t_import - t0) * 1e3,
                "load_ms": (t_load - t_import) * 1e3,
                "first_run_ms": (t_first - t_load) * 1e3,
                "second_run_ms": (t_second - t_first) * 1e3,
                "cache": runtime.cache_stats(),
            }
        )
    )


def cmd_all(args: argparse.Namespace) -> None:
    from bench_util import envelope, write_json

    results = {}
    script = str(Path(__file__).resolve())
    for plat in args.platforms.split(","):
        tmp = Path(tempfile.mkdtemp()) / "run.json"
        cmd = [
            sys.executable,
            script,
            "run",
            "--dir",
            args.dir,
            "--platform",
            plat,
            "--out",
            str(tmp),
            "--number",
            str(args.number),
            "--repeat",
            str(args.repeat),
        ]
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=args.timeout)
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            results[plat] = {"error": proc.stderr[-2000:]}
            sys.stderr.write(proc.stderr[-2000:])
            continue
        results[plat] = json.loads(tmp.read_text())
        cold = {}
        cache = Path(tempfile.mkdtemp())
        for label in ("empty_cache", "warm_cache"):
            runs = []
            for _ in range(args.cold_repeats if label == "warm_cache" else 1):
                if label == "empty_cache":
                    shutil.rmtree(cache, ignore_errors=True)
                t0 = time.perf_counter()
                p = subprocess.run(
                    [
                        sys.executable,
                        script,
                        "coldstart",
                        "--dir",
                        args.dir,
                        "--platform",
                        plat,
                        "--model",
                        args.cold_model,
                        "--cache-dir",
                        str(cache),
                    ],
                    text=True,
                    capture_output=True,
                    timeout=args.timeout,
                )
                wall = (time.perf_counter() - t0) * 1e3
                if p.returncode != 0:
                    runs.append({"error": p.stderr[-1000:]})
                    continue
                runs.append(
                    {"process_wall_ms": wall, **json.loads(p.stdout.strip().splitlines()[-1])}
                )
            cold[label] = runs
        results[plat]["cold_start"] = {"model": args.cold_model, **cold}
        print(json.dumps(cold), flush=True)
    write_json(
        args.out,
        envelope(
            sys.argv,
            results,
            env={k: os.environ.get(k) for k in ("POCL_CPU_MAX_CU_COUNT", "OCL_ICD_VENDORS")},
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="squeezenet,bvlc_alexnet,resnet50,inception_v1,vgg19")
    p.add_argument("--mcpu", default="skylake-avx512")
    p.set_defaults(func=cmd_compile)
    for name, func in (("run", cmd_run), ("all", cmd_all)):
        p = sub.add_parser(name)
        p.add_argument("--dir", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--number", type=int, default=5)
        p.add_argument("--repeat", type=int, default=5)
        p.add_argument("--timeout", type=int, default=900)
        if name == "run":
            p.add_argument("--platform", required=True)
        else:
            p.add_argument("--platforms", default="nvidia,portable")
            p.add_argument("--cold-model", default="resnet50")
            p.add_argument("--cold-repeats", type=int, default=2)
        p.set_defaults(func=func)
    p = sub.add_parser("coldstart")
    p.add_argument("--dir", required=True)
    p.add_argument("--platform", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--cache-dir", required=True)
    p.set_defaults(func=cmd_coldstart)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
