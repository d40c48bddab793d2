"""Refine a plan's ratios from timelines of the built model (measured in the model, not alone).

The planner balances each split with the cost model's predictions of the parts run alone. In the
model the parts run at other speeds: the other processor competes for memory, caches hold other
data, a kernel's isolated profile misses its in-model time by up to 2x (YOLOv2's 13x13x1024
convs). A timeline (:func:`codl_tvm.profiling.trace.trace_inference`) attributes each kernel to its
split,
so each split's time on each processor is measured where it matters. Assuming each part's time
is proportional to its share of the output (what the planner assumes too), the GPU share that
balances the split is

    s* = C / (C + G),   C = t_cpu / (1 - s),   G = t_gpu / s,

with ``s`` the GPU's share of the rows or channels it was built with (after rounding to whole
rows). :func:`refine_plan` moves every split of the plan to that share and the plan's
``block_ratio`` to the share that balances its channel blocks together. Operators kept whole
and unsplit kernels keep their processor: one timeline cannot say how fast the other processor
would have run them. Repeat (build, trace, refine) to converge where parts are not
proportional.

An output-channel cut moves in whole vectors of :data:`OC_ALIGN` channels where the layer has
at least four: CPU kernels tile output channels, and a part of, say, 151 channels (a prime) left
VGG19's Winograd conv without a usable tile (73 ms against 5 ms for 169 channels, measured on
a 16-core Xeon).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from codl_tvm.core.errors import RefineError
from codl_tvm.core.plan import PartitionPlan

__all__ = ["RefineError", "SplitTime", "moves", "refine_plan", "split_times"]

CHANNEL_BLOCK_SUFFIX = "+channels"
#: Channels an output-channel cut of a refined split moves in (an AVX-512 vector of fp32).
OC_ALIGN = 16


@dataclass(frozen=True)
class SplitTime:
    """Median busy time of one split on each processor over the timelines, microseconds."""

    cpu_us: float
    gpu_us: float
    samples: int


def split_times(traces: Sequence) -> dict[str, SplitTime]:
    """Each split's busy time per processor: the sum of its kernels' durations on each lane in
    one timeline, the median over ``traces``."""
    per: dict[str, dict[str, list[float]]] = {}
    for trace in traces:
        sums: dict[str, dict[str, float]] = {}
        for e in trace.events:
            if e.split is None or e.lane not in ("CPU", "GPU"):
                continue
            lane = sums.setdefault(e.split, {"CPU": 0.0, "GPU": 0.0})
            lane[e.lane] += e.dur_us
        for split, lanes in sums.items():
            acc = per.setdefault(split, {"CPU": [], "GPU": []})
            for lane, v in lanes.items():
                acc[lane].append(v)
    if not per:
        raise RefineError(
            "the timelines attribute no kernel to a split (a build without its kernel record, "
            "or a model that runs on one processor)"
        )
    return {
        split: SplitTime(float(np.median(v["CPU"])), float(np.median(v["GPU"])), len(v["CPU"]))
        for split, v in per.items()
    }


def _balanced(share: float, cpu_us: float, gpu_us: float) -> float | None:
    if not 0.0 < share < 1.0 or cpu_us <= 0.0 or gpu_us <= 0.0:
        return None
    whole_cpu = cpu_us / (1.0 - share)
    whole_gpu = gpu_us / share
    return whole_cpu / (whole_cpu + whole_gpu)


def _align_oc(ratio: float, info: dict, min_share: float) -> float:
    """``ratio`` moved to the nearest cut in whole :data:`OC_ALIGN` vectors of channels, for an
    output-channel split of at least four vectors; the cut stays inside the bounds."""
    extent = int(info.get("extent") or 0)
    if info["dim"] != "OC" or extent % OC_ALIGN or extent < 4 * OC_ALIGN:
        return ratio
    vectors = extent // OC_ALIGN
    lo = math.ceil(min_share * vectors)
    cut = min(vectors - lo, max(lo, round(ratio * vectors)))
    # a ratio that rounds (split_point: half up) to exactly this cut
    return cut / vectors


def refine_plan(
    plan: PartitionPlan,
    kernel_splits: dict,
    times: dict[str, SplitTime],
    *,
    step: float = 1.0,
    min_share: float = 0.05,
) -> tuple[PartitionPlan, list[dict]]:
    """Move each split of ``plan`` towards the GPU share that balanced it in the timelines.

    Parameters
    ----------
    plan
        The plan the timelines were measured with.
    kernel_splits
        The build's record (:func:`codl_tvm.passes.kernel_splits.kernel_splits`): each split's
        operators and built GPU share.
    times
        :func:`split_times` of the build's timelines.
    step
        Fraction of the way to the balanced share (1: all of it).
    min_share
        Shares stay within ``[min_share, 1 - min_share]``: a refinement keeps a split split.

    Returns
    -------
    (PartitionPlan, list of dict)
        The refined plan, and per split: operators, built share, measured CPU/GPU ms, balanced
        share and the new ratio (rows ``"split"`` named ``block_ratio`` for the channel blocks).
    """
    if not 0.0 < step <= 1.0:
        raise RefineError(f"step must be in (0, 1], got {step!r}")
    if not 0.0 < min_share < 0.5:
        raise RefineError(f"min_share must be in (0, 0.5), got {min_share!r}")
    splits = (kernel_splits or {}).get("splits")
    if not splits:
        raise RefineError("the build recorded no splits (kernel_splits is empty)")

    def clamp(v: float) -> float:
        return round(min(1.0 - min_share, max(min_share, v)), 2)

    by_ops = {tuple(e.ops): e for e in plan.entries()}
    new_ratio: dict[tuple[str, ...], float] = {}
    rows: list[dict] = []
    block_cpu = block_gpu = 0.0
    block_shares: list[float] = []
    for name, info in splits.items():
        t = times.get(name)
        share = float(info["gpu_share"])
        row = {
            "split": name,
            "ops": list(info["ops"]),
            "dim": info["dim"],
            "built_share": round(share, 4),
            "cpu_ms": None if t is None else t.cpu_us / 1e3,
            "gpu_ms": None if t is None else t.gpu_us / 1e3,
        }
        rows.append(row)
        if t is None:
            row["note"] = "not in the timelines"
            continue
        balanced = _balanced(share, t.cpu_us, t.gpu_us)
        if balanced is None:
            row["note"] = "one processor only: kept"
            continue
        row["balanced_share"] = round(balanced, 4)
        if name.endswith(CHANNEL_BLOCK_SUFFIX):
            block_cpu += t.cpu_us / (1.0 - share)
            block_gpu += t.gpu_us / share
            block_shares.append(share)
            continue
        entry = by_ops.get(tuple(info["ops"]))
        if entry is None:
            row["note"] = "no plan entry has these operators: kept"
            continue
        ratio = clamp(entry.ratio + step * (balanced - share))
        ratio = _align_oc(ratio, info, min_share)
        row["new_ratio"] = ratio
        new_ratio[tuple(entry.ops)] = ratio
    block_ratio = plan.block_ratio
    if block_shares:
        current = float(np.mean(block_shares)) if plan.block_ratio is None else plan.block_ratio
        balanced = block_cpu / (block_cpu + block_gpu)
        block_ratio = clamp(current + step * (balanced - float(np.mean(block_shares))))
        rows.append(
            {
                "split": "block_ratio",
                "built_share": round(float(np.mean(block_shares)), 4),
                "balanced_share": round(balanced, 4),
                "new_ratio": block_ratio,
            }
        )
    ops = tuple(dataclasses.replace(p, ratio=new_ratio.get((p.op,), p.ratio)) for p in plan.ops)
    chains = tuple(
        dataclasses.replace(c, ratio=new_ratio.get(tuple(c.ops), c.ratio)) for c in plan.chains
    )
    return dataclasses.replace(plan, ops=ops, chains=chains, block_ratio=block_ratio), rows


def moves(rows: Sequence[dict]) -> list[str]:
    """``"<split> <built share>-><new ratio>"`` for every row of :func:`refine_plan` that moved."""
    return [
        f"{row['split']} {row['built_share']:.2f}->{row['new_ratio']:.2f}"
        for row in rows
        if "new_ratio" in row
    ]
