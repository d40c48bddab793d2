"""Co-execution against its ideal bound: T*, the contention-aware T*c, and where the rest goes.

T* = 1 / (1/Tcpu + 1/Tgpu) is the latency of a perfectly divided inference when each processor
keeps the speed it has alone. On a shared-memory SoC (and on its emulation, where both
processors are cores of one chip) the two slow each other down through caches and memory
bandwidth, so the same formula over each processor's latency *while the other is busy* (T*c,
measured by :func:`codl_tvm.profiling.stats.concurrent_bound`) is the bound a plan can actually
reach.

:func:`gap_breakdown` splits a co-executed inference's latency above T*c into what its timeline
shows. Over the two lanes (GPU kernels, CPU kernels) of one inference of span ``L``::

    L = 1/2 * sum over lanes (busy + idle)                               (exact)
    busy = alone + contention      (each kernel's time in the run vs. its time alone)
    idle = sync waits + host gaps + dependency idle + host issue + head + tail

so ``L - T*c`` = the halved idle terms + the halved contention + ``work``, where
``work = 1/2 * (alone_cpu + alone_gpu) - T*c`` is what the plan's kernels cost alone beyond the
ideal division (halo rows computed twice, split kernels less efficient than whole ones, a split
away from the balance point). Every term is in milliseconds of the inference's latency, so the
terms add up to the gap exactly.

``host issue`` is the GPU lane idle while its next kernel's inputs were ready but the host had not
yet enqueued it (busy running CPU kernels or waiting): from the later of the previous GPU
kernel's end and the next kernel's ``ready_us`` (the end of the last CPU kernel it reads) to its
``queued_us``. It is what issuing the GPU ahead (:class:`~codl_tvm.passes.issue_ahead.
IssueGpuAhead`) removes; traces without enqueue times count none.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import asdict, dataclass, replace

from codl_tvm.profiling.trace import Trace, TraceEvent

__all__ = ["GapBreakdown", "LaneTime", "gap_breakdown", "ideal_bound_ms"]

_KERNEL_LANES = ("CPU", "GPU")


def ideal_bound_ms(cpu_ms: float, gpu_ms: float) -> float:
    """T* = 1 / (1/cpu_ms + 1/gpu_ms): two processors sharing one inference perfectly.

    Pass solo latencies for T*, latencies measured with the other processor busy for T*c.
    Raises ValueError for a latency that is not a positive finite number.
    """
    for what, value in (("CPU", cpu_ms), ("GPU", gpu_ms)):
        if not (value > 0 and value < float("inf")):
            raise ValueError(f"ideal bound: the {what} latency must be positive, not {value!r}")
    return 1.0 / (1.0 / cpu_ms + 1.0 / gpu_ms)


@dataclass(frozen=True)
class LaneTime:
    """Where one lane's share of an inference went, in ms (``busy + idle == span``)."""

    busy_ms: float
    alone_ms: float | None
    sync_wait_ms: float
    host_gap_ms: float
    dependency_idle_ms: float
    head_ms: float
    tail_ms: float
    host_issue_ms: float = 0.0
    #: Of the host's waits, the time after the GPU had ended the last kernel before each wait
    #: returned: the wait's own latency (waking, the event's completion), not the GPU's work.
    #: Part of ``sync_wait_ms`` (CPU lane only), not an idle term of its own.
    sync_latency_ms: float = 0.0

    @property
    def contention_ms(self) -> float | None:
        """Kernel time in the run beyond the same kernels' time alone."""
        return None if self.alone_ms is None else self.busy_ms - self.alone_ms

    @property
    def idle_ms(self) -> float:
        return (
            self.sync_wait_ms
            + self.host_gap_ms
            + self.dependency_idle_ms
            + self.host_issue_ms
            + self.head_ms
            + self.tail_ms
        )


@dataclass(frozen=True)
class GapBreakdown:
    """The latency of one co-executed inference above the bound, term by term (ms).

    ``terms`` add up to ``gap_ms`` = ``span_ms - bound_ms`` exactly (each lane's term halved,
    see the module docstring); ``contention`` and ``work`` are None without kernels timed
    alone, and ``kernels_alone`` then holds both (the lanes' busy time beyond the bound).
    """

    span_ms: float
    bound_ms: float
    cpu: LaneTime
    gpu: LaneTime

    @property
    def gap_ms(self) -> float:
        return self.span_ms - self.bound_ms

    @property
    def terms(self) -> dict[str, float | None]:
        lanes = (self.cpu, self.gpu)
        half = [0.5 * sum(getattr(x, f) for x in lanes) for f in _IDLE_FIELDS]
        busy = 0.5 * (self.cpu.busy_ms + self.gpu.busy_ms)
        out: dict[str, float | None] = dict(zip(_IDLE_TERMS, half))
        if self.cpu.alone_ms is None or self.gpu.alone_ms is None:
            out["contention"] = None
            out["work"] = None
            out["kernels_alone"] = busy - self.bound_ms
        else:
            alone = 0.5 * (self.cpu.alone_ms + self.gpu.alone_ms)
            out["contention"] = busy - alone
            out["work"] = alone - self.bound_ms
        return out

    def to_dict(self) -> dict:
        return {
            "span_ms": self.span_ms,
            "bound_ms": self.bound_ms,
            "gap_ms": self.gap_ms,
            "of_bound": self.bound_ms / self.span_ms if self.span_ms > 0 else None,
            "terms_ms": self.terms,
            "cpu": asdict(self.cpu),
            "gpu": asdict(self.gpu),
        }


_IDLE_FIELDS = (
    "sync_wait_ms",
    "host_gap_ms",
    "dependency_idle_ms",
    "host_issue_ms",
    "head_ms",
    "tail_ms",
)
_IDLE_TERMS = (
    "sync_waits",
    "host_gaps",
    "dependency_idle",
    "host_issue",
    "imbalance_head",
    "imbalance_tail",
)


def gap_breakdown(
    trace: Trace,
    bound_ms: float,
    alone: Trace | None = None,
    host_gap_us: float = 50.0,
) -> GapBreakdown:
    """Split ``trace``'s span above ``bound_ms`` (T*c, or T*) into the terms of the module
    docstring.

    Parameters
    ----------
    trace
        One co-executed inference (:func:`codl_tvm.profiling.trace.trace_inference`).
    bound_ms
        The bound the gap is measured against.
    alone
        The same build traced with every kernel run alone
        (``trace_inference(..., serial=True)``): the n-th kernel of a name on a lane is matched
        with the n-th of that name and lane. Without it, contention and work stay together.
    host_gap_us
        Idle time between two kernels of a lane up to this is the host's (VM dispatch, views
        of shared tensors, launches); longer idle waits for the other processor's data.
        The GPU lane's idle before a kernel whose inputs were ready but that the host had not
        enqueued is counted apart first (``host_issue``, see the module docstring).

    Raises
    ------
    ValueError
        If the trace has no kernel on a lane, or ``alone`` does not hold the same kernels.
    """
    if not bound_ms > 0:
        raise ValueError(f"gap breakdown: the bound must be positive, not {bound_ms!r}")
    kernels = [e for e in trace.events if e.lane in _KERNEL_LANES]
    if not kernels:
        raise ValueError("gap breakdown: the trace has no kernel")
    t0 = min(e.start_us for e in kernels)
    t1 = max(e.end_us for e in kernels)
    waits = [e for e in trace.events if e.lane == "sync"]
    alone_us = _alone_us(trace, alone) if alone is not None else None
    lanes = {}
    for lane in _KERNEL_LANES:
        own = sorted((e for e in kernels if e.lane == lane), key=lambda e: e.start_us)
        if not own:
            raise ValueError(f"gap breakdown: the trace has no {lane} kernel")
        lanes[lane] = _lane_time(
            own,
            waits if lane == "CPU" else [],
            t0,
            t1,
            None if alone_us is None else alone_us[lane],
            host_gap_us,
        )
    gpu_ends = sorted(e.end_us for e in kernels if e.lane == "GPU")
    lanes["CPU"] = replace(lanes["CPU"], sync_latency_ms=_sync_latency_us(waits, gpu_ends) / 1e3)
    return GapBreakdown((t1 - t0) / 1e3, bound_ms, lanes["CPU"], lanes["GPU"])


def _lane_time(
    events: list[TraceEvent],
    waits: list[TraceEvent],
    t0: float,
    t1: float,
    alone_us: float | None,
    host_gap_us: float,
) -> LaneTime:
    merged = _merge([(e.start_us, e.end_us) for e in events])
    busy = sum(b - a for a, b in merged)
    wait_spans = _merge([(e.start_us, e.end_us) for e in waits])
    # the kernel starting each busy interval (its enqueue and ready times)
    first = {}
    for e in events:
        first.setdefault(e.start_us, e)
    sync = host = dependency = issue = 0.0
    for (_, end), (start, _) in itertools.pairwise(merged):
        idle = start - end
        late = _not_issued(first.get(start), end)
        issue += late
        idle -= late
        waited = min(idle, _covered(end, start - late, wait_spans))
        sync += waited
        rest = idle - waited
        if rest <= host_gap_us:
            host += rest
        else:
            dependency += rest
    return LaneTime(
        busy_ms=busy / 1e3,
        alone_ms=None if alone_us is None else alone_us / 1e3,
        sync_wait_ms=sync / 1e3,
        host_gap_ms=host / 1e3,
        dependency_idle_ms=dependency / 1e3,
        head_ms=(merged[0][0] - t0) / 1e3,
        tail_ms=(t1 - merged[-1][1]) / 1e3,
        host_issue_ms=issue / 1e3,
    )


def _sync_latency_us(waits: list[TraceEvent], gpu_ends: list[float]) -> float:
    """Summed over the waits, the time from the later of the wait's start and the end of the
    last GPU kernel ended by the wait's end, to the wait's end."""
    total = 0.0
    for w in waits:
        i = bisect.bisect_right(gpu_ends, w.end_us)
        since = w.start_us if i == 0 else max(w.start_us, gpu_ends[i - 1])
        total += w.end_us - since
    return total


def _not_issued(event: TraceEvent | None, idle_from: float) -> float:
    """Of a lane's idle time from ``idle_from`` to ``event``'s start, the part where the kernel's
    inputs were ready (``ready_us``, else once the lane was idle) but it was not yet enqueued
    (``queued_us``); 0 without an enqueue time."""
    if event is None or event.queued_us is None:
        return 0.0
    ready = idle_from if event.ready_us is None else max(idle_from, event.ready_us)
    return max(0.0, min(event.queued_us, event.start_us) - ready)


def _alone_us(trace: Trace, alone: Trace) -> dict[str, float]:
    """Per lane, the alone durations of the kernels ``trace`` ran (matched by lane, name and
    occurrence)."""
    table: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in alone.events:
        if e.lane in _KERNEL_LANES:
            table[(e.lane, e.name)].append(e.dur_us)
    seen: dict[tuple[str, str], int] = defaultdict(int)
    out = dict.fromkeys(_KERNEL_LANES, 0.0)
    for e in trace.events:
        if e.lane not in _KERNEL_LANES:
            continue
        key = (e.lane, e.name)
        n = seen[key]
        if n >= len(table[key]):
            raise ValueError(
                f"gap breakdown: kernel {e.name!r} ran {n + 1} times on the {e.lane} in the "
                f"trace but {len(table[key])} times alone: not the same build"
            )
        out[e.lane] += table[key][n]
        seen[key] = n + 1
    return out


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(lo: float, hi: float, spans: list[tuple[float, float]]) -> float:
    """Length of [lo, hi] covered by the (merged) spans."""
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in spans)
