"""Re-plan every benchmark model under two planner configurations (predictions only, no timing).

Shows what a planner change does to the plans that the device benchmarks time, before any
device time is spent: for each model and shipped cost model, the predicted latency and the plan
statistics (operators split on H / OC, whole on each processor, chain lengths) with the
``--before`` and the ``--after`` settings of :class:`~codl_tvm.planner.PlannerConfig`.

    python scripts/replan.py --before chain_min_gain=0 --after chain_min_gain=0.1 \\
        --out results/planner_chain_margin_replan.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

MODELS = "squeezenet,bvlc_alexnet,resnet50,inception_v1,vgg19,vgg16,yolov2,posenet,fst,retinaface"


def _settings(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: expected FIELD=VALUE")
        out[key] = float(value)
    return out


def _row(report) -> dict:
    s = report.summary
    return {
        "pred_ms": round(s.predicted_ms, 3),
        "cpu_ms": round(s.cpu_only_ms, 3),
        "gpu_ms": round(s.gpu_only_ms, 3),
        "split_h": s.n_split_h,
        "split_oc": s.n_split_oc,
        "whole_cpu": s.n_whole_cpu,
        "whole_gpu": s.n_whole_gpu,
        "chains": list(s.chain_lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--after", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--presets", default="emulated-soc,device-h100")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import onnx

    from codl_tvm.bench import envelope, write_json
    from codl_tvm.cost_model import load_model
    from codl_tvm.cost_model.defaults import default_model_path
    from codl_tvm.frontend import load_onnx
    from codl_tvm.models import benchmark_model
    from codl_tvm.planner import PlannerConfig, plan_model

    before = PlannerConfig(**_settings(args.before))
    after = PlannerConfig(**_settings(args.after))
    models = {p: load_model(default_model_path(p)) for p in args.presets.split(",")}
    plans = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(benchmark_model(name), str(path))
            mod = load_onnx(path).mod
            for preset, cost_model in models.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # FLOPs fallbacks are in the reports
                    _, rep_before = plan_model(mod, cost_model, config=before)
                    _, rep_after = plan_model(mod, cost_model, config=after)
                plans[f"{preset}/{name}"] = {"before": _row(rep_before), "after": _row(rep_after)}
                b, a = plans[f"{preset}/{name}"].values()
                print(
                    f"{preset:13s} {name:13s} {b['pred_ms']:9.3f} -> {a['pred_ms']:9.3f} ms  "
                    f"chains {b['chains']} -> {a['chains']}",
                    flush=True,
                )
    write_json(
        args.out,
        envelope(
            sys.argv,
            {
                "note": "planner predictions only (no timing)",
                "before": _settings(args.before),
                "after": _settings(args.after),
                "plans": plans,
            },
        ),
    )


if __name__ == "__main__":
    main()
