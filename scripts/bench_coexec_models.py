"""Whole models co-executed with uniform plans on the emulated SoC (model-level check).

    python scripts/bench_coexec_models.py compile --out .device/cx_models --gpu-device pocl
    python scripts/bench_coexec_models.py run --dir .device/cx_models --platform portable \\
        --out out/coexec_models_pocl8cu.json --tvm-cpus 8-15
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

PLANS = (("H", 0.0), ("H", 1.0), ("H", 0.3), ("H", 0.5), ("OC", 0.3), ("OC", 0.5))


def cmd_compile(args: argparse.Namespace) -> None:
    from bench_util import coexec_targets

    import codl_tvm
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import bundled_model_path, light_model
    from codl_tvm.runtime.plugin_build import build_plugin

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(build_plugin(), out / "libcodl_tvm_opencl.so")
    gpu, cpu = coexec_targets(args.mcpu, args.gpu_device)
    manifest = {}
    for name in args.models.split(","):
        model = load_onnx(bundled_model_path() if name == "codl_small_cnn" else light_model(name))
        libs = []
        for dim, ratio in PLANS:
            tag = f"{name}_{dim}_{ratio:.2f}"
            built = codl_tvm.compile(
                model.mod, uniform_plan(model.mod, dim, ratio), gpu=gpu, cpu=cpu, work_dir=out
            )
            built.library.rename(out / f"{tag}.so")
            libs.append({"dim": dim, "ratio": ratio, "lib": f"{tag}.so"})
            print("compiled", tag, flush=True)
        manifest[name] = {"input": [list(s.shape) for s in model.inputs], "libs": libs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def cmd_run(args: argparse.Namespace) -> None:
    import os

    import tvm
    from bench_util import envelope, open_opencl, run_coexec_library, write_json

    _, results = open_opencl(args.platform, args.tvm_cpus)
    results["models"] = {}
    dev = tvm.opencl(0)
    manifest = json.loads((Path(args.dir) / "manifest.json").read_text())
    rng = np.random.default_rng(0)
    for name, entry in manifest.items():
        inputs = [
            tvm.runtime.tensor(rng.random(s, dtype=np.float64).astype("float32"), dev)
            for s in entry["input"]
        ]
        rows, ref = [], None
        for item in entry["libs"]:
            lib = Path(args.dir) / item["lib"]
            out, ms = run_coexec_library(lib, inputs, dev, args.number, args.repeat)
            ref = out if ref is None else ref
            err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
            rows.append({**item, "median_ms": ms, "max_rel_err_vs_cpu_only": err})
            print(
                f"{name:16s} {item['dim']:2s} {item['ratio']:.2f} {ms:9.3f} ms err {err:.1e}",
                flush=True,
            )
        tc = next(r["median_ms"] for r in rows if r["ratio"] == 0.0)
        tg = next(r["median_ms"] for r in rows if r["ratio"] == 1.0)
        results["models"][name] = {
            "rows": rows,
            "t_cpu_ms": tc,
            "t_gpu_ms": tg,
            "t_star_ms": tc * tg / (tc + tg),
        }
    write_json(
        args.out,
        envelope(
            sys.argv,
            results,
            tvm_cpus=args.tvm_cpus,
            env={
                k: os.environ.get(k)
                for k in ("POCL_CPU_MAX_CU_COUNT", "POCL_AFFINITY", "TVM_NUM_THREADS")
            },
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="codl_small_cnn,squeezenet")
    p.add_argument("--mcpu", default="skylake-avx512")
    p.add_argument("--gpu-device", default="pocl")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("run")
    p.add_argument("--dir", required=True)
    p.add_argument("--platform", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tvm-cpus", default="")
    p.set_defaults(func=cmd_run)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
