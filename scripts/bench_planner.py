"""End-to-end planner benchmark (issue 7): every baseline and codl-tvm per model.

Compile here (the device machine has a runtime-only TVM), run there::

    python scripts/bench_planner.py compile --preset emulated-soc --models squeezenet,vgg16 \\
        --cost-model codl_tvm/data/cost_models/emulated-soc.json --oracle oracle.json \\
        --out .device/plans_soc
    python3 scripts/bench_planner.py run --dir .device/plans_soc --out $OUT/planner.json \\
        --tvm-cpus 8-15 --trace-dir $OUT/traces

Per model the directory holds one ``codl-tvm compile`` artifact per baseline: ``cpu`` and
``gpu`` (single-processor builds), the planner modes (``codl``, ``codl_no_chain``, ``h_only``,
``oc_only``, ``ulayer_like``) with the cost model, and ``oracle`` (``codl_no_chain`` planned with
a table of measured part latencies: each operator's measured best split). ``run`` checks every
artifact against the host reference stored with the CPU build, times it, and reports speedups
over the best single processor and over uLayer-like, the share of the ideal bound
T* = 1 / (1/Tcpu + 1/Tgpu), plan statistics and the planning time; ``--trace-dir`` also writes a
timeline of one codl inference per model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

PLANNER_MODES = ("codl", "codl_no_chain", "h_only", "oc_only", "ulayer_like")


def _model_file(name: str, tmp: Path) -> Path:
    from codl_tvm.cli import bundled_model_path
    from codl_tvm.models import LIGHT_MODELS, light_model

    if name == "codl_small_cnn":
        return bundled_model_path()
    path = tmp / f"{name}.onnx"
    if path.exists():
        return path
    if name in LIGHT_MODELS:
        import onnx

        onnx.save(light_model(name, tiled=True), str(path))
        return path
    import onnx

    from codl_tvm.models import compressible_weights
    from codl_tvm.zoo import build_model

    onnx.save(compressible_weights(build_model(name)), str(path))
    return path


def cmd_compile(args: argparse.Namespace) -> None:
    from codl_tvm.artifact import compile_artifact

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models_dir = out / "models"
    models_dir.mkdir(exist_ok=True)
    index = {
        "preset": args.preset,
        "cost_model": args.cost_model,
        "oracle": args.oracle,
        "models": {},
    }
    if (out / "index.json").exists():  # a later call adds models or modes
        index["models"] = json.loads((out / "index.json").read_text())["models"]
    for name in args.models.split(","):
        path = _model_file(name, models_dir)
        entries = {}
        jobs = [("cpu", "cpu", None, None), ("gpu", "opencl", None, None)]
        jobs += [(m, "coexec", m, args.cost_model) for m in args.modes.split(",") if m]
        if args.oracle:
            jobs.append(("oracle", "coexec", "codl_no_chain", args.oracle))
        for tag, device, mode, cost_model in jobs:
            target = out / name / tag
            if (target / "manifest.json").exists():
                entries[tag] = str(target.relative_to(out))
                continue
            print(f"== {name} {tag}", flush=True)
            compile_artifact(
                path,
                target,
                device=device,
                mode=mode or "codl",
                cost_model=cost_model,
                preset=args.preset,
                reference=(tag == "cpu"),
                log=lambda s: None,
            )
            entries[tag] = str(target.relative_to(out))
        index["models"][name] = {**index["models"].get(name, {}), **entries}
        (out / "index.json").write_text(json.dumps(index, indent=2))
    # The ONNX files are not needed on the device (artifacts are self-contained).
    for f in models_dir.iterdir():
        f.unlink()
    models_dir.rmdir()


def _stats(manifest: dict, art_dir: Path) -> dict:
    plan = manifest.get("plan") or {}
    out = {
        "device": manifest["device"],
        "fallback": plan.get("fallback"),
        "planning_s": plan.get("planning_s"),
    }
    summary = plan.get("summary")
    if summary:
        out["predicted_ms"] = summary["predicted_ms"]
        out["plan"] = {
            k: summary[k]
            for k in (
                "n_ops",
                "n_split_h",
                "n_split_oc",
                "n_whole_cpu",
                "n_whole_gpu",
                "chain_lengths",
            )
        }
    return out


def cmd_run(args: argparse.Namespace) -> None:
    import tvm  # noqa: F401  (runtime-only TVM is enough)

    from codl_tvm import runtime
    from codl_tvm.artifact import load_artifact
    from codl_tvm.bench import envelope, pin_tvm_threads, write_json

    root = Path(args.dir)
    index = json.loads((root / "index.json").read_text())
    runtime.load(platform=args.platform or None)
    info = runtime.info()
    if args.tvm_cpus:
        pin_tvm_threads(args.tvm_cpus)
    results = {
        "platform": info.platform,
        "device": info.devices[0].name,
        "compute_units": info.devices[0].compute_units,
        "svm": info.svm_mode,
        "preset": index["preset"],
        "models": {},
    }
    for name, entries in index["models"].items():
        ref_inputs, ref_outputs = load_artifact(root / entries["cpu"]).reference()
        rows = {}
        for tag, rel in entries.items():
            art = load_artifact(root / rel)
            inputs = [ref_inputs[s.name] for s in art.model.inputs]
            outs = art(inputs)
            err = max(float(np.max(np.abs(a - b))) for a, b in zip(outs, ref_outputs))
            scale = max(1.0, max(float(np.max(np.abs(r))) for r in ref_outputs))
            lat = art.time(inputs, number=args.number, repeat=args.repeat)
            rows[tag] = {
                "median_ms": lat.median_ms,
                "min_ms": lat.min_ms,
                "max_ms": lat.max_ms,
                "max_abs_err": err,
                "ok": err <= 1e-4 * scale,
                **_stats(art.manifest, root / rel),
            }
            print(
                f"{name:14s} {tag:14s} {lat.median_ms:10.3f} ms  err {err:.1e}  "
                f"{art.manifest['device']}",
                flush=True,
            )
            if args.trace_dir and tag == "codl" and art.device == "coexec":
                from codl_tvm.trace import trace_inference

                tdir = Path(args.trace_dir)
                tdir.mkdir(parents=True, exist_ok=True)
                trace = trace_inference(art, inputs)
                trace.save_chrome(tdir / f"{name}_codl.json")
                trace.save_png(tdir / f"{name}_codl.png")
                rows[tag]["trace"] = trace.summary()
        tc, tg = rows["cpu"]["median_ms"], rows["gpu"]["median_ms"]
        t_star = tc * tg / (tc + tg)
        best = min(tc, tg)
        summary = {
            "t_cpu_ms": tc,
            "t_gpu_ms": tg,
            "t_star_ms": t_star,
            "cpu_gpu_ratio": max(tc, tg) / min(tc, tg),
        }
        for tag, row in rows.items():
            row["speedup_vs_best_single"] = best / row["median_ms"]
            row["of_t_star"] = t_star / row["median_ms"]
            if "ulayer_like" in rows:
                row["speedup_vs_ulayer"] = rows["ulayer_like"]["median_ms"] / row["median_ms"]
        results["models"][name] = {"summary": summary, "rows": rows}
        print(
            f"{name:14s} T* {t_star:.3f} ms; codl {rows.get('codl', {}).get('of_t_star', 0):.0%}"
            f" of T*",
            flush=True,
        )
    write_json(
        args.out,
        envelope(
            sys.argv,
            results,
            tvm_cpus=args.tvm_cpus,
            env={
                k: os.environ.get(k)
                for k in (
                    "POCL_CPU_MAX_CU_COUNT",
                    "POCL_AFFINITY",
                    "TVM_NUM_THREADS",
                    "CODL_OPENCL_PLATFORM",
                )
            },
        ),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--preset", required=True)
    c.add_argument("--models", required=True)
    c.add_argument("--modes", default=",".join(PLANNER_MODES))
    c.add_argument("--cost-model", required=True)
    c.add_argument("--oracle", help="a 'measured' cost model of the models' parts")
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_compile)
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--platform", default="")
    r.add_argument("--tvm-cpus", default="")
    r.add_argument("--number", type=int, default=5)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--trace-dir")
    r.set_defaults(func=cmd_run)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
