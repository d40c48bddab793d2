"""Where the measurement noise of the profiling datasets comes from, and how much of the cost
models' held-out error it explains. No timing happens here: everything is read from
the shipped datasets in ``codl_tvm/data/cost_models/datasets``::

    python scripts/noise_analysis.py --out benchmarks/noise_analysis.json
    python scripts/noise_analysis.py --runs A.jsonl B.jsonl --out runs.json  # two runs compared

Three views of the noise, per dataset and processor:

- **Identical parts**: records whose built kernel is the same (operator, processor,
  implementation, parameters, part shape, padding side, dispatch features; the grouping of
  ``evaluate.noise_floor``), e.g. a whole operator and its H part at ratio 0.7 when the output has
  one row. Each unordered pair is two independent measurements of one kernel, taken at different
  times of the run (the record order in a file is the measuring order). Reported by latency
  band, implementation, distance in the file, and which of the two was measured first.
- **Nested parts**: adjacent parts of one operator split along one dim (more FLOPs, same
  implementation); an *inversion* is a part with fewer FLOPs measured > 10% slower. A lower bound
  on noise with far wider coverage than the identical parts (real shape effects also invert).
- **Held-out model error**: a GBDT fitted exactly as ``codl-tvm cost-model fit DATA --kind gbdt``
  does (70/30 split by key hash, seed 0, inconsistent training records dropped), its errors per
  latency band and file position, and the share of its log-residual variance that one
  measurement's noise accounts for (robust sigmas: 1.4826 * MAD).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: The device-machine datasets: direct kernels plus the CPU-alone algorithms measured on the
#: same device (fitted together, as the shipped models are).
DATASETS: dict[str, list[str]] = {
    "emulated_soc_k8": [
        "codl_tvm/data/cost_models/datasets/emulated_soc.jsonl.gz",
        "codl_tvm/data/cost_models/datasets/emulated_soc_algos.jsonl.gz",
    ],
    "emulated_soc_k12": [
        "codl_tvm/data/cost_models/datasets/emulated_soc_k12.jsonl.gz",
        "codl_tvm/data/cost_models/datasets/emulated_soc_k12_algos.jsonl.gz",
    ],
    "h100": ["codl_tvm/data/cost_models/datasets/h100.jsonl.gz"],
}

#: Latency bands (ms) of the breakdowns: decades, so that each has enough records.
BANDS: tuple[tuple[float, float], ...] = ((0.0, 0.1), (0.1, 1.0), (1.0, 10.0), (10.0, math.inf))

LOG10PCT = math.log(1.1)

#: Fewest identical-part pairs of a processor whose noise is compared with a model's error.
MIN_PAIRS = 10


def _band(lo: float, hi: float) -> str:
    return f"[{lo:g},{hi:g}) ms"


def robust_sigma(x: np.ndarray) -> float:
    """Standard deviation estimated from the median absolute deviation (1.4826 * MAD): the
    width of the bulk of a distribution whose tails hold a few interference outliers.

    Parameters
    ----------
    x : numpy.ndarray
        Samples (e.g. log ratios).

    Returns
    -------
    float
        The robust sigma; NaN for no samples.
    """
    if len(x) == 0:
        return float("nan")
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def sign_test_p(k: int, n: int) -> float:
    """Two-sided exact sign-test p-value of ``k`` successes in ``n`` fair coin flips.

    Parameters
    ----------
    k, n : int
        Successes and trials.

    Returns
    -------
    float
        The p-value (1.0 for ``n == 0``).
    """
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2.0**n
    return float(min(1.0, 2.0 * tail))


def load(paths: Sequence[str]) -> list[tuple[str, int, object]]:
    """``(file, position, OpRecord)`` for every operator record of ``paths`` (position: index
    among the file's operator records, i.e. the measuring order)."""
    from codl_tvm.cost_model.dataset import load_dataset

    out = []
    for path in paths:
        for i, r in enumerate(load_dataset(path).op_records):
            out.append((path, i, r))
    return out


def _kernel_key(path: str, r) -> tuple:
    from codl_tvm.cost_model.evaluate import part_identity

    return (path, *part_identity(r))


def identical_pairs(rows: list[tuple[str, int, object]]) -> list[dict]:
    """Every unordered pair of records of one kernel, earlier-measured first.

    Parameters
    ----------
    rows : list
        ``(file, position, OpRecord)`` as :func:`load` returns.

    Returns
    -------
    list[dict]
        ``processor``, ``impl``, ``first_ms``, ``later_ms``, ``gap`` (records between them in
        the file), ``latency_ms`` (geometric mean), ``log_later_first``, ``what``.
    """
    groups: dict[tuple, list] = {}
    for path, i, r in rows:
        groups.setdefault(_kernel_key(path, r), []).append((i, r))
    pairs = []
    for recs in groups.values():
        recs.sort(key=lambda t: t[0])
        for a in range(len(recs)):
            for b in range(a + 1, len(recs)):
                (i, r1), (j, r2) = recs[a], recs[b]
                pairs.append(
                    {
                        "processor": r1.processor,
                        "impl": r1.impl,
                        "first_ms": r1.latency_ms,
                        "later_ms": r2.latency_ms,
                        "gap": j - i,
                        "latency_ms": math.sqrt(r1.latency_ms * r2.latency_ms),
                        "log_later_first": math.log(r2.latency_ms / r1.latency_ms),
                        "what": f"{r1.params.describe()} {r1.processor} "
                        f"{r1.partition.dim}:{r1.partition.ratio:g} vs "
                        f"{r2.partition.dim}:{r2.partition.ratio:g}",
                    }
                )
    return pairs


def pair_stats(pairs: list[dict]) -> dict:
    """Agreement of identical-part pairs: ``acc10``/``mape`` over ordered pairs (each record
    taken as the prediction of the other, as ``evaluate.noise_floor``), the median and robust
    sigma of |log ratio|, and ``sigma_one``: the robust noise of one measurement in log units
    (the pair difference has twice its variance)."""
    if not pairs:
        return {"pairs": 0}
    lr = np.array([p["log_later_first"] for p in pairs])
    rel = np.concatenate([np.abs(np.exp(lr) - 1.0), np.abs(np.exp(-lr) - 1.0)])
    return {
        "pairs": len(pairs),
        "acc10": float(np.mean(rel <= 0.1 + 1e-12)),
        "mape": float(100.0 * np.mean(rel)),
        "median_abs_log_ratio": float(np.median(np.abs(lr))),
        "share_beyond_factor_1_5": float(np.mean(np.abs(lr) > math.log(1.5))),
        "sigma_one": (sigma := robust_sigma(np.concatenate([lr, -lr])) / math.sqrt(2.0)),
        # A perfect model is compared with one noisy measurement, not two: with the bulk's
        # Gaussian sigma_one its +-10% accuracy would be this (tails not included).
        "perfect_model_acc10_gaussian": math.erf(LOG10PCT / (sigma * math.sqrt(2.0)))
        if sigma > 0
        else 1.0,
    }


def order_stats(pairs: list[dict]) -> dict:
    """Is the earlier or the later measurement of a kernel systematically higher? Mean and
    median log(later / first), the share of pairs where the later one is higher, and the
    sign test's p-value (exact ties left out)."""
    lr = np.array([p["log_later_first"] for p in pairs])
    nz = lr[lr != 0]
    k = int(np.sum(nz > 0))
    return {
        "pairs": len(pairs),
        "mean_log_later_over_first": float(np.mean(lr)) if len(lr) else float("nan"),
        "median_log_later_over_first": float(np.median(lr)) if len(lr) else float("nan"),
        "share_later_higher": float(k / len(nz)) if len(nz) else float("nan"),
        "sign_test_p": sign_test_p(k, len(nz)),
    }


def identical_report(pairs: list[dict]) -> dict:
    """Identical-part agreement overall, per processor, latency band, implementation, distance
    in the measuring order, and order effects."""
    out: dict = {"overall": pair_stats(pairs)}
    for proc in ("cpu", "gpu"):
        sel = [p for p in pairs if p["processor"] == proc]
        if not sel:
            continue
        out[proc] = pair_stats(sel)
        out[f"{proc}_by_latency"] = {
            _band(lo, hi): pair_stats([p for p in sel if lo <= p["latency_ms"] < hi])
            for lo, hi in BANDS
        }
        out[f"{proc}_at_least_0.2ms"] = pair_stats([p for p in sel if p["latency_ms"] >= 0.2])
        out[f"{proc}_by_gap"] = {
            "measured within 4 records": pair_stats([p for p in sel if p["gap"] <= 4]),
            "measured > 4 records apart": pair_stats([p for p in sel if p["gap"] > 4]),
        }
        out[f"{proc}_order"] = order_stats(sel)
    out["by_impl"] = {
        f"{proc}/{impl}": pair_stats(
            [p for p in pairs if p["processor"] == proc and p["impl"] == impl]
        )
        for proc, impl in sorted({(p["processor"], p["impl"]) for p in pairs})
    }
    worst = sorted(pairs, key=lambda p: -abs(p["log_later_first"]))[:6]
    out["worst_pairs"] = [
        {"what": p["what"], "first_ms": p["first_ms"], "later_ms": p["later_ms"], "gap": p["gap"]}
        for p in worst
    ]
    return out


def nested_report(rows: list[tuple[str, int, object]]) -> dict:
    """Inversions among adjacent parts of one operator split along one dim: the part with
    fewer FLOPs measured more than 10% slower. ``same_dispatch``: only pairs whose kernels
    split the work alike (same OpenCL work-group size / CPU vector width and kernel count), so
    a schedule change is not counted as noise."""
    groups: dict[tuple, list] = {}
    for path, _, r in rows:
        if r.partition.dim == "none":
            continue
        key = (path, r.params, r.processor, r.partition.dim, r.impl)
        groups.setdefault(key, []).append((r.features().flops, r))
    found: dict[str, list[tuple[float, bool, bool]]] = {"cpu": [], "gpu": []}
    for recs in groups.values():
        recs.sort(key=lambda t: (t[0], t[1].latency_ms))
        for (f1, small), (f2, big) in itertools.pairwise(recs):
            if f2 <= f1:
                continue
            d1, d2 = small.dispatch, big.dispatch
            same = (d1.wg_size, d1.vector_width, d1.num_kernels) == (
                d2.wg_size,
                d2.vector_width,
                d2.num_kernels,
            )
            inverted = small.latency_ms > 1.1 * big.latency_ms
            found[small.processor].append((big.latency_ms, inverted, same))

    def share(items) -> dict:
        return {
            "pairs": len(items),
            "inverted_10pct": float(np.mean([x[1] for x in items])) if items else float("nan"),
        }

    out = {}
    for proc, items in found.items():
        if not items:
            continue
        same = [x for x in items if x[2]]
        out[proc] = {
            "all": share(items),
            "same_dispatch": share(same),
            "same_dispatch_by_latency": {
                _band(lo, hi): share([x for x in same if lo <= x[0] < hi]) for lo, hi in BANDS
            },
        }
    return out


def heldout_model(paths: Sequence[str], rows: list[tuple[str, int, object]], noise: dict) -> dict:
    """Fit a GBDT as ``codl-tvm cost-model fit PATHS --kind gbdt`` does (default options) and
    break its held-out errors down by latency band and file position; compare with the
    identical-part noise (``noise``: :func:`identical_report`)."""
    from codl_tvm.cost_model.dataset import load_dataset
    from codl_tvm.cost_model.evaluate import accuracy, fit_model, training_split

    records = [r for p in paths for r in load_dataset(p).records]
    train, test, _ = training_split(records, 0.3, 0, 3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fit_model("gbdt", train)
        # Records are unique by key within the datasets (a resumed run skips a measured key).
        where = {r.key(): (i, n) for (_, i, r), n in zip(rows, _file_sizes(rows))}
        test = [r for r in test if r.key() in where]
        pred = model.predict_many([r.features() for r in test])
    meas = np.array([r.latency_ms for r in test])
    res = np.log(pred / meas)
    procs = np.array([r.processor for r in test])
    pos = np.array([where[r.key()][0] / where[r.key()][1] for r in test])

    def acc(sel) -> dict:
        a = accuracy(pred[sel], meas[sel])
        return {"n": a.n, "acc10": a.acc10, "mape": a.mape}

    out: dict = {
        "fit": "gbdt, default GbdtConfig, 70% of the records (split by key hash, seed 0), "
        "records inconsistent by a factor 3 dropped from training (cmd_fit's defaults)",
        "overall": acc(np.ones(len(test), bool)),
    }
    for proc in ("cpu", "gpu"):
        s = procs == proc
        if not s.any():
            continue
        sigma_res = robust_sigma(res[s])
        # Too few identical pairs (the k = 12 dataset has 2 per processor) say nothing.
        enough = noise.get(proc, {}).get("pairs", 0) >= MIN_PAIRS
        sigma_noise = noise[proc]["sigma_one"] if enough else float("nan")
        dec = np.minimum((pos * 10).astype(int), 9)
        out[proc] = {
            **acc(s),
            "at_least_0.2ms": acc(s & (meas >= 0.2)),
            "by_latency": {_band(lo, hi): acc(s & (meas >= lo) & (meas < hi)) for lo, hi in BANDS},
            "robust_sigma_log_residual": sigma_res,
            "noise_share_of_residual_variance": (sigma_noise / sigma_res) ** 2 if enough else None,
            "by_file_position_decile": [
                {
                    "median_log_pred_over_meas": float(np.median(res[s & (dec == k)])),
                    **acc(s & (dec == k)),
                }
                for k in range(10)
                if (s & (dec == k)).any()
            ],
        }
    return out


def _file_sizes(rows: list[tuple[str, int, object]]) -> list[int]:
    sizes: dict[str, int] = {}
    for path, _, _ in rows:
        sizes[path] = sizes.get(path, 0) + 1
    return [sizes[path] for path, _, _ in rows]


def analyse(name: str, paths: Sequence[str], model: bool = True) -> dict:
    """Every view of one dataset (see the module docstring)."""
    rows = load(paths)
    lat = np.array([r.latency_ms for _, _, r in rows])
    samples: dict[str, int] = {}
    for _, _, r in rows:
        samples[str(r.repeats)] = samples.get(str(r.repeats), 0) + 1
    pairs = identical_pairs(rows)
    noise = identical_report(pairs)
    out = {
        "paths": list(paths),
        "op_records": len(rows),
        "samples_per_record": samples,
        "latency_quantiles_ms_10_25_50_75_90": [
            float(v) for v in np.quantile(lat, [0.1, 0.25, 0.5, 0.75, 0.9])
        ],
        "share_below_0.1ms": float(np.mean(lat < 0.1)),
        "identical_parts": noise,
        "nested_parts": nested_report(rows),
    }
    if model:
        out["heldout_gbdt"] = heldout_model(paths, rows, noise)
    return out


def compare_runs(first: str, second: str) -> dict:
    """Repeatability of two runs over the same parts (e.g. ``codl-tvm profile --run-dir DIR``
    twice into two datasets): records matched by key, each pair scored as identical parts are
    (:func:`pair_stats`, by processor and latency band), with the spread the records carry
    (``(max_ms - min_ms) / latency_ms`` where the profiler recorded it).

    Parameters
    ----------
    first, second : str
        The two datasets (the first one measured first).

    Returns
    -------
    dict
        ``timing`` of each run (its header's ``meta["timing"]``, None before it was recorded),
        per processor the pair statistics, their latency breakdown and order effect, and the
        median and 90th percentile of the recorded spread.
    """
    from codl_tvm.cost_model.dataset import load_dataset

    da, db = load_dataset(first), load_dataset(second)
    earlier = {r.key(): r for r in da.op_records}
    pairs, spreads = [], {"cpu": [], "gpu": []}
    for r in db.op_records:
        o = earlier.get(r.key())
        if o is None:
            continue
        pairs.append(
            {
                "processor": r.processor,
                "impl": r.impl,
                "first_ms": o.latency_ms,
                "later_ms": r.latency_ms,
                "gap": 0,
                "latency_ms": math.sqrt(o.latency_ms * r.latency_ms),
                "log_later_first": math.log(r.latency_ms / o.latency_ms),
                "what": f"{r.params.describe()} {r.processor} "
                f"{r.partition.dim}:{r.partition.ratio:g}",
            }
        )
        spreads[r.processor] += [x.spread for x in (o, r) if x.spread is not None]
    out: dict = {
        "runs": [first, second],
        "timing": [da.meta.get("timing"), db.meta.get("timing")],
        "overall": pair_stats(pairs),
    }
    for proc in ("cpu", "gpu"):
        sel = [p for p in pairs if p["processor"] == proc]
        sp = np.array(spreads[proc])
        out[proc] = {
            **pair_stats(sel),
            "by_latency": {
                _band(lo, hi): pair_stats([p for p in sel if lo <= p["latency_ms"] < hi])
                for lo, hi in BANDS
            },
            "order": order_stats(sel),
            "recorded_spread_median": float(np.median(sp)) if len(sp) else None,
            "recorded_spread_p90": float(np.quantile(sp, 0.9)) if len(sp) else None,
        }
    return out


def _finite(obj):
    """``obj`` with NaN/inf floats as None (strict JSON; empty bands have no statistics)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Command line: analyse the datasets and write the JSON report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/noise_analysis.json")
    p.add_argument("--datasets", default=",".join(DATASETS), help="names among DATASETS")
    p.add_argument("--no-model", action="store_true", help="skip the held-out GBDT fits")
    p.add_argument(
        "--runs",
        nargs=2,
        metavar=("FIRST.jsonl", "SECOND.jsonl"),
        help="instead: the repeatability of two runs over the same parts (compare_runs)",
    )
    args = p.parse_args(argv)
    command = " ".join(["python scripts/noise_analysis.py", *(argv or sys.argv[1:])])
    if args.runs:
        result = {"command": command, "commit": _commit(), **compare_runs(*args.runs)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")
        for proc in ("cpu", "gpu"):
            r = result[proc]
            if r.get("pairs"):
                print(
                    f"{proc}: {r['pairs']} parts, within +-10%: {100 * r['acc10']:.1f}%, "
                    f"MAPE {r['mape']:.1f}%, one-measurement sigma {100 * r['sigma_one']:.1f}%, "
                    f"> 1.5x apart: {100 * r['share_beyond_factor_1_5']:.1f}%"
                )
        print(f"wrote {args.out}")
        return 0
    names = [n for n in args.datasets.split(",") if n]
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        p.error(f"unknown datasets {unknown}; known: {list(DATASETS)}")
    result = {
        "what": __doc__.split("\n\n")[0].replace("\n", " ").rstrip(":") + ".",
        "command": command,
        "commit": _commit(),
        "datasets": {n: analyse(n, DATASETS[n], not args.no_model) for n in names},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(_finite(result), indent=1, allow_nan=False) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
