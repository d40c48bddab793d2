"""Model-level check of a shipped cost model against a planner benchmark.

For every model of a ``bench_planner.py run`` JSON: the CPU-only and GPU-only latencies the
cost model predicts (``plan_model``'s summary) against the measured single-processor builds, and
codl's predicted against its measured latency. No timing happens here.

For every co-executed codl plan it also reports the *co-execution excess*: how much more the plan
missed its prediction than the single processor it would otherwise run on missed its own
(``(codl measured / predicted) / (single measured / predicted)``; 1 = the co-executed plan is
exactly as well predicted as that processor alone), and which fallback margins (co-execute only
when predicted ``margin`` times faster than the best single processor) would have made the right
choice on these measurements::

    python scripts/model_level_check.py --results benchmarks/planner_emulated_soc_k12.json \\
        --cost-model codl_tvm/data/cost_models/emulated-soc-k12-alone.json \\
        --out out/model_level.json

Re-plan with the planner settings of the measured run (``--chain-min-gain 0`` for runs made
before the chain margin existed, ``--processor-scale`` for runs planned with a scaled model), or
codl's predictions describe another plan.

``--aggregate A.json,B.json,...`` reads earlier outputs of this script instead (no re-planning)
and reports the margins over all their co-executed plans, with each margin's summed latency
relative to the best single processor (the build each margin would have shipped: the measured
co-executed plan, or that processor)::

    python scripts/model_level_check.py --aggregate benchmarks/model_level/soc_k8.json,\
        benchmarks/model_level/soc_k12_run1.json,benchmarks/model_level/soc_k12_run2.json \
        --out out/model_level_margins.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MARGINS = (1.0, 1.05, 1.08, 1.1, 1.2, 1.3, 1.4, 1.5)


def margin_table(plans: list[tuple[float, float]]) -> dict[str, dict]:
    """For each fallback margin, over ``(predicted gain, measured gain)`` of co-executed plans:
    how many it decides right (co-execute exactly where co-execution measured faster) and the
    summed latency of what it would ship, relative to the best single processor."""
    table = {}
    for margin in MARGINS:
        right = sum((p > margin) == (g > 1.0) for p, g in plans)
        latency = sum(1.0 / g if p > margin else 1.0 for p, g in plans)
        table[f"{margin:g}"] = {"right": right, "of": len(plans), "relative_latency": latency}
    return table


def aggregate(paths: list[str], out: str) -> None:
    from bench_util import envelope, write_json

    plans, rows = [], []
    for path in paths:
        data = json.loads(Path(path).read_text())
        for name, r in data["results"].items():
            if isinstance(r, dict) and "predicted_gain" in r:
                plans.append((r["predicted_gain"], r["measured_gain"]))
                rows.append(
                    {
                        "file": path,
                        "benchmark_commit": data.get("benchmark_commit"),
                        "model": name,
                        "predicted_gain": r["predicted_gain"],
                        "measured_gain": r["measured_gain"],
                    }
                )
                print(
                    f"{path}: {name:12s} predicted {plans[-1][0]:.3f}x measured {plans[-1][1]:.3f}x"
                )
    table = margin_table(plans)
    for margin, t in table.items():
        print(
            f"margin {margin:>4s}: right {t['right']}/{t['of']}, "
            f"latency {t['relative_latency']:.3f}"
        )
    write_json(out, envelope(sys.argv, {"plans": rows, "margins": table}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results")
    p.add_argument("--cost-model")
    p.add_argument("--aggregate", help="comma list of this script's outputs (no re-planning)")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--chain-min-gain",
        type=float,
        default=None,
        help="the planner setting the measured builds were planned with (0 for runs made "
        "before the chain margin existed); default: the planner's current default",
    )
    p.add_argument(
        "--processor-scale",
        help="CPU,GPU: the cost model's predictions scaled as the measured builds were planned "
        "(compile --processor-scale; e.g. 2,0.857143: the k = 12 model at k = 14)",
    )
    args = p.parse_args(argv)
    if args.aggregate:
        aggregate(args.aggregate.split(","), args.out)
        return
    if not (args.results and args.cost_model):
        p.error("give --results and --cost-model, or --aggregate")

    from bench_util import envelope, write_json

    from codl_tvm.artifact import planning_context
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import benchmark_model
    from codl_tvm.planner import plan_model

    settings = {} if args.chain_min_gain is None else {"chain_min_gain": args.chain_min_gain}
    if args.processor_scale:
        settings["processor_scale"] = tuple(float(x) for x in args.processor_scale.split(","))
    bench = json.loads(Path(args.results).read_text())
    model = load_model(args.cost_model)
    rows = {}
    coexec = []
    for name, v in bench["results"]["models"].items():
        # As `compile` planned it: the preset's schedule configs, and the algorithms the cost
        # model covers switched on (the CPU alone is then predicted with its own kernels).
        with planning_context(bench["results"]["preset"], args.cost_model, **settings) as config:
            _, report = plan_model(
                load_onnx(benchmark_model(name)).mod, model, mode="codl", config=config
            )
        s = report.summary
        meas = v["summary"]
        codl = v["rows"].get("codl", {})
        # The benchmarked plan's own prediction (the planner may have changed since).
        codl_pred = codl.get("predicted_ms", s.predicted_ms)
        rows[name] = {
            "cpu_predicted_ms": s.cpu_only_ms,
            "cpu_measured_ms": meas["t_cpu_ms"],
            "cpu_measured_over_predicted": meas["t_cpu_ms"] / s.cpu_only_ms,
            "gpu_predicted_ms": s.gpu_only_ms,
            "gpu_measured_ms": meas["t_gpu_ms"],
            "gpu_measured_over_predicted": meas["t_gpu_ms"] / s.gpu_only_ms,
            "codl_predicted_ms": codl_pred,
            "codl_measured_ms": codl.get("median_ms"),
            "codl_built_for": codl.get("device"),
        }
        r = rows[name]
        if codl.get("device") == "coexec" and codl.get("median_ms"):
            single = "cpu" if s.cpu_only_ms <= s.gpu_only_ms else "gpu"
            r["predicted_gain"] = min(s.cpu_only_ms, s.gpu_only_ms) / codl_pred
            r["measured_gain"] = min(meas["t_cpu_ms"], meas["t_gpu_ms"]) / codl["median_ms"]
            r["coexec_excess"] = (codl["median_ms"] / codl_pred) / r[
                f"{single}_measured_over_predicted"
            ]
            coexec.append(name)
        print(
            f"{name:14s} cpu {r['cpu_measured_over_predicted']:.2f}x  "
            f"gpu {r['gpu_measured_over_predicted']:.2f}x  codl {codl_pred:.2f} predicted, "
            f"{codl.get('median_ms', float('nan')):.2f} ms measured ({codl.get('device')})"
            + (
                f"  gain predicted {r['predicted_gain']:.2f}x measured {r['measured_gain']:.2f}x"
                f"  excess {r['coexec_excess']:.2f}"
                if name in coexec
                else ""
            )
        )
    margins = margin_table([(rows[n]["predicted_gain"], rows[n]["measured_gain"]) for n in coexec])
    if coexec:
        print("fallback margin -> right choices among the co-executed plans:", margins)
    summary = {"coexec_models": coexec, "margins": margins}
    write_json(
        args.out,
        envelope(
            sys.argv,
            rows,
            benchmark=args.results,
            benchmark_commit=bench["commit"],
            margin_check=summary,
        ),
    )


if __name__ == "__main__":
    main()
