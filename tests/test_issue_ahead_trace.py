"""The host-issue term of ``gap_breakdown`` on a synthetic timeline: GPU idle while the next
kernel's inputs were ready but the host had not enqueued it."""

from __future__ import annotations

import pytest

from codl_tvm.profiling.bound import gap_breakdown
from codl_tvm.profiling.trace import Trace, TraceEvent


def _trace() -> Trace:
    gpu = [
        TraceEvent("GPU", "k1", 0, 100, queued_us=0),
        # independent of the CPU: ready when k1 ended, enqueued only at 250 (the host ran c1)
        TraceEvent("GPU", "k2", 300, 400, queued_us=250),
        # reads c1 (ended at 900): 500 us of waiting for the CPU, then 90 us for the host
        TraceEvent("GPU", "k3", 1000, 1100, queued_us=990, ready_us=900),
        # enqueued early behind a gate (queued 500), released when c2's part is ready at 1150
        TraceEvent("GPU", "k4", 1200, 1300, queued_us=500, ready_us=1150),
    ]
    cpu = [TraceEvent("CPU", "c1", 0, 900), TraceEvent("CPU", "c2", 950, 1300)]
    return Trace(sorted(gpu + cpu, key=lambda e: e.start_us))


def test_host_issue_is_idle_with_inputs_ready_and_nothing_enqueued():
    b = gap_breakdown(_trace(), bound_ms=1.0)
    # k2: 250 - 100; k3: 990 - 900; k4: enqueued long before its inputs were ready: none
    assert b.gpu.host_issue_ms == pytest.approx((150 + 90) / 1e3)
    # what is left of the gaps: 50 us before k2 (host), 510 us before k3 and 100 us before
    # k4 (waiting for the CPU's data)
    assert b.gpu.host_gap_ms == pytest.approx(0.05)
    assert b.gpu.dependency_idle_ms == pytest.approx(0.61)
    assert b.gpu.busy_ms + b.gpu.idle_ms == pytest.approx(b.span_ms)
    assert b.cpu.host_issue_ms == 0.0  # CPU kernels have no enqueue time
    assert b.terms["host_issue"] == pytest.approx(0.5 * 0.24)
    assert sum(v for v in b.terms.values() if v is not None) == pytest.approx(b.gap_ms)
    assert b.to_dict()["terms_ms"]["host_issue"] == pytest.approx(0.12)


def test_without_enqueue_times_nothing_is_host_issue():
    plain = Trace([TraceEvent(e.lane, e.name, e.start_us, e.end_us) for e in _trace().events])
    b = gap_breakdown(plain, bound_ms=1.0)
    assert b.gpu.host_issue_ms == 0.0
    assert b.gpu.host_gap_ms + b.gpu.dependency_idle_ms == pytest.approx(0.9)


def test_issuing_ahead_moves_the_idle_out_of_host_issue():
    """The same kernels with k2 and k3 enqueued at the start (issued ahead, k3 behind a gate):
    the same idle, now none of it the host's fault."""
    ahead = Trace(
        [
            TraceEvent(e.lane, e.name, e.start_us, e.end_us, queued_us=0, ready_us=e.ready_us)
            if e.lane == "GPU"
            else e
            for e in _trace().events
        ]
    )
    before, after = gap_breakdown(_trace(), 1.0), gap_breakdown(ahead, 1.0)
    assert after.gpu.host_issue_ms == 0.0 < before.gpu.host_issue_ms
    assert after.gpu.idle_ms == pytest.approx(before.gpu.idle_ms)


def test_enqueue_and_ready_times_survive_a_chrome_file(tmp_path):
    _trace().save_chrome(tmp_path / "t.json")
    again = Trace.load_chrome(tmp_path / "t.json")
    assert [(e.queued_us, e.ready_us) for e in again.events] == [
        (e.queued_us, e.ready_us) for e in _trace().events
    ]
    assert gap_breakdown(again, 1.0) == gap_breakdown(_trace(), 1.0)
