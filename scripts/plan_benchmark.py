"""How long the planner takes on a 60-operator model (issue 7: under a second).

Builds a VGG-like ONNX model in code (convolutions with ReLU, a max pool every few layers, 60
partitionable operators in all), fits a CodlModel on synthetic records of an imaginary device
(``codl_tvm.planner.synthetic``; the latencies are not measured) and times ``plan_model`` for
every mode. Run it on a quiet machine: timings on a shared one are not meaningful.

    python scripts/plan_benchmark.py [--ops 60] [--repeat 5] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def vgg_like(n_ops: int, seed: int = 0):
    """An ONNX model with ``n_ops`` partitionable operators (conv + relu, max pool every 6)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    c, h, x = 3, 112, "input"
    for i in range(n_ops):
        if i % 6 == 5 and h >= 8:
            nodes.append(
                helper.make_node("MaxPool", [x], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2])
            )
            x, h = f"p{i}", h // 2
            continue
        oc = min(256, 16 * 2 ** (i // 12))
        w = rng.standard_normal((oc, c, 3, 3)).astype(np.float32) * 0.1
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x, c = f"r{i}", oc
    graph = helper.make_graph(
        nodes,
        "vgg_like",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 112, 112])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, h, h])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the timings here")
    args = parser.parse_args()

    from codl_tvm.frontend import load_onnx
    from codl_tvm.plan import partitionable_ops
    from codl_tvm.planner import MODES, plan_model
    from codl_tvm.planner.synthetic import SyntheticDevice, synthetic_cost_model

    mod = load_onnx(vgg_like(args.ops)).mod
    n = len(partitionable_ops(mod))
    cost_model = synthetic_cost_model(SyntheticDevice(share_ms_per_mb=1.0, presync_ms=0.05))
    results = {}
    for mode in MODES:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            _plan, report = plan_model(mod, cost_model, mode)
            times.append(time.perf_counter() - t0)
        results[mode] = {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "predicted_ms": report.summary.predicted_ms,
            "chains": list(report.summary.chain_lengths),
        }
        print(
            f"{mode:<14} {n} ops: median {results[mode]['median_s'] * 1e3:8.1f} ms "
            f"(min {results[mode]['min_s'] * 1e3:.1f}); predicted {report.summary.predicted_ms:.3f}"
            f" ms; chains {results[mode]['chains']}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n_ops": n, "modes": results}, f, indent=2)


if __name__ == "__main__":
    main()
