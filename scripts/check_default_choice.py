"""Which build a default ``codl-tvm compile`` keeps on this machine, model by model.

The promise checked: the artifact is the CPU-alone build, or a build measured at least as fast
(the compile times the planned build and each processor alone here and keeps the fastest). It
records, per model, what the cost model predicted and what the compile measured and kept; the
medians are this machine's and only rank the builds of one compile (speed figures come from
the benchmark machine)::

    python scripts/check_default_choice.py .models/unseen/*.onnx --out results/choice.json

One model failing to compile is recorded with its error and does not stop the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench_util import envelope, write_json

from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions

# the build -> the plan summary's prediction of it
PREDICTIONS = (("coexec", "predicted_ms"), ("cpu", "cpu_only_ms"), ("opencl", "gpu_only_ms"))


def check(model: Path) -> dict:
    """Compile ``model`` with the default options; what was predicted, measured and kept."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "art"
        t0 = time.perf_counter()
        compile_artifact(model, out, CompileOptions(reference=False))
        seconds = time.perf_counter() - t0
        manifest = json.loads((out / "manifest.json").read_text())
    plan, measured = manifest["plan"], manifest.get("verify") or {}
    medians = measured.get("median_ms", {})
    summary = plan.get("summary") or {}
    kept = manifest["device"]
    return {
        "model": model.name,
        "predicted_ms": {
            k: summary.get(f)
            for k, f in (
                ("coexec", "predicted_ms"),
                ("cpu", "cpu_only_ms"),
                ("opencl", "gpu_only_ms"),
            )
        },
        "predicted_fallback": plan.get("predicted_fallback"),
        "measured_median_ms": medians,
        "kept": kept,
        # the promise: the CPU-alone build, or one measured at least as fast
        "kept_is_cpu_or_faster": kept == "cpu" or medians.get(kept, 1e30) <= medians.get("cpu", 0),
        "device_mismatch": plan.get("cost_model", {}).get("device_mismatch"),
        "compile_s": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = []
    for model in args.models:
        try:
            rows.append(check(model))
        except Exception as exc:  # one model's failure is a result, not the end of the run
            rows.append({"model": model.name, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
        write_json(args.out, envelope(sys.argv, {"models": rows}))
    return 0 if all(r.get("kept_is_cpu_or_faster") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
