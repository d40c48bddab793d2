"""Is a default ``codl-tvm compile`` never slower than the best single processor?

Two parts, both run on the benchmark machine:

``compile-time``
    A default compile (plans, builds the plan and each processor alone, times them, keeps the
    fastest) against the same compile with ``--no-measure`` (one build, the prediction kept),
    model by model, one compile at a time in a fresh process, no build cache::

        python3 scripts/bench_never_slower.py compile-time --models squeezenet,mobilenet_v2 \\
            --model-dir /tmp/unseen --preset emulated-soc --out $OUT/compile_time.json

    ``--warm-up-counts 4,15`` times the default compile again with that many warm-up processes.
    Each compile's log lines (``-v``) are kept with their arrival in seconds
    (``default_timeline``, ``no_measure_timeline``): where the time goes, phase by phase.

``report``
    From ``bench_planner.py run`` JSONs holding the tags ``cpu``, ``gpu`` and ``default``
    (``bench_planner.py compile --default``): per model and platform, the default build against
    the processor alone that was faster over the run, round by round (the run's rounds are
    evaluation rounds, apart from the three the compile chose with), the median ratio, the
    rounds it lost and a two-sided sign test; which build the compile kept and whether the
    evaluation rounds agree; the plan's prediction against the measurement. Models outside
    the ten the cost models were fitted on are marked ``unseen``::

        python scripts/bench_never_slower.py report --runs k12.json,k14.json,h100.json \\
            --labels "emulated SoC k=12,emulated SoC k=14,H100" --out never_slower.json

A result on these models is a claim about these models only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_util import envelope, write_json

from codl_tvm.frontend.models import LIGHT_MODELS
from codl_tvm.frontend.zoo import ZOO_MODELS
from codl_tvm.profiling.stats import paired_ab

#: The ten benchmark models: the shipped cost models were fitted on their operators.
KNOWN = (*LIGHT_MODELS, *ZOO_MODELS)
#: The issue's bar: no model's median below this ratio to the best single processor.
FLOOR = 0.95


def _compile_once(
    model: Path, preset: str, cost_model: str | None, measure: bool, warm_ups: int | None = None
):
    """One ``codl-tvm compile`` in a fresh process: its seconds and its manifest, with its log
    lines on warm-ups (``"warm_ups"``: where each warm-up's time went); ``warm_ups`` sets the
    warm-up's process count (``CODL_OPENCL_WARM_UP``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "art"
        cmd = [sys.executable, "-m", "codl_tvm.cli", "-v", "compile", str(model), "-o", str(out)]
        cmd += ["--preset", preset, "--no-reference"]
        if cost_model:
            cmd += ["--cost-model", cost_model]
        if not measure:
            cmd.append("--no-measure")
        t0 = time.perf_counter()
        # caches of its own: a first compile (the kernels another compile compiled into the
        # shared PoCL and program caches would make its warm-up free)
        env = dict(os.environ)
        env["CODL_TVM_CACHE_DIR"] = str(Path(tmp) / "cache")
        env["POCL_CACHE_DIR"] = str(Path(tmp) / "pocl")
        if warm_ups is not None:
            env["CODL_OPENCL_WARM_UP"] = str(warm_ups)
        # each log line stamped with its arrival (seconds since the start): where the default
        # compile's extra time goes, phase by phase (the workers' lines come through the compile)
        timeline: list[tuple[float, str]] = []
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        for line in proc.stdout:
            timeline.append((round(time.perf_counter() - t0, 3), line.rstrip()))
        proc.wait()
        seconds = time.perf_counter() - t0
        lines = [line for _, line in timeline]
        if proc.returncode != 0:
            return seconds, {"error": lines[-1:], "timeline": timeline}
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["warm_ups"] = [line for line in lines if "compiled the OpenCL kernels" in line]
        manifest["timeline"] = timeline
        return seconds, manifest


def cmd_compile_time(args: argparse.Namespace) -> int:
    from bench_planner import _model_file

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = _model_file(name, Path(tmp), Path(args.model_dir) if args.model_dir else None)
            row: dict = {"model": name}
            # alternate which variant goes first, so a warming machine favours neither
            order = (False, True) if len(rows) % 2 == 0 else (True, False)
            for measure in order:
                seconds, manifest = _compile_once(model, args.preset, args.cost_model, measure)
                key = "default" if measure else "no_measure"
                row[f"{key}_s"] = round(seconds, 2)
                row[f"{key}_kept"] = manifest.get("device", manifest.get("error"))
                if measure:  # where the default compile's extra time goes
                    verify = manifest.get("verify") or {}
                    row["default_builds"] = verify.get("builds")
                    row["default_measure_s"] = verify.get("measure_s")
                    row["default_warm_ups"] = manifest.get("warm_ups")
                row[f"{key}_timeline"] = manifest.get("timeline")
            row["ratio"] = round(row["default_s"] / row["no_measure_s"], 3)
            for count in args.warm_up_counts:  # the default again with N warm-up processes
                seconds, manifest = _compile_once(
                    model, args.preset, args.cost_model, True, warm_ups=count
                )
                row.setdefault("default_by_warm_ups", {})[str(count)] = {
                    "s": round(seconds, 2),
                    "ratio": round(seconds / row["no_measure_s"], 3),
                    "kept": manifest.get("device", manifest.get("error")),
                    "builds": (manifest.get("verify") or {}).get("builds"),
                    "warm_ups": manifest.get("warm_ups"),
                    "timeline": manifest.get("timeline"),
                }
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_json(args.out, envelope(sys.argv, {"preset": args.preset, "models": rows}))
    return 0


def model_row(name: str, rows: dict) -> dict:
    """One model of one run: the default build against the faster processor alone."""
    cpu, gpu, dflt = (rows[t]["samples_ms"] for t in ("cpu", "gpu", "default"))
    best = "cpu" if np.median(cpu) <= np.median(gpu) else "gpu"
    versus = paired_ab([(rows[best]["samples_ms"], dflt)])  # best / default: > 1 is a gain
    verify = rows["default"].get("verify") or {}
    selected = verify.get("chosen")
    # the compile's names: "opencl" is the GPU alone, "coexec" the plan
    kept = {"opencl": "gpu", "cpu": "cpu"}.get(selected or "", "coexec" if selected else None)
    out = {
        "model": name,
        "unseen": name not in KNOWN,
        "best_single": best,
        "t_cpu_ms": round(float(np.median(cpu)), 4),
        "t_gpu_ms": round(float(np.median(gpu)), 4),
        "t_default_ms": round(float(np.median(dflt)), 4),
        "kept": kept,
        "selection_median_ms": verify.get("median_ms"),
        "speedup_vs_best_single": versus.to_json(),
        "meets_floor": versus.median >= FLOOR,
        # the default kept the faster processor's own library (by SHA-256, where the run
        # recorded it): never slower by construction, whatever the rounds say
        "same_library_as_best": rows["default"].get("library_sha256") is not None
        and rows["default"].get("library_sha256") == rows[best].get("library_sha256"),
        # the compile's three rounds chose `kept`; did the evaluation rounds rank it best too?
        "kept_is_fastest_in_evaluation": kept is not None
        and float(np.median(rows[kept if kept != "coexec" else "default"]["samples_ms"]))
        <= min(float(np.median(cpu)), float(np.median(gpu))) * (1 + 0.02),
    }
    codl = rows.get("codl")
    if codl and codl.get("predicted_ms"):
        out["codl_plan"] = {
            "device": codl.get("device"),
            "predicted_ms": round(codl["predicted_ms"], 4),
            "measured_ms": round(codl["median_ms"], 4),
            "speedup_vs_best_single": round(codl.get("speedup_vs_best_single", 0.0), 4),
        }
    return out


def cmd_report(args: argparse.Namespace) -> int:
    runs = [p for p in args.runs.split(",") if p]
    labels = args.labels.split(",") if args.labels else runs
    if len(labels) != len(runs):
        sys.exit("bench_never_slower report: give one label per run")
    table = []
    for path, label in zip(runs, labels):
        data = json.loads(Path(path).read_text())
        res = data["results"]
        for name, model in res["models"].items():
            rows = model["rows"]
            if not all("samples_ms" in rows.get(t, {}) for t in ("cpu", "gpu", "default")):
                print(f"{label}: {name} lacks cpu, gpu or default: skipped", file=sys.stderr)
                continue
            row = {"platform": label, **model_row(name, rows)}
            table.append(row)
            s = row["speedup_vs_best_single"]
            print(
                f"{label:22s} {name:20s} {'unseen' if row['unseen'] else 'known ':6s} kept "
                f"{row['kept']!s:7s} best {row['best_single']}: x{s['median_ratio']:.3f} "
                f"(lost {s['rounds_a_faster']}/{s['rounds']} rounds, p={s['sign_test_p']:.2g})"
            )
    summary = {
        group: {
            "models": len(sel),
            "meets_floor": sum(r["meets_floor"] for r in sel),
            "below_floor_with_the_best_library": sum(
                not r["meets_floor"] and r["same_library_as_best"] for r in sel
            ),
            "worst": min((r["speedup_vs_best_single"]["median_ratio"] for r in sel), default=None),
        }
        for group, sel in (
            ("unseen", [r for r in table if r["unseen"]]),
            ("known", [r for r in table if not r["unseen"]]),
        )
    }
    write_json(args.out, envelope(sys.argv, {"floor": FLOOR, "summary": summary, "rows": table}))
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile-time", help="default compile against --no-measure")
    c.add_argument("--models", required=True)
    c.add_argument("--model-dir")
    c.add_argument("--preset", required=True)
    c.add_argument("--cost-model")
    c.add_argument(
        "--warm-up-counts",
        type=lambda t: [int(x) for x in t.split(",") if x.strip()],
        default=[],
        help="also time the default compile with these warm-up process counts (e.g. 4,15)",
    )
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_compile_time)
    r = sub.add_parser("report", help="never slower? from bench_planner.py run JSONs")
    r.add_argument("--runs", required=True, help="comma list of run JSONs")
    r.add_argument("--labels", default="", help="comma list, one per run (e.g. H100)")
    r.add_argument("--out", required=True)
    r.set_defaults(func=cmd_report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
