"""Whole-model CPU latency: codl-tvm's CPU path against onnxruntime on the same threads.

onnx's light models with seeded random weights. By default weights are inputs of the compiled
library so it stays small enough to carry. Compile here, run on the device machine:

    python scripts/bench_cpu_models.py compile --out .device/cpu_models
    python scripts/bench_cpu_models.py run --dir .device/cpu_models --threads 8 \\
        --out results/cpu_models_8threads.json

Weights as inputs hide them from build-time folding that onnxruntime (which gets them as
initializers) does: batch norms cannot fold into the convs (ResNet50: 53 extra kernels).
``compile --constant-weights`` builds what a user's ``codl-tvm compile`` builds (weights constant,
batch norms folded); its libraries are large (VGG19 ~550 MB), so compile on the device machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np


def cmd_compile(args: argparse.Namespace) -> None:
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    from codl_tvm.models import light_model, pretranspose_gemm_weights
    from codl_tvm.pipeline import single_device_pipeline

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = tvm.target.Target({"kind": "llvm", "mcpu": args.mcpu})
    manifest = {}
    for name in args.models.split(","):
        # Weights are library inputs (to keep libraries small): store Gemm weights pre-transposed
        # so no transpose runs per inference (constant folding would remove it for constants).
        mod = from_onnx(
            pretranspose_gemm_weights(light_model(name, seed=3)),
            keep_params_in_input=not args.constant_weights,
        )
        main = mod["main"]
        n_in = int(main.attrs["num_input"])
        ex = tvm.compile(mod, target=target, relax_pipeline=single_device_pipeline(target))
        ex.export_library(str(out / f"{name}_cpu.so"))
        manifest[name] = {
            "inputs": [[p.name, [int(v) for v in p.ty.shape.values]] for p in main.params[:n_in]],
            "params": [p.name for p in main.params[n_in:]],
        }
        print("compiled", name, flush=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def cmd_run(args: argparse.Namespace) -> None:
    import onnxruntime as ort
    import tvm
    from onnx import numpy_helper
    from tvm.runtime.vm import VirtualMachine

    from codl_tvm.bench import envelope, write_json
    from codl_tvm.models import light_model, pretranspose_gemm_weights

    cpus = [str(c) for c in range(args.threads)]
    tvm.get_global_func("runtime.config_threadpool")(-2, args.threads, cpus)
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    rows = {}
    for name, entry in manifest.items():
        proto = pretranspose_gemm_weights(light_model(name, seed=3))
        init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
        rng = np.random.default_rng(11)
        feeds = {n: rng.random(s, dtype=np.float64).astype("float32") for n, s in entry["inputs"]}
        dev = tvm.cpu(0)
        vm = VirtualMachine(tvm.runtime.load_module(str(Path(args.dir) / f"{name}_cpu.so")), dev)
        vm_args = [tvm.runtime.tensor(feeds[n], dev) for n, _ in entry["inputs"]]
        vm_args += [tvm.runtime.tensor(init[p], dev) for p in entry["params"]]
        out = vm["main"](*vm_args)
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        res = vm.time_evaluator("main", dev, number=args.number, repeat=args.repeat)(*vm_args)
        tvm_ms = float(np.median(res.results) * 1e3)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(
            proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        ref = sess.run(None, feeds)[0]
        import time

        for _ in range(3):
            sess.run(None, feeds)
        samples = []
        for _ in range(args.repeat * args.number):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            samples.append((time.perf_counter() - t0) * 1e3)
        ort_ms = float(np.median(samples))
        err = float(np.max(np.abs(got.reshape(ref.shape) - ref)) / max(np.max(np.abs(ref)), 1e-12))
        rows[name] = {
            "codl_tvm_cpu_ms": tvm_ms,
            "onnxruntime_ms": ort_ms,
            "ratio": tvm_ms / ort_ms,
            "max_rel_err": err,
        }
        print(
            f"{name:14s} codl-tvm {tvm_ms:8.2f} ms  onnxruntime {ort_ms:8.2f} ms  "
            f"x{tvm_ms / ort_ms:.2f}  err {err:.1e}",
            flush=True,
        )
    write_json(
        args.out,
        envelope(
            sys.argv,
            {"threads": args.threads, "models": rows},
            env={"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS")},
        ),
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
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run")
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--number", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.set_defaults(func=cmd_run)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
