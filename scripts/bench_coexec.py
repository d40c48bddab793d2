"""Benchmark co-execution of single operators on GPU + CPU, and the cost of a sync.

1. Sync cost per sync point: SVM flag polling vs marker event vs clFinish, on an idle queue and
   right after a GPU kernel (wake-up), in microseconds.
2. Single convolutions of CoDL's shapes split along H and OC at several GPU ratios: measured
   co-execution latency against the single-processor latencies (ratio 0 = CPU only, 1 = GPU
   only) and the ideal T* = Tc*Tg/(Tc+Tg).

Compile here, run on the device machine:

    python scripts/bench_coexec.py compile --out .device/coexec
    python scripts/bench_coexec.py run --dir .device/coexec --platform portable \\
        --out out/coexec_pocl.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# CoDL's conv shapes (Fig. 10, Table/Fig. 3-5): (H=W, IC, OC, kernel)
SHAPES = {
    "104x104x64-128_k3": (104, 64, 128, 3),
    "13x13x1024-1024_k3": (13, 1024, 1024, 3),
    "112x112x32-64_k3": (112, 32, 64, 3),
    "52x52x256-128_k1": (52, 256, 128, 1),
}
RATIOS = (0.0, 0.25, 0.4, 0.5, 0.6, 0.75, 1.0)

BUSY_SRC = """
__kernel void busy(__global float* y, int iters) {
  float acc = y[get_global_id(0)];
  for (int i = 0; i < iters; ++i) acc = acc * 0.999f + 0.001f;
  y[get_global_id(0)] = acc;
}
"""


def conv_model(hw: int, c_in: int, c_out: int, k: int):
    """A conv + bias + relu whose weights are graph inputs (libraries stay small)."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [c_out, c_in, k, k]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [c_out]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, hw, hw])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def cmd_compile(args: argparse.Namespace) -> None:
    import shutil

    from bench_util import coexec_targets

    import codl_tvm
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.runtime.plugin_build import build_plugin

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(build_plugin(), out / "libcodl_tvm_opencl.so")
    gpu, cpu = coexec_targets(args.mcpu, args.gpu_device)
    manifest_target = str(gpu)
    manifest = {"convs": {}, "gpu_target": manifest_target}
    for name, (hw, ci, co, k) in SHAPES.items():
        model = load_onnx(conv_model(hw, ci, co, k))
        entries = []
        for dim in ("H", "OC"):
            for ratio in RATIOS:
                if ratio in (0.0, 1.0) and dim == "OC":
                    continue  # single-processor builds: one each
                plan = uniform_plan(model.mod, dim, ratio)
                tag = f"{name}_{dim}_{ratio:.2f}"
                t0 = time.perf_counter()
                codl_tvm.compile(model.mod, plan, gpu=gpu, cpu=cpu, work_dir=out).library.rename(
                    out / f"{tag}.so"
                )
                entries.append(
                    {
                        "dim": dim,
                        "ratio": ratio,
                        "lib": f"{tag}.so",
                        "compile_s": time.perf_counter() - t0,
                    }
                )
                print("compiled", tag, flush=True)
        manifest["convs"][name] = {"shape": [hw, ci, co, k], "builds": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _sync_costs(dev_id: int = 0) -> dict:
    import tvm

    from codl_tvm import runtime
    from codl_tvm.runtime import sync

    modes = ["event", "finish"] + (["flag"] if sync.flag_supported() else [])
    idle = {m: sync.measure_sync_us(m, dev_id, repeat=500) for m in modes}
    mod = runtime.opencl_module_from_source(
        BUSY_SRC, {"busy": (["handle", "int32"], ["blockIdx.x", "threadIdx.x"])}
    )
    dev = tvm.opencl(dev_id)
    y = tvm.runtime.tensor(np.zeros(64, np.float32), dev)
    clock = tvm.get_global_func("codl.opencl.host_clock_ns")
    wake = {}
    for m in modes:
        sync.set_sync_mode(m)
        samples = []
        for _ in range(200):
            with runtime.record_kernels() as ev:
                t_launch = clock()
                mod["busy"](y, 20000, 1, 64)
                mark = sync.gpu_mark(dev_id)
                sync.cpu_wait(mark)
                t_host = clock()
            # Clock-base free: host time from launch to the wait's return, minus the device
            # time from the kernel's queueing to its end = enqueue + wake-up latency.
            samples.append((t_host - t_launch) - (ev[0].end_ns - ev[0].queued_ns))
        wake[m] = {
            "wakeup_after_kernel_end_us_median": float(np.median(samples) / 1e3),
            "p90_us": float(np.percentile(samples, 90) / 1e3),
        }
    sync.set_sync_mode("auto")
    chosen = sync.sync_mode(dev_id)
    return {
        "idle_mark_wait_us": idle,
        "after_kernel": wake,
        "auto_choice": chosen,
        "calibration": sync.calibration(dev_id),
    }


def cmd_run(args: argparse.Namespace) -> None:
    import tvm
    from bench_util import envelope, open_opencl, run_coexec_library, write_json

    info, result = open_opencl(args.platform, args.tvm_cpus)
    result["svm_mode"] = info.svm_mode
    try:
        result["sync"] = _sync_costs()
    except Exception as exc:  # keep the conv results even if one mechanism fails here
        result["sync"] = {"error": str(exc)}
    print(json.dumps(result["sync"]), flush=True)
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    dev = tvm.opencl(0)
    rng = np.random.default_rng(0)
    convs = {}
    for name, entry in manifest["convs"].items():
        hw, ci, co, k = entry["shape"]
        x = rng.random((1, ci, hw, hw), dtype=np.float32)
        w = (rng.standard_normal((co, ci, k, k)) * 0.05).astype(np.float32)
        b = rng.standard_normal(co).astype(np.float32)
        args_t = [tvm.runtime.tensor(a, dev) for a in (x, w, b)]
        rows, ref = [], None
        for build in entry["builds"]:
            lib = Path(args.dir) / build["lib"]
            out, ms = run_coexec_library(lib, args_t, dev, args.number, args.repeat)
            if ref is None:
                ref = out
            err = float(np.max(np.abs(out - ref)))
            rows.append(
                {
                    "dim": build["dim"],
                    "ratio": build["ratio"],
                    "median_ms": ms,
                    "max_abs_err_vs_cpu_only": err,
                }
            )
            print(
                f"{name:22s} {build['dim']:2s} {build['ratio']:.2f} {ms:9.3f} ms err {err:.2e}",
                flush=True,
            )
        t_cpu = next(r["median_ms"] for r in rows if r["ratio"] == 0.0)
        t_gpu = next(r["median_ms"] for r in rows if r["ratio"] == 1.0)
        t_star = t_cpu * t_gpu / (t_cpu + t_gpu)
        best = min(rows, key=lambda r: r["median_ms"])
        convs[name] = {
            "rows": rows,
            "t_cpu_ms": t_cpu,
            "t_gpu_ms": t_gpu,
            "t_star_ms": t_star,
            "best": best,
            "best_efficiency_vs_t_star": t_star / best["median_ms"],
            "speedup_vs_best_single": min(t_cpu, t_gpu) / best["median_ms"],
        }
    result["convs"] = convs
    write_json(
        args.out,
        envelope(
            sys.argv,
            result,
            env={
                k: __import__("os").environ.get(k)
                for k in ("POCL_CPU_MAX_CU_COUNT", "TVM_NUM_THREADS", "OCL_ICD_VENDORS")
            },
        ),
    )


def cmd_trace(args: argparse.Namespace) -> None:
    """Timeline of one co-executed conv (Chrome trace JSON + PNG) to see the overlap."""

    from codl_tvm import runtime
    from codl_tvm.build.coexec import CoexecModule
    from codl_tvm.profiling.trace import trace_inference
    from codl_tvm.runtime.threads import pin_tvm_threads

    runtime.load(platform=args.platform)
    if args.tvm_cpus:
        pin_tvm_threads(args.tvm_cpus, pin_main_thread=False)
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    hw, ci, co, k = manifest["convs"][args.conv]["shape"]
    rng = np.random.default_rng(0)
    inputs = [
        rng.random((1, ci, hw, hw), dtype=np.float32),
        (rng.standard_normal((co, ci, k, k)) * 0.05).astype(np.float32),
        rng.standard_normal(co).astype(np.float32),
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for lib in args.libs.split(","):
        built = CoexecModule(library=Path(args.dir) / lib, plan=None)
        trace = trace_inference(built, inputs, warmup=3)
        stem = Path(lib).stem
        trace.save_chrome(out / f"trace_{stem}.json")
        trace.save_png(out / f"trace_{stem}.png")
        print(stem, json.dumps(trace.summary()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile")
    p.add_argument("--out", required=True)
    p.add_argument("--mcpu", default="skylake-avx512")
    p.add_argument("--gpu-device", default="", help="OpenCL device class: pocl, nvidia, ...")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run")
    p.add_argument("--dir", required=True)
    p.add_argument("--platform", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tvm-cpus", default="", help="pin TVM's CPU threads to cores LO-HI")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("trace")
    p.add_argument("--dir", required=True)
    p.add_argument("--platform", required=True)
    p.add_argument("--conv", required=True)
    p.add_argument("--libs", required=True, help="comma-separated library names in --dir")
    p.add_argument("--out", required=True)
    p.add_argument("--tvm-cpus", default="")
    p.set_defaults(func=cmd_trace)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
