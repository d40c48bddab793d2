"""The planner's predicted parts against the same parts timed inside the model (issues 5, 7).

Plans each benchmark model again with the cost model its build used (the planner is
deterministic), reads the timelines that ``bench_planner.py run --trace-dir`` took of that
build, and sets every split's predicted CPU and GPU part (``Decision.cpu_part_ms`` /
``gpu_part_ms``) beside its busy time on each lane (``planner.refine.split_times``). The
ratios, by operator kind and processor, show which parts the cost model (profiled one part at a
time, warm) mispredicts inside a running model. No timing happens here::

    python scripts/plan_vs_timeline.py --models bvlc_alexnet,vgg16,vgg19,yolov2,fst \\
        --cost-model codl_tvm/data/cost_models/emulated-soc-k12-alone.json \\
        --preset emulated-soc --traces results/traces/soc_k12_5dfafcc \\
        --out results/plan_vs_timeline_soc_k12_5dfafcc.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


def op_kind(split: str) -> str:
    """``conv2d`` / ``matmul`` / ``max_pool2d`` ... of a split name; ``chain`` for a chain
    (``first..last``)."""
    if ".." in split:
        return "chain"
    return split.rsplit("_", 1)[0]


def compare(decisions: Iterable[dict], times: dict) -> list[dict]:
    """One row per split of the plan found in the timelines: predicted and measured parts (ms)
    and measured / predicted per processor.

    ``decisions`` are plan-report rows (``Decision.to_dict()``); ``times`` maps a split name to
    its :class:`~codl_tvm.planner.refine.SplitTime`. Operators run whole have no parts and are
    left out, as are splits the timelines do not show.
    """
    rows = []
    for d in decisions:
        if d.get("cpu_part_ms") is None or d.get("gpu_part_ms") is None:
            continue
        ops = d["ops"]
        split = ops[0] if len(ops) == 1 else f"{ops[0]}..{ops[-1]}"
        t = times.get(split)
        if t is None:
            continue
        row = {
            "split": split,
            "kind": op_kind(split),
            "dim": d["dim"],
            "ratio": d["ratio"],
            "cpu_pred_ms": d["cpu_part_ms"],
            "gpu_pred_ms": d["gpu_part_ms"],
            "cpu_meas_ms": t.cpu_us / 1e3,
            "gpu_meas_ms": t.gpu_us / 1e3,
        }
        for proc in ("cpu", "gpu"):
            pred = row[f"{proc}_pred_ms"]
            row[f"{proc}_ratio"] = row[f"{proc}_meas_ms"] / pred if pred > 0 else None
        rows.append(row)
    return rows


def summarise(rows: Sequence[dict]) -> dict:
    """Per operator kind and processor: parts, median and geometric mean of measured / predicted,
    and the share within +-20%."""
    out: dict[str, dict] = {}
    for kind in sorted({r["kind"] for r in rows}):
        for proc in ("cpu", "gpu"):
            ratios = [
                r[f"{proc}_ratio"]
                for r in rows
                if r["kind"] == kind and r[f"{proc}_ratio"] is not None
            ]
            if not ratios:
                continue
            a = np.asarray(ratios)
            out[f"{kind}:{proc}"] = {
                "parts": len(ratios),
                "median": float(np.median(a)),
                "geomean": float(np.exp(np.mean(np.log(a)))),
                "within_20pct": float(np.mean(np.abs(a - 1.0) <= 0.2)),
            }
    return out


def _plan_rows(name: str, cost_model: str, preset: str, tmp: Path) -> list[dict]:
    import onnx

    from codl_tvm.artifact import planning_context
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend import load_onnx
    from codl_tvm.models import benchmark_model
    from codl_tvm.planner import plan_model

    path = tmp / f"{name}.onnx"
    onnx.save(benchmark_model(name), path)
    model = load_onnx(path)
    with planning_context(preset, cost_model) as config:
        _, report = plan_model(model.mod, load_model(cost_model), "codl", config, str(path))
    return [d.to_dict() for d in report.decisions]


def main(argv: list[str] | None = None) -> int:
    from codl_tvm.bench import envelope, write_json
    from codl_tvm.planner.refine import split_times
    from codl_tvm.trace import Trace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="comma list of benchmark models")
    p.add_argument("--cost-model", required=True, help="the cost model the builds planned with")
    p.add_argument("--preset", required=True, help="the builds' target preset")
    p.add_argument("--traces", required=True, help="directory of MODEL_TAG.json timelines")
    p.add_argument("--tag", default="codl", help="the traced build (default codl)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    per_model, every = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            trace_file = Path(args.traces) / f"{name}_{args.tag}.json"
            if not trace_file.is_file():
                print(f"plan_vs_timeline: {trace_file}: no such timeline", file=sys.stderr)
                return 2
            times = split_times([Trace.load_chrome(trace_file)])
            rows = compare(_plan_rows(name, args.cost_model, args.preset, Path(tmp)), times)
            per_model[name] = rows
            every += rows
            for r in rows:
                print(
                    f"{name:13s} {r['split']:24s} {r['dim']:2s}@{r['ratio']:.2f} "
                    f"cpu {r['cpu_pred_ms']:7.3f} -> {r['cpu_meas_ms']:7.3f} ms "
                    f"(x{r['cpu_ratio']:.2f})  gpu {r['gpu_pred_ms']:7.3f} -> "
                    f"{r['gpu_meas_ms']:7.3f} ms (x{r['gpu_ratio']:.2f})"
                )
    summary = summarise(every)
    for key, s in summary.items():
        print(
            f"{key:16s} {s['parts']:3d} parts: measured/predicted median x{s['median']:.2f}, "
            f"geomean x{s['geomean']:.2f}, {s['within_20pct']:.0%} within +-20%"
        )
    results = {
        "cost_model": args.cost_model,
        "preset": args.preset,
        "traces": args.traces,
        "tag": args.tag,
        "summary": summary,
        "models": per_model,
    }
    write_json(args.out, envelope(sys.argv, results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
