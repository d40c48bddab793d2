"""Whole-model sums of a cost model against measured CPU-only and GPU-only builds.

For every model of a planner benchmark file (``benchmarks/planner_*.json``, written by
``scripts/bench_planner.py run``: rows ``cpu`` and ``gpu`` are the single-processor builds), the
model is built as the benchmark built it (``codl_tvm.frontend.models.benchmark_model``), planned in
``cpu_only`` mode with the cost model under the preset's planning context (the kernels those
builds ran), and the planner's predicted CPU-only and GPU-only sums are compared with the
measured medians; a per-processor factor fitted leave-one-model-out
(``codl_tvm.cost_model.in_model``) shows what a calibrated sum would reach. No device needed.

Usage::

    python scripts/cost_model_in_model.py --planner benchmarks/planner_h100.json \\
        --cost-model codl_tvm/data/cost_models/device-h100.json --preset device-h100 \\
        --out benchmarks/cost_model_in_model_h100.json [--models squeezenet,resnet50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

from codl_tvm.cost_model.in_model import summary, whole_model_table


def measured_ms(planner_file: Path) -> dict[str, dict[str, float]]:
    """``{model: {"cpu": ms, "gpu": ms}}``: the single-processor builds' median latencies."""
    results = json.loads(planner_file.read_text())["results"]
    out = {}
    for name, entry in results["models"].items():
        rows = entry.get("rows", {})
        got = {p: rows[p]["median_ms"] for p in ("cpu", "gpu") if rows.get(p, {}).get("median_ms")}
        if got:
            out[name] = got
    return out


def predicted_ms(names, cost_model: Path, preset: str) -> dict[str, dict[str, float]]:
    """The planner's predicted CPU-only and GPU-only sums of each model."""
    import onnx  # deferred: building models needs onnx and TVM, the table above does not

    from codl_tvm.cost_model import load_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import benchmark_model, bundled_model_path
    from codl_tvm.planner import plan_model
    from codl_tvm.planner.policy import planning_context

    model = load_model(cost_model)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if name == "codl_small_cnn":
                path = bundled_model_path()
            else:
                path = Path(tmp) / f"{name}.onnx"
                onnx.save(benchmark_model(name), str(path))
            mod = load_onnx(path).mod
            with planning_context(preset, cost_model) as config, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, report = plan_model(mod, model, "cpu_only", config, name)
            s = report.summary
            out[name] = {"cpu": s.cpu_only_ms, "gpu": s.gpu_only_ms}
            print(
                f"{name}: predicted CPU {s.cpu_only_ms:.3f} ms, GPU {s.gpu_only_ms:.3f} ms",
                file=sys.stderr,
            )
            path.unlink(missing_ok=name != "codl_small_cnn")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", type=Path, required=True, help="benchmarks/planner_*.json")
    parser.add_argument("--cost-model", type=Path, required=True)
    parser.add_argument("--preset", required=True, help="target preset the builds used")
    parser.add_argument("--models", help="comma-separated subset of the file's models")
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    args = parser.parse_args(argv)
    measured = measured_ms(args.planner)
    names = args.models.split(",") if args.models else sorted(measured)
    unknown = [n for n in names if n not in measured]
    if unknown:
        parser.error(f"{args.planner} has no single-processor rows for {unknown}")
    predicted = predicted_ms(names, args.cost_model, args.preset)
    rows = whole_model_table(predicted, measured)
    print(
        f"{'model':<16} {'proc':<4} {'predicted':>10} {'measured':>10} {'error':>7} "
        f"{'LOMO cal.':>9}"
    )
    for r in rows:
        print(
            f"{r.model:<16} {r.processor:<4} {r.predicted_ms:10.3f} {r.measured_ms:10.3f} "
            f"{100 * r.error:6.1f}% {100 * r.calibrated_error:8.1f}%"
        )
    summ = summary(rows)
    for proc, s in summ.items():
        print(
            f"{proc}: {s['models']} models, within +-10%: {100 * s['within_raw']:.0f}% raw, "
            f"{100 * s['within_calibrated']:.0f}% with the leave-one-model-out factor; mean "
            f"|error| {100 * s['mean_abs_error_raw']:.1f}% -> "
            f"{100 * s['mean_abs_error_calibrated']:.1f}% (factor on all: {s['factor_all']:.3f})"
        )
    if args.out:
        cmd = "python scripts/cost_model_in_model.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        args.out.write_text(
            json.dumps(
                {
                    "command": cmd,
                    "machine": "build machine (predictions; measurements from --planner)",
                    "results": {"rows": [r.to_json() for r in rows], "summary": summ},
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
