"""Timeline of one co-executed inference: every kernel on a GPU lane and a CPU lane.

GPU kernels come from OpenCL event timestamps (:func:`codl_tvm.runtime.record_kernels`), CPU
kernels and synchronisation waits from host timestamps taken by a Relax VM instrument around each
call. The two clocks are put on one time base by the launch of each GPU kernel: its host call
precedes its device "queued" timestamp, so the smallest host-minus-device difference over all
launches is the offset (error: one launch overhead, a few microseconds).

Given the build's kernel calls in execution order with their splits (``kernel_splits``, from
:func:`codl_tvm.passes.kernel_splits.kernel_splits`; an artifact stores them), every kernel event
also names the split of the plan it computes (``TraceEvent.split``), so that a split's time on
each processor can be read off the timeline (:func:`codl_tvm.planner.split.refine.split_times`).
"""

from __future__ import annotations

import itertools
import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm

from codl_tvm import runtime
from codl_tvm.runtime import sync

__all__ = ["Trace", "TraceEvent", "trace_inference"]

_LANES = ("GPU", "CPU", "sync")


@dataclass(frozen=True)
class TraceEvent:
    """One interval on a lane, in microseconds from the start of the inference."""

    lane: str
    name: str
    start_us: float
    end_us: float
    split: str | None = None
    #: GPU kernels: when the host enqueued it (the device's "queued" timestamp).
    queued_us: float | None = None
    #: GPU kernels: when its inputs were ready: the end of the last CPU kernel call it must
    #: follow (the build's ``kernel_splits["gpu_inputs"]``), None where none or unknown.
    ready_us: float | None = None

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass
class Trace:
    """The events of one inference, with summary statistics."""

    events: list[TraceEvent] = field(default_factory=list)

    def busy_us(self, lane: str) -> float:
        """Time the lane is busy (union of its intervals)."""
        return _union_length([(e.start_us, e.end_us) for e in self.events if e.lane == lane])

    def overlap_us(self) -> float:
        """Time during which a GPU kernel and a CPU kernel run at once."""
        gpu = _merge([(e.start_us, e.end_us) for e in self.events if e.lane == "GPU"])
        cpu = _merge([(e.start_us, e.end_us) for e in self.events if e.lane == "CPU"])
        total, i, j = 0.0, 0, 0
        while i < len(gpu) and j < len(cpu):
            lo, hi = max(gpu[i][0], cpu[j][0]), min(gpu[i][1], cpu[j][1])
            total += max(0.0, hi - lo)
            if gpu[i][1] < cpu[j][1]:
                i += 1
            else:
                j += 1
        return total

    def span_us(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end_us for e in self.events) - min(e.start_us for e in self.events)

    def gpu_gap_us(self) -> float:
        """Median idle time between consecutive GPU kernels (the driver's launch cost while the
        queue is fed; 0 without two GPU kernels)."""
        gpu = sorted((e.start_us, e.end_us) for e in self.events if e.lane == "GPU")
        gaps = [max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(gpu)]
        return float(np.median(gaps)) if gaps else 0.0

    def summary(self) -> dict[str, float]:
        gpu_names = [e.name for e in self.events if e.lane == "GPU"]
        return {
            "span_us": self.span_us(),
            "gpu_busy_us": self.busy_us("GPU"),
            "cpu_busy_us": self.busy_us("CPU"),
            "overlap_us": self.overlap_us(),
            "sync_wait_us": self.busy_us("sync"),
            "gpu_gap_us": self.gpu_gap_us(),
            # PoCL keeps at most 128 kernels' binaries loaded: more distinct kernels than that
            # in one inference and every launch reloads one
            "gpu_kernels": float(len(gpu_names)),
            "gpu_kernels_distinct": float(len(set(gpu_names))),
        }

    def to_chrome(self) -> dict:
        """Chrome trace-event JSON (chrome://tracing, Perfetto)."""
        events = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "args": {"name": lane}}
            for i, lane in enumerate(_LANES)
        ]
        for e in self.events:
            event = {
                "name": e.name,
                "ph": "X",
                "pid": 0,
                "tid": _LANES.index(e.lane),
                "ts": e.start_us,
                "dur": max(e.dur_us, 0.001),
            }
            args = {
                k: v
                for k, v in (("split", e.split), ("queued", e.queued_us), ("ready", e.ready_us))
                if v is not None
            }
            if args:
                event["args"] = args
            events.append(event)
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": self.summary()}

    def save_chrome(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_chrome(), indent=1))

    @classmethod
    def load_chrome(cls, path: str | Path) -> Trace:
        """Read a trace written by :meth:`save_chrome` (e.g. to draw it on another machine)."""
        try:
            data = json.loads(Path(path).read_text())
            lanes = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e.get("ph") == "M"}
            events = [
                TraceEvent(
                    lanes[e["tid"]],
                    e["name"],
                    e["ts"],
                    e["ts"] + e["dur"],
                    (e.get("args") or {}).get("split"),
                    (e.get("args") or {}).get("queued"),
                    (e.get("args") or {}).get("ready"),
                )
                for e in data["traceEvents"]
                if e.get("ph") == "X"
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a codl-tvm Chrome trace ({exc})") from None
        return cls(events)

    def lane_counts(self) -> dict[str, int]:
        """Number of events on each lane that has any."""
        counts: dict[str, int] = {}
        for e in self.events:
            counts[e.lane] = counts.get(e.lane, 0) + 1
        return counts

    def save_png(self, path: str | Path, title: str | None = None) -> None:
        """Draw the timeline with matplotlib: one row per lane (GPU kernels, CPU kernels, the
        host's synchronisation waits), each kernel coloured by the split it computes (light
        grey: kernels outside the plan) with a legend of the splits, and the summary under
        ``title``."""
        # deferred: matplotlib is only needed to draw, and costs a second to import
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch

        splits = list(dict.fromkeys(e.split for e in self.events if e.split is not None))
        color = {name: _SPLIT_COLORS[i % len(_SPLIT_COLORS)] for i, name in enumerate(splits)}
        span_ms = max(self.span_us() / 1e3, 1e-3)
        # a kernel of a few microseconds in a span of milliseconds still shows as a hairline
        least_ms = span_ms / 1500
        fig = Figure(figsize=(12, 3.2 if splits else 2.6))
        ax = fig.add_subplot(1, 1, 1)
        for row, lane in enumerate(_LANES):
            events = [e for e in self.events if e.lane == lane]
            if not events:
                continue
            ax.broken_barh(
                [(e.start_us / 1e3, max(e.dur_us / 1e3, least_ms)) for e in events],
                (row - 0.4, 0.8),
                facecolors=[
                    _SYNC_COLOR if lane == "sync" else color.get(e.split, _UNSPLIT_COLOR)
                    for e in events
                ],
            )
        ax.set_yticks(range(len(_LANES)), labels=[_LANE_LABELS[lane] for lane in _LANES])
        ax.set_ylim(len(_LANES) - 0.5, -0.5)  # the GPU lane on top
        ax.set_xlim(0, span_ms * 1.01)
        ax.set_xlabel("time (ms)")
        s = self.summary()
        summary = (
            f"span {s['span_us'] / 1e3:.2f} ms, GPU busy {s['gpu_busy_us'] / 1e3:.2f} ms, "
            f"CPU busy {s['cpu_busy_us'] / 1e3:.2f} ms, overlap {s['overlap_us'] / 1e3:.2f} ms, "
            f"waits {s['sync_wait_us'] / 1e3:.2f} ms"
        )
        # a long title (model, split, device) wraps instead of running off the figure's sides
        head = "\n".join(textwrap.wrap(title, 110)) if title else ""
        ax.set_title(f"{head}\n{summary}" if head else summary, fontsize=10)
        if splits:
            handles = [Patch(color=color[n], label=n) for n in splits]
            handles.append(Patch(color=_UNSPLIT_COLOR, label="outside the plan"))
            ax.legend(
                handles=handles,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.25),
                ncol=min(len(handles), 6),
                fontsize=8,
                frameon=False,
            )
        fig.tight_layout()
        # "tight": the saved picture grows to hold the title and the legend whole
        fig.savefig(str(path), dpi=100, bbox_inches="tight", pad_inches=0.15)


# Split colours: matplotlib's tab10 without its red and grey, which mean waits and unsplit work.
_SPLIT_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
_SYNC_COLOR = "#d62728"
_UNSPLIT_COLOR = "#c7c7c7"
_LANE_LABELS = {"GPU": "GPU kernels", "CPU": "CPU kernels", "sync": "host waits"}


def _merge(intervals):
    out = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _union_length(intervals) -> float:
    return float(sum(hi - lo for lo, hi in _merge(intervals)))


def trace_inference(
    built,
    inputs: Sequence[np.ndarray],
    warmup: int = 1,
    kernel_splits: dict | None = None,
    serial: bool = False,
) -> Trace:
    """Run ``built`` (a :class:`~codl_tvm.build.coexec.CoexecModule` or an artifact) once and return
    its timeline.

    ``serial`` waits for the GPU's queue to drain before and after every call, so each kernel
    runs alone: the same kernels' times without the other processor's contention
    (:func:`codl_tvm.profiling.bound.gap_breakdown`). The span of a serial trace is no latency.

    ``kernel_splits`` (default: ``built.kernel_splits`` where the build recorded it) attributes
    each kernel to its split; when the calls the VM made do not match it, the events carry no
    split (a library built by other code).
    """
    if kernel_splits is None:
        kernel_splits = getattr(built, "kernel_splits", None)
    vm = built.vm
    dev = tvm.opencl(0)
    args = [tvm.runtime.tensor(np.asarray(x, order="C"), dev) for x in inputs]
    for _ in range(warmup):
        vm["main"](*args)
    dev.sync()
    clock = tvm.get_global_func("codl.opencl.host_clock_ns")
    calls: list[tuple[str, int, int]] = []
    pending: list[tuple[str, int]] = []

    def instrument(func, symbol, before_run, ret, *call_args):
        if serial:
            # the queue as far as it can run (dev.sync() would wait behind a pending gate)
            sync.drain()
        now = clock()
        if before_run:
            pending.append((str(symbol), now))
        else:
            name, start = pending.pop()
            calls.append((name, start, now))
        return 0

    vm.set_instrument(instrument)
    try:
        with runtime.record_kernels() as kernels:
            vm["main"](*args)
            dev.sync()
    finally:
        vm.set_instrument(None)
    # ``calls`` is in completion order, which is call order: kernels do not nest.
    split_of_call = _match_splits(calls, kernel_splits)
    gpu_hosts = {k.name for k in kernels}
    launches: dict[str, list[tuple[int, int]]] = {}  # host function -> (start, call index)
    for i, (name, start, _) in enumerate(calls):
        launches.setdefault(name, []).append((start, i))
    launch_starts = {name: [s for s, _ in v] for name, v in launches.items()}
    # Each host function launches the same kernels on every call, in order: the m-th kernel
    # of a host function with n kernels per call belongs to its (m // n)-th call.
    hosts = [_host_function(k.name, launch_starts) for k in kernels]
    per_call = {}
    for h in set(hosts) - {None}:
        n = sum(1 for x in hosts if x == h)
        per_call[h] = max(1, n // len(launches[h])) if n % len(launches[h]) == 0 else None
    # Clock offset: host time of each launch call minus its device "queued" timestamp.
    offsets = []
    seen: dict[str, int] = {}
    kernel_call: list[int | None] = []
    for k, host_name in zip(kernels, hosts):
        call = None
        if host_name is not None:
            m = seen.get(host_name, 0)
            seen[host_name] = m + 1
            if per_call[host_name] is not None:
                start, call = launches[host_name][m // per_call[host_name]]
                offsets.append(start - k.queued_ns)
            elif m < len(launches[host_name]):
                # kernels per call unknown: no split, but still a bound on the clock offset
                offsets.append(launches[host_name][m][0] - k.queued_ns)
        kernel_call.append(call)
    offset = min(offsets) if offsets else 0
    ready_of_call = _ready_ns(calls, kernel_splits)
    events = []
    for k, call in zip(kernels, kernel_call):
        split = split_of_call.get(call) if call is not None else None
        ready = ready_of_call.get(call) if call is not None else None
        events.append(_gpu_event(k, offset, split, ready))
    gpu_host_names = {_host_function(n, launch_starts) for n in gpu_hosts}
    for i, (name, start, end) in enumerate(calls):
        if name in gpu_host_names:
            continue
        if name == "codl.coexec.cpu_wait":
            events.append(TraceEvent("sync", "wait", start / 1e3, end / 1e3))
        elif not (name.startswith("vm.") or name.startswith("codl.")):
            events.append(TraceEvent("CPU", name, start / 1e3, end / 1e3, split_of_call.get(i)))
    if not events:
        return Trace([])
    t0 = min(e.start_us for e in events)
    return Trace(
        sorted(
            (
                TraceEvent(
                    e.lane,
                    e.name,
                    e.start_us - t0,
                    e.end_us - t0,
                    e.split,
                    None if e.queued_us is None else e.queued_us - t0,
                    None if e.ready_us is None else e.ready_us - t0,
                )
                for e in events
            ),
            key=lambda e: e.start_us,
        )
    )


def _gpu_event(k, offset: int, split: str | None, ready_ns: int | None) -> TraceEvent:
    """A recorded GPU kernel on the host clock (``offset``), with its enqueue and ready times."""
    return TraceEvent(
        "GPU",
        k.name,
        (k.start_ns + offset) / 1e3,
        (k.end_ns + offset) / 1e3,
        split,
        (k.queued_ns + offset) / 1e3,
        None if ready_ns is None else ready_ns / 1e3,
    )


def _ready_ns(calls, kernel_splits: dict | None) -> dict[int, int]:
    """Call index of a GPU kernel -> host time its inputs were ready: the end of the last CPU
    kernel call it must follow (``kernel_splits["gpu_inputs"]``, listed by the build's kernel
    call indices, paired with the VM's calls in order as :func:`_match_splits` pairs them).
    Empty when the record is missing or the calls do not match it."""
    if not kernel_splits or not kernel_splits.get("gpu_inputs"):
        return {}
    expected = kernel_splits.get("calls") or []
    vm_call: dict[int, int] = {}  # build's call index -> VM call index
    j = 0
    for i, (name, _, _) in enumerate(calls):
        if j < len(expected) and name == expected[j][0]:
            vm_call[j] = i
            j += 1
    if j != len(expected):
        return {}
    out = {}
    for gpu, cpus in kernel_splits["gpu_inputs"].items():
        ends = [calls[vm_call[c]][2] for c in cpus if c in vm_call]
        if ends and int(gpu) in vm_call:
            out[vm_call[int(gpu)]] = max(ends)
    return out


def _match_splits(calls, kernel_splits: dict | None) -> dict[int, str]:
    """Call index -> split, pairing the VM's kernel calls with the build's list in order;
    empty unless every listed kernel call was seen, in that order."""
    if not kernel_splits:
        return {}
    expected = kernel_splits.get("calls") or []
    out: dict[int, str] = {}
    j = 0
    for i, (name, _, _) in enumerate(calls):
        if j < len(expected) and name == expected[j][0]:
            if expected[j][1] is not None:
                out[i] = expected[j][1]
            j += 1
    return out if j == len(expected) else {}


def _host_function(kernel_name: str, hosts) -> str | None:
    """The host function that launches an OpenCL kernel (TVM names kernels ``<func>_kernel*``)."""
    base = kernel_name
    idx = base.rfind("_kernel")
    if idx >= 0:
        base = base[:idx]
    return base if base in hosts else None
