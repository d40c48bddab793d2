"""Fit the co-execution costs of the placement modes' makespan model to a device run.

``PlacementConfig.costs`` (:class:`codl_tvm.planner.placement.graph.CoexecCosts`) adds to the cost
model's
per-operator predictions what a co-executed build pays and a build for one processor alone does
not. This script takes a run of ``scripts/device/hope.sh`` (its JSON and the timelines of its
placed builds), plans every placed build again here with the plain predictions (the planner is
deterministic: the local plan is used only when its predicted makespan equals the device's),
and then:

1. per processor, sets each whole operator's busy time in the timelines beside its prediction,
   both over the ratio measured/predicted of the model on that processor alone (the
   co-execution factor of each processor, by model);
2. searches a grid of :class:`CoexecCosts` for the one whose makespans, over the faster
   processor's predicted latency alone, best match the measured latencies over the faster
   processor's measured latency (least squares of the logs, one row per placed build);
3. with ``--write``, records it in the cost model file (``meta["coexec_costs"]``), where the
   placement modes read it (:meth:`CoexecCosts.of`).

Nothing is timed here::

    python scripts/fit_coexec_costs.py --run benchmarks/hope_emulated_soc_k12.json \\
        --traces TRACE_DIR --cost-model codl_tvm/data/cost_models/emulated-soc-k12.json \\
        --preset emulated-soc --write
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

PLACED = ("hope", "hope_greedy", "starpu", "mosaic", "codl_hope")


def placed_rows(run: dict) -> list[tuple[str, str, dict, dict]]:
    """(model, mode, row, summary) of every build of a placement mode that ran co-executed
    (a plan the compile kept on one processor ran as that processor's build)."""
    out = []
    for model, m in run["results"]["models"].items():
        for mode, row in m["rows"].items():
            if mode in PLACED and row.get("device") == "coexec" and row.get("median_ms"):
                out.append((model, mode, row, m["summary"]))
    return out


def lane_ratios(trace: dict, graph, schedule) -> dict[str, tuple[float, float]]:
    """Per processor: (busy ms, predicted ms) of the operators the schedule runs whole there,
    from a timeline's kernels named after their split."""
    busy: dict[str, dict[int, float]] = collections.defaultdict(
        lambda: collections.defaultdict(float)
    )
    for e in trace["traceEvents"]:
        split = e.get("args", {}).get("split")
        if e.get("ph") == "X" and split and e["tid"] in (0, 1):
            busy[split][e["tid"]] += e["dur"] / 1000
    out = {"cpu": [0.0, 0.0], "gpu": [0.0, 0.0]}
    for i, node in enumerate(graph.nodes):
        p = schedule.processor[i]
        lanes = busy.get(node.op or "", {})
        if p in out and len(lanes) == 1 and next(iter(lanes)) == (0 if p == "gpu" else 1):
            out[p][0] += next(iter(lanes.values()))
            out[p][1] += node.latency_ms(p)
    return {p: (b, q) for p, (b, q) in out.items() if q > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="hope.sh's run JSON")
    ap.add_argument("--traces", help="its --trace-dir (timelines MODEL_MODE.json)")
    ap.add_argument("--cost-model", required=True)
    ap.add_argument("--preset", default=None)
    ap.add_argument(
        "--write", action="store_true", help="record the fitted costs in the cost model file"
    )
    args = ap.parse_args(argv)

    # deferred: TVM, ONNX and the planner load only once the arguments parse
    import onnx

    from codl_tvm.artifact import planning_context
    from codl_tvm.cost_model.base import load_model
    from codl_tvm.frontend.importer import load_onnx
    from codl_tvm.frontend.models import benchmark_model
    from codl_tvm.planner.placement.graph import META_KEY, CoexecCosts
    from codl_tvm.planner.placement.hope import simulate
    from codl_tvm.planner.placement.modes import PlacementConfig, schedule_placement
    from codl_tvm.planner.split.search import PlannerConfig

    run = json.loads(Path(args.run).read_text())
    cost_model = load_model(args.cost_model)
    neutral = PlacementConfig(costs=CoexecCosts())  # the plain predictions, as on the device
    cases = []  # (model, mode, plain graph, schedule, measured ratio, single predicted ms)
    factors: dict[str, dict[str, list[float]]] = {"cpu": {}, "gpu": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for model, mode, row, summary in placed_rows(run):
            path = Path(tmp) / f"{model}.onnx"
            if not path.exists():
                onnx.save(benchmark_model(model), str(path))
            mod = load_onnx(path).mod
            settings = {"ratios": PlannerConfig().ratios}
            if args.preset:
                with planning_context(args.preset, args.cost_model, **settings) as config:
                    s = schedule_placement(mod, cost_model, mode, config, model, neutral)
            else:
                s = schedule_placement(mod, cost_model, mode, PlannerConfig(), model, neutral)
            pred = s.schedule.makespan_ms
            if abs(pred - row["predicted_ms"]) > 0.01 * row["predicted_ms"]:
                print(
                    f"{model} {mode}: local plan predicts {pred:.3f} ms, the device's "
                    f"{row['predicted_ms']:.3f}: left out"
                )
                continue
            t_single = {"cpu": summary["t_cpu_ms"], "gpu": summary["t_gpu_ms"]}
            best = min(t_single.values())
            cases.append(
                (
                    model,
                    mode,
                    s.graph,
                    s.schedule,
                    row["median_ms"] / best,
                    min(s.single_ms.values()),
                )
            )
            trace = Path(args.traces or "") / f"{model}_{mode}.json"
            if args.traces and trace.is_file():
                for p, (busy, predicted) in lane_ratios(
                    json.loads(trace.read_text()), s.graph, s.schedule
                ).items():
                    alone = t_single[p] / s.single_ms[p]
                    factors[p].setdefault(model, []).append(busy / predicted / alone)
                    print(
                        f"{model} {mode} {p}: whole operators {busy:.2f} ms measured, "
                        f"{predicted:.2f} predicted ({busy / predicted:.2f}x; the model "
                        f"alone {alone:.2f}x)"
                    )
    for p, by_model in factors.items():
        if by_model:
            per = {m: statistics.mean(v) for m, v in by_model.items()}
            print(
                f"{p}: co-execution factor by model "
                + ", ".join(f"{m} {v:.2f}" for m, v in sorted(per.items()))
                + f"; median {statistics.median(per.values()):.2f}"
            )
    if not cases:
        print("no placed build to fit", file=sys.stderr)
        return 1

    def loss(costs: CoexecCosts) -> float:
        total = 0.0
        for _m, _mode, graph, schedule, measured, single in cases:
            g = graph.with_costs(costs)
            order = sorted(range(len(g)), key=lambda i: (schedule.start_ms[i], i))
            ms = simulate(g, schedule.processor, order).makespan_ms
            total += (math.log(ms / single) - math.log(measured)) ** 2
        return total / len(cases)

    grid = itertools.product(
        [1.0 + 0.05 * i for i in range(13)],  # cpu_factor 1.0 .. 1.6
        [0.8 + 0.1 * i for i in range(8)],  # gpu_factor 0.8 .. 1.5
        [0.05 * i for i in range(7)],  # gpu_op_ms 0 .. 0.3
        [0.05 * i for i in range(7)],  # cross_edge_ms 0 .. 0.3
    )
    best = min(
        (CoexecCosts(round(a, 3), round(b, 3), round(c, 3), round(d, 3)) for a, b, c, d in grid),
        key=loss,
    )
    print(
        f"placed builds fitted: {len(cases)}; rms log error with no costs "
        f"{math.sqrt(loss(CoexecCosts())):.3f}, with {best}: {math.sqrt(loss(best)):.3f}"
    )
    for m, mode, graph, schedule, measured, single in cases:
        g = graph.with_costs(best)
        order = sorted(range(len(g)), key=lambda i: (schedule.start_ms[i], i))
        ms = simulate(g, schedule.processor, order).makespan_ms
        print(
            f"  {m:13s} {mode:12s} measured/best-alone {measured:.2f}  predicted: plain "
            f"{schedule.makespan_ms / single:.2f}, with costs {ms / single:.2f}"
        )
    if args.write:
        # only the meta entry changes: the file is otherwise written back as it was read
        path = Path(args.cost_model)
        obj = json.loads(path.read_text())
        obj.setdefault("meta", {})[META_KEY] = dataclasses.asdict(best)
        path.write_text(json.dumps(obj, separators=(",", ":")) + "\n")
        print(f"wrote {META_KEY} to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
