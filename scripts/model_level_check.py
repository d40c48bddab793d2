"""Model-level check of a shipped cost model against a planner benchmark (issue 5/7).

For every model of a ``bench_planner.py run`` JSON: the CPU-only and GPU-only latencies the
cost model predicts (``plan_model``'s summary) against the measured single-processor builds, and
codl's predicted against its measured latency. No timing happens here::

    python scripts/model_level_check.py --results results/planner_emulated_soc.json \\
        --cost-model codl_tvm/data/cost_models/emulated-soc.json --out results/model_level_soc.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", required=True)
    p.add_argument("--cost-model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from codl_tvm.bench import envelope, write_json
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend import load_onnx
    from codl_tvm.models import benchmark_model
    from codl_tvm.planner import plan_model

    bench = json.loads(Path(args.results).read_text())
    model = load_model(args.cost_model)
    rows = {}
    for name, v in bench["results"]["models"].items():
        _, report = plan_model(load_onnx(benchmark_model(name)).mod, model, mode="codl")
        s = report.summary
        meas = v["summary"]
        codl = v["rows"].get("codl", {})
        rows[name] = {
            "cpu_predicted_ms": s.cpu_only_ms,
            "cpu_measured_ms": meas["t_cpu_ms"],
            "cpu_measured_over_predicted": meas["t_cpu_ms"] / s.cpu_only_ms,
            "gpu_predicted_ms": s.gpu_only_ms,
            "gpu_measured_ms": meas["t_gpu_ms"],
            "gpu_measured_over_predicted": meas["t_gpu_ms"] / s.gpu_only_ms,
            "codl_predicted_ms": s.predicted_ms,
            "codl_measured_ms": codl.get("median_ms"),
            "codl_built_for": codl.get("device"),
        }
        r = rows[name]
        print(
            f"{name:14s} cpu {r['cpu_measured_over_predicted']:.2f}x  "
            f"gpu {r['gpu_measured_over_predicted']:.2f}x  codl {s.predicted_ms:.2f} predicted, "
            f"{codl.get('median_ms', float('nan')):.2f} ms measured ({codl.get('device')})"
        )
    write_json(
        args.out,
        envelope(sys.argv, rows, benchmark=args.results, benchmark_commit=bench["commit"]),
    )


if __name__ == "__main__":
    main()
