"""Modelling variants of the GBDT cost model on the device datasets, with the held-out protocol of
``codl-tvm cost-model fit/eval`` (70/30 split by record-key hash, seed 0, training records
inconsistent by a factor 3 dropped unless a variant says otherwise). A variant is worth adopting
only if it improves the held-out accuracy on every dataset. No timing happens here::

    python scripts/cost_model_experiments.py --out results/cost_model_experiments.json

Variants: the training set (keep inconsistent records, drop at factor 2, one median record per
identical part), extra features (bytes moved, arithmetic intensity, waves of parallel items over
the cores / compute units and the tail efficiency of the last wave), and tree capacity. Each
result gives per processor ``[+-10% accuracy in %, MAPE in %]``, with the dispatch features
(what ``cost-model eval`` reports) and without them (``*_blind``: what the planner passes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import warnings
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import numpy as np

# The same device datasets as the noise analysis (a sibling script: scripts/ is on the path
# when this one runs).
from noise_analysis import DATASETS

#: Variant name -> options of :func:`run_variant` (GbdtConfig fields under ``config``).
VARIANTS: dict[str, dict] = {
    "baseline (shipped recipe)": {},
    "keep inconsistent records": {"drop": 0.0},
    "drop inconsistent at factor 2": {"drop": 2.0},
    "median of identical parts": {"dedupe": True},
    "features: bytes, intensity, waves, tail efficiency": {"extra_features": True},
    "300 trees, lr 0.05": {"config": {"n_estimators": 300, "learning_rate": 0.05}},
    "depth 6": {"config": {"max_depth": 6}},
    "300 trees, depth 5, lr 0.05": {
        "config": {"n_estimators": 300, "max_depth": 5, "learning_rate": 0.05}
    },
    "300 trees, depth 6, lr 0.05": {
        "config": {"n_estimators": 300, "max_depth": 6, "learning_rate": 0.05}
    },
    "300 trees, depth 6, lr 0.05 + features": {
        "config": {"n_estimators": 300, "max_depth": 6, "learning_rate": 0.05},
        "extra_features": True,
    },
}

EXTRA_NAMES: tuple[str, ...] = ("bytes", "intensity", "waves", "tail_eff")


def extra_features(f, compute_units: int | None) -> list[float]:
    """Bytes a part moves (fp32 input, weight, output), MACs per byte, and how its parallel
    items (GPU work-groups, CPU parallel blocks) fill ``lanes`` (compute units, CPU threads):
    waves ``ceil(items / lanes)`` and the last wave's efficiency ``items / (waves * lanes)``.

    Parameters
    ----------
    f : OpFeatures
        The part.
    compute_units : int | None
        Compute units of the OpenCL device (from the records' device description).

    Returns
    -------
    list[float]
        The four values in ``EXTRA_NAMES`` order (NaN where the dispatch is unknown).
    """
    q, p, d = f.part, f.params, f.dispatch
    out = q.out_h * q.out_w * q.oc
    per_group_ic = q.ic // max(q.groups, 1)
    weight = {"conv2d": q.oc * per_group_ic * p.kernel**2, "dense": q.ic * q.oc}.get(f.op, 0)
    nbytes = 4.0 * (q.in_h * q.in_w * q.ic + weight + out)
    red = p.kernel**2 if f.op == "pool" else per_group_ic * p.kernel**2
    gpu = f.processor == "gpu"
    items, lanes = (d.wg_count, compute_units) if gpu else (d.cpu_parallel_blocks, d.threads)
    if items and lanes:
        waves = math.ceil(items / lanes)
        eff = items / (waves * lanes)
    else:
        waves = eff = float("nan")
    return [nbytes, out * red / nbytes, float(waves), eff]


def run_variant(
    paths: list[str],
    config: dict | None = None,
    drop: float = 3.0,
    dedupe: bool = False,
    extra_features_on: bool = False,
) -> dict:
    """Fit one variant on the training part of ``paths`` and score it on the held-out part.

    Parameters
    ----------
    paths : list[str]
        Datasets fitted together.
    config : dict, optional
        ``GbdtConfig`` fields that differ from the defaults.
    drop : float
        ``--drop-inconsistent`` factor (0: keep all).
    dedupe : bool
        Replace the training records of one identical part by one with their median latency.
    extra_features_on : bool
        Add ``EXTRA_NAMES`` to the trees' features.

    Returns
    -------
    dict
        ``{processor: [acc10 %, MAPE %], processor + "_blind": [...]}``.
    """
    from codl_tvm.cost_model import gbdt
    from codl_tvm.cost_model.dataset import OpRecord, load_dataset
    from codl_tvm.cost_model.evaluate import accuracy, part_identity, training_split

    records = [r for p in paths for r in load_dataset(p).records]
    cus = next(r.device.get("compute_units") for r in records if isinstance(r, OpRecord))
    train, test, _ = training_split(records, 0.3, 0, drop)
    if dedupe:
        groups: dict[tuple, list] = {}
        for r in train:
            if isinstance(r, OpRecord):
                groups.setdefault(part_identity(r), []).append(r)
        train = [r for r in train if not isinstance(r, OpRecord)] + [
            dataclasses.replace(rs[0], latency_ms=float(np.median([r.latency_ms for r in rs])))
            for rs in groups.values()
        ]
    base_matrix = gbdt._matrix

    def matrix(features):
        ex = np.array([extra_features(f, cus) for f in features], dtype=np.float64)
        return np.hstack([base_matrix(features), ex])

    # The trees read their feature matrix through these two module names.
    patch = (
        mock.patch.multiple(gbdt, _matrix=matrix, FEATURE_NAMES=gbdt.FEATURE_NAMES + EXTRA_NAMES)
        if extra_features_on
        else nullcontext()
    )
    ops = [r for r in test if isinstance(r, OpRecord)]
    y = np.array([r.latency_ms for r in ops])
    procs = np.array([r.processor for r in ops])
    out = {}
    with patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = gbdt.GbdtModel(gbdt.GbdtConfig(**(config or {}))).fit(train)
        feats = [r.features() for r in ops]
        blind = [dataclasses.replace(f, dispatch=gbdt.DispatchFeatures()) for f in feats]
        for suffix, pred in (
            ("", model.predict_many(feats)),
            ("_blind", model.predict_many(blind)),
        ):
            for proc in ("cpu", "gpu"):
                s = procs == proc
                a = accuracy(pred[s], y[s])
                out[proc + suffix] = [round(100 * a.acc10, 1), round(a.mape, 1)]
    out["n_test"] = {proc: int(np.sum(procs == proc)) for proc in ("cpu", "gpu")}
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: run every variant on every dataset and write the JSON report (prints
    ``[cpu, gpu]`` per dataset as it goes)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/cost_model_experiments.json")
    args = p.parse_args(argv)
    results = {}
    for name, opts in VARIANTS.items():
        opts = dict(opts)
        opts["extra_features_on"] = opts.pop("extra_features", False)
        results[name] = {d: run_variant(paths, **opts) for d, paths in DATASETS.items()}
        brief = {d: [r["cpu"], r["gpu"]] for d, r in results[name].items()}
        print(name, json.dumps(brief), flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    report = {
        "what": __doc__.split("\n\n")[0].replace("\n", " ").rstrip(":") + ".",
        "command": "python scripts/cost_model_experiments.py",
        "commit": commit,
        "datasets": DATASETS,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
