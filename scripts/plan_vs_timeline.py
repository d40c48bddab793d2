"""The planner's predicted parts against the same parts timed inside the model.

Plans each benchmark model again with the cost model its build used (the planner is
deterministic), reads the timelines that ``bench_planner.py run --trace-dir`` took of that
build, and sets every split's predicted CPU and GPU part (``Decision.cpu_part_ms`` /
``gpu_part_ms``) beside its busy time on each lane (``planner.refine.split_times``). The
ratios, by operator kind and processor, show which parts the cost model (profiled one part at a
time, warm) mispredicts inside a running model, the rate at which each split's weights were
read (``--weight-gbps``, ``CostModel.streaming``), and how the predictions fare with that
floor, its rates taken from the other models (leave one model out). No timing happens here::

    python scripts/plan_vs_timeline.py --models bvlc_alexnet,vgg16,vgg19,yolov2,fst \\
        --cost-model codl_tvm/data/cost_models/emulated-soc-k12-alone.json \\
        --preset emulated-soc --traces TRACE_DIR \\
        --out benchmarks/plan_vs_timeline_soc_k12.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np


def op_kind(split: str) -> str:
    """``conv2d`` / ``matmul`` / ``max_pool2d`` ... of a split name; ``chain`` for a chain
    (``first..last``)."""
    if ".." in split:
        return "chain"
    return split.rsplit("_", 1)[0]


def compare(
    decisions: Iterable[dict], times: dict, weights: Mapping[str, tuple[int, int]] | None = None
) -> list[dict]:
    """One row per split of the plan found in the timelines: predicted and measured parts (ms)
    and measured / predicted per processor.

    ``decisions`` are plan-report rows (``Decision.to_dict()``); ``times`` maps a split name to
    its :class:`~codl_tvm.planner.split.refine.SplitTime`; ``weights`` maps a split operator to the
    weight bytes of its (CPU, GPU) parts, which give the in-model rate each part read its
    weights at (``cpu_gbps`` / ``gpu_gbps``). Operators run whole have no parts and are left
    out, as are splits the timelines do not show.
    """
    weights = weights or {}
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
        if split in weights:
            for proc, nbytes in zip(("cpu", "gpu"), weights[split], strict=True):
                meas = row[f"{proc}_meas_ms"]
                row[f"{proc}_weight_bytes"] = nbytes
                # bytes per ms / 1e6 = GB/s
                row[f"{proc}_gbps"] = nbytes / meas / 1e6 if meas > 0 else None
        rows.append(row)
    return rows


def streaming_rates(rows: Sequence[dict], kind: str = "matmul") -> dict[str, float]:
    """Median in-model weight rate (GB/s) of each processor over the ``kind`` parts."""
    out = {}
    for proc in ("cpu", "gpu"):
        rates = [r[f"{proc}_gbps"] for r in rows if r["kind"] == kind and r.get(f"{proc}_gbps")]
        if rates:
            out[proc] = float(np.median(rates))
    return out


def with_floor(rows: Sequence[dict], rates: Mapping[str, float]) -> list[dict]:
    """``rows`` predicted as ``CostModel.streaming`` would: each part no faster than its weight
    bytes over its processor's rate (parts without weight bytes, e.g. chains, unchanged)."""
    from codl_tvm.cost_model.features import weight_floor_ms

    out = []
    for r in rows:
        r = dict(r)
        for proc in ("cpu", "gpu"):
            nbytes, rate = r.get(f"{proc}_weight_bytes"), rates.get(proc)
            if nbytes and rate:
                r[f"{proc}_pred_ms"] = max(r[f"{proc}_pred_ms"], weight_floor_ms(nbytes, rate))
                r[f"{proc}_ratio"] = r[f"{proc}_meas_ms"] / r[f"{proc}_pred_ms"]
        out.append(r)
    return out


def leave_one_model_out(per_model: Mapping[str, Sequence[dict]], kind: str = "matmul") -> list:
    """Every model's rows with the floor of :func:`with_floor`, its rates measured on the
    other models' ``kind`` parts only (a held-out check of the floor)."""
    out = []
    for name, rows in per_model.items():
        others = [r for m, rs in per_model.items() if m != name for r in rs]
        out += with_floor(rows, streaming_rates(others, kind))
    return out


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


def _plan_rows(
    name: str, cost_model: str, preset: str, tmp: Path
) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """The plan report's rows, and the weight bytes of each split operator's (CPU, GPU) parts."""
    import onnx

    from codl_tvm.artifact import planning_context
    from codl_tvm.core.plan import partitionable_ops
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.cost_model.features import Partition, part_shape, weight_bytes
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import benchmark_model
    from codl_tvm.planner import op_params, plan_model

    path = tmp / f"{name}.onnx"
    onnx.save(benchmark_model(name), path)
    model = load_onnx(path)
    with planning_context(preset, cost_model) as config:
        _, report = plan_model(model.mod, load_model(cost_model), "codl", config, str(path))
    params = {info.name: op_params(info) for info in partitionable_ops(model.mod)}
    weights = {}
    for d in report.decisions:
        if len(d.ops) == 1 and d.cpu_part_ms is not None and d.ops[0] in params:
            p = params[d.ops[0]]
            cut = Partition(d.dim, d.ratio)
            weights[d.ops[0]] = tuple(
                weight_bytes(p.op, part_shape(p, cut, proc), p.kernel) for proc in ("cpu", "gpu")
            )
    return [d.to_dict() for d in report.decisions], weights


def main(argv: list[str] | None = None) -> int:
    from bench_util import envelope, write_json

    from codl_tvm.planner.split.refine import split_times
    from codl_tvm.profiling.trace import Trace

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
            decisions, weights = _plan_rows(name, args.cost_model, args.preset, Path(tmp))
            rows = compare(decisions, times, weights)
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
    rates = streaming_rates(every)
    held_out = summarise(leave_one_model_out(per_model))
    for title, table in (("as predicted", summary), ("with the floor, held out", held_out)):
        print(title)
        for key, s in table.items():
            print(
                f"  {key:16s} {s['parts']:3d} parts: measured/predicted median "
                f"x{s['median']:.2f}, geomean x{s['geomean']:.2f}, "
                f"{s['within_20pct']:.0%} within +-20%"
            )
    print(
        "in-model weight rates of dense parts (median): "
        + ", ".join(f"{p.upper()} {v:.1f} GB/s" for p, v in rates.items())
        + (f"  ->  --weight-gbps {rates['cpu']:.3g},{rates['gpu']:.3g}" if len(rates) == 2 else "")
    )
    results = {
        "cost_model": args.cost_model,
        "preset": args.preset,
        "traces": args.traces,
        "tag": args.tag,
        "summary": summary,
        "weight_gbps": rates,
        "summary_with_floor_leave_one_model_out": held_out,
        "models": per_model,
    }
    write_json(args.out, envelope(sys.argv, results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
