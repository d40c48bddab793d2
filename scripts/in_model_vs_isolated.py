"""CPU conv kernels inside whole models against the same kernels profiled alone (issues 4, 5).

Matches every Winograd and packed conv kernel of a ``bench_cpu_models.py layers`` run (its time
per call inside the model) with the whole-operator CPU record of the same shape and algorithm in
a profiling dataset (measured alone, warm), and reports the ratio per kernel and per model. No
timing happens here::

    python scripts/in_model_vs_isolated.py --layers results/cpu_layers_21e24f0.json \\
        --data results/profile/emulated_soc_algos.jsonl \\
        --out results/in_model_vs_isolated_21e24f0.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _shape_key(kernel: dict) -> tuple | None:
    """(in_h, in_w, ic, oc, kernel, stride, impl) of a Winograd or packed conv kernel, read from
    its argument shapes (data, transformed weight, ..., output); None for other kernels."""
    name, shapes = kernel["kernel"], kernel["arg_shapes"]
    if "conv2d" not in name or len(shapes) < 3:
        return None
    data, weight, out = shapes[0], shapes[1], shapes[-1]
    if "winograd" in name:  # weight [a, a, ic, oc], 3x3 stride 1
        impl, ksize = "winograd", 3
    elif "packed" in name:  # weight [oc / lanes, ic, kh, kw, lanes]
        impl, ksize = "packed", weight[2]
    else:
        return None
    stride = max(1, round(data[2] / out[2])) if data[2] > out[2] else 1
    return (data[2], data[3], data[1], out[1], ksize, stride, impl)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", required=True, help="bench_cpu_models.py layers JSON")
    p.add_argument("--data", required=True, help="profiling dataset (.jsonl) with the kernels")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from codl_tvm.bench import envelope, write_json
    from codl_tvm.cost_model.dataset import load_dataset

    alone = {}
    for r in load_dataset(args.data).op_records:
        if r.processor == "cpu" and r.partition.dim == "none" and r.params.op == "conv2d":
            q = r.params
            alone[(q.h, q.w, q.ic, q.oc, q.kernel, q.stride, r.impl)] = r.latency_ms
    layers = json.loads(Path(args.layers).read_text())["results"]["models"]
    results = {}
    for model, run in layers.items():
        rows, inside, isolated = [], 0.0, 0.0
        for k in run["kernels"]:
            key = _shape_key(k)
            if key is None or key not in alone:
                continue
            per_call = k["ms_per_run"] / k["calls_per_run"]
            rows.append(
                {
                    "kernel": k["kernel"],
                    "shape": list(key),
                    "calls": k["calls_per_run"],
                    "in_model_ms": per_call,
                    "alone_ms": alone[key],
                    "ratio": per_call / alone[key],
                }
            )
            inside += k["ms_per_run"]
            isolated += alone[key] * k["calls_per_run"]
        if rows:
            results[model] = {
                "kernels": rows,
                "in_model_ms": inside,
                "alone_ms": isolated,
                "ratio": inside / isolated,
            }
            print(
                f"{model:24s} {len(rows)} kernels: {inside:.2f} ms in the model, "
                f"{isolated:.2f} ms alone, x{inside / isolated:.2f}"
            )
    write_json(args.out, envelope(sys.argv, results, layers=args.layers, data=args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
