"""The ideal bounds (T*, T*c) and the gap breakdown of a co-executed timeline, on synthetic
traces whose every term is known by construction."""

from __future__ import annotations

import itertools
import math

import pytest

from codl_tvm.profiling.bound import gap_breakdown, ideal_bound_ms
from codl_tvm.profiling.trace import Trace, TraceEvent


def test_ideal_bound_is_the_harmonic_combination():
    assert ideal_bound_ms(10.0, 10.0) == pytest.approx(5.0)
    assert ideal_bound_ms(6.0, 3.0) == pytest.approx(2.0)
    # a processor 100x slower barely helps
    assert ideal_bound_ms(1.0, 100.0) == pytest.approx(100.0 / 101.0)
    # contention can only raise the bound
    assert ideal_bound_ms(12.0, 4.0) > ideal_bound_ms(10.0, 3.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_ideal_bound_rejects_non_positive_latencies(bad):
    with pytest.raises(ValueError, match="must be positive"):
        ideal_bound_ms(bad, 1.0)
    with pytest.raises(ValueError, match="GPU latency"):
        ideal_bound_ms(1.0, bad)


def _ev(lane, name, start, end):
    return TraceEvent(lane, name, float(start), float(end))


# A hand-made timeline in microseconds:
#   GPU: g0 [0, 400)  g1 [600, 1000)                       (tail: idle 1000..1200)
#   CPU: c0 [10, 300) gap 20 (host) c1 [320, 500) wait [500, 600) c2 [600, 1200)
#   head: CPU starts at 10 (GPU at 0)
TRACE = Trace(
    [
        _ev("GPU", "g0", 0, 400),
        _ev("CPU", "c0", 10, 300),
        _ev("CPU", "c1", 320, 500),
        _ev("sync", "wait", 500, 600),
        _ev("GPU", "g1", 600, 1000),
        _ev("CPU", "c2", 600, 1200),
    ]
)
# The same kernels, each run alone (10% faster than in the co-executed run, c2 25% faster).
ALONE = Trace(
    [
        _ev("GPU", "g0", 0, 360),
        _ev("GPU", "g1", 400, 760),
        _ev("CPU", "c0", 800, 1061),
        _ev("CPU", "c1", 1100, 1262),
        _ev("CPU", "c2", 1300, 1780),
    ]
)


def test_breakdown_terms_by_construction():
    b = gap_breakdown(TRACE, bound_ms=0.8, alone=ALONE)
    assert b.span_ms == pytest.approx(1.2)
    assert b.gap_ms == pytest.approx(0.4)
    # CPU: busy 290 + 180 + 600, one host gap of 20 us, a 100 us wait, head 10, no tail
    assert b.cpu.busy_ms == pytest.approx(1.07)
    assert b.cpu.host_gap_ms == pytest.approx(0.02)
    assert b.cpu.sync_wait_ms == pytest.approx(0.1)
    assert b.cpu.dependency_idle_ms == pytest.approx(0.0)
    assert b.cpu.head_ms == pytest.approx(0.01)
    assert b.cpu.tail_ms == pytest.approx(0.0)
    assert b.cpu.alone_ms == pytest.approx(0.261 + 0.162 + 0.48)
    # GPU: busy 800, 200 us waiting for the CPU's rows (no wait event on its lane), tail 200
    assert b.gpu.busy_ms == pytest.approx(0.8)
    assert b.gpu.dependency_idle_ms == pytest.approx(0.2)
    assert b.gpu.sync_wait_ms == 0.0
    assert b.gpu.tail_ms == pytest.approx(0.2)
    assert b.gpu.contention_ms == pytest.approx(0.08)
    terms = b.terms
    assert terms["sync_waits"] == pytest.approx(0.05)
    assert terms["dependency_idle"] == pytest.approx(0.1)
    assert terms["imbalance_tail"] == pytest.approx(0.1)
    assert terms["contention"] == pytest.approx(0.5 * ((1.07 - 0.903) + 0.08))
    assert terms["work"] == pytest.approx(0.5 * (0.903 + 0.72) - 0.8)
    # the exact identity: the terms add up to the gap
    assert sum(terms.values()) == pytest.approx(b.gap_ms)
    d = b.to_dict()
    assert d["of_bound"] == pytest.approx(0.8 / 1.2)
    assert set(d["terms_ms"]) == set(terms)


def test_breakdown_without_alone_keeps_kernel_time_together():
    b = gap_breakdown(TRACE, bound_ms=0.8)
    terms = b.terms
    assert terms["contention"] is None and terms["work"] is None
    assert terms["kernels_alone"] == pytest.approx(0.5 * (1.07 + 0.8) - 0.8)
    assert sum(v for v in terms.values() if v is not None) == pytest.approx(b.gap_ms)


def test_perfectly_balanced_timeline_has_only_work():
    trace = Trace([_ev("GPU", "g", 0, 500), _ev("CPU", "c", 0, 500)])
    b = gap_breakdown(trace, bound_ms=0.5, alone=trace)
    assert b.gap_ms == pytest.approx(0.0)
    assert all(v == pytest.approx(0.0) for v in b.terms.values())


def test_long_idle_is_dependency_not_host():
    trace = Trace([_ev("GPU", "g", 0, 100), _ev("CPU", "a", 0, 10), _ev("CPU", "b", 90, 100)])
    b = gap_breakdown(trace, bound_ms=0.05, host_gap_us=50)
    assert b.cpu.dependency_idle_ms == pytest.approx(0.08)
    assert b.cpu.host_gap_ms == 0.0
    b = gap_breakdown(trace, bound_ms=0.05, host_gap_us=100)
    assert b.cpu.host_gap_ms == pytest.approx(0.08)


def test_breakdown_rejects_mismatched_or_empty_traces():
    with pytest.raises(ValueError, match="not the same build"):
        gap_breakdown(TRACE, 0.8, alone=Trace([_ev("GPU", "g0", 0, 1)]))
    with pytest.raises(ValueError, match="no CPU kernel"):
        gap_breakdown(Trace([_ev("GPU", "g", 0, 1)]), 0.8)
    with pytest.raises(ValueError, match="no kernel"):
        gap_breakdown(Trace([]), 0.8)
    with pytest.raises(ValueError, match="bound must be positive"):
        gap_breakdown(TRACE, 0.0)


@pytest.mark.opencl
def test_serial_trace_runs_every_kernel_alone(opencl):
    """A real co-executed build: the serial trace has the same kernels, none overlapping the
    other processor's, and the breakdown of the normal trace adds up against it."""
    from pathlib import Path

    import codl_tvm
    from codl_tvm.core.plan import uniform_plan
    from codl_tvm.frontend.importer import load_onnx, random_inputs
    from codl_tvm.profiling.trace import trace_inference

    model = load_onnx(Path(codl_tvm.__file__).parent / "data" / "codl_small_cnn.onnx")
    built = codl_tvm.compile(model.mod, uniform_plan(model.mod, "H", 0.5))
    x = [random_inputs(model)["input"]]
    trace = trace_inference(built, x)
    alone = trace_inference(built, x, serial=True)
    kernels = sorted((e.lane, e.name) for e in trace.events if e.lane in ("CPU", "GPU"))
    assert kernels == sorted((e.lane, e.name) for e in alone.events if e.lane in ("CPU", "GPU"))
    assert {"CPU", "GPU"} <= {lane for lane, _ in kernels}
    # no overlap but the GPU clock's alignment to the host's (estimated from launch times, off
    # by tens of microseconds on a loaded machine)
    assert alone.overlap_us() <= max(1.0, 0.05 * alone.span_us())
    # serial: every event (kernels of both lanes, waits) ends before the next one starts
    events = sorted(alone.events, key=lambda e: e.start_us)
    assert all(b.start_us >= a.end_us - 1.0 for a, b in itertools.pairwise(events))
    b = gap_breakdown(trace, bound_ms=0.5 * trace.span_us() / 1e3, alone=alone)
    assert sum(b.terms.values()) == pytest.approx(b.gap_ms)
    assert b.cpu.alone_ms > 0 and b.gpu.alone_ms > 0


def test_sync_latency_is_the_part_of_each_wait_after_the_gpu_ended():
    # wait 1 [500, 600): the GPU's last kernel before it ends at 400, so all 100 us are the
    # wait's own latency; wait 2 [1100, 1300): g1 runs to 1250, then 50 us of latency
    trace = Trace(
        [
            _ev("GPU", "g0", 0, 400),
            _ev("CPU", "c0", 0, 500),
            _ev("sync", "wait", 500, 600),
            _ev("CPU", "c1", 600, 1100),
            _ev("GPU", "g1", 700, 1250),
            _ev("sync", "wait", 1100, 1300),
            _ev("CPU", "c2", 1300, 1400),
        ]
    )
    b = gap_breakdown(trace, bound_ms=1.0)
    assert b.cpu.sync_wait_ms == pytest.approx(0.3)
    assert b.cpu.sync_latency_ms == pytest.approx(0.15)
    assert b.gpu.sync_latency_ms == 0.0
    # informational: not an idle term, the identity still holds
    assert sum(v for v in b.terms.values() if v is not None) == pytest.approx(b.gap_ms)
    assert b.to_dict()["cpu"]["sync_latency_ms"] == pytest.approx(0.15)
