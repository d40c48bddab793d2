"""Timing statistics of benchmarks: host-time samples (:func:`time_host_us`), variants paired
round by round against each processor alone and T* (:func:`paired_ratios`), two builds paired
with a sign test (:func:`paired_ab`), and each processor's latency while the other runs
(:func:`concurrent_bound`, the measured bound ``profiling.bound`` compares plans with).

Pure Python and numpy: the functions time callables they are given.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "AB_TIE",
    "ConcurrentBound",
    "Interval",
    "PairedAB",
    "PairedRatios",
    "concurrent_bound",
    "overlapped",
    "paired_ab",
    "paired_ratios",
    "time_host_us",
]

#: A run's ``(start, end)`` in seconds (``time.perf_counter``).
Interval = tuple[float, float]


def time_host_us(fn: Callable[[], object], repeat: int = 200, warmup: int = 20) -> dict:
    """Median/min/p90 host time of ``fn`` in microseconds (perf_counter_ns)."""
    for _ in range(warmup):
        fn()
    samples = np.empty(repeat)
    for i in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples[i] = (time.perf_counter_ns() - t0) / 1e3
    return {
        "median_us": float(np.median(samples)),
        "min_us": float(samples.min()),
        "p90_us": float(np.percentile(samples, 90)),
        "repeat": repeat,
    }


@dataclass
class PairedRatios:
    """A variant against the best single processor and T*, round by round.

    Each ratio compares samples of the same round-robin round, so drift that slows every variant
    of a round (other load, clocks) cancels; medians over separate rounds do not cancel it.
    """

    speedup_vs_best_single: list[float]
    of_t_star: list[float]

    @property
    def median_speedup(self) -> float:
        return float(np.median(self.speedup_vs_best_single))

    @property
    def median_of_t_star(self) -> float:
        return float(np.median(self.of_t_star))

    @property
    def rounds_slower(self) -> int:
        """Rounds in which the variant was slower than that round's faster processor alone."""
        return sum(1 for r in self.speedup_vs_best_single if r < 1.0)


def paired_ratios(
    variant_ms: Sequence[float], cpu_ms: Sequence[float], gpu_ms: Sequence[float]
) -> PairedRatios:
    """Per-round ratios of ``variant_ms`` against ``min(cpu, gpu)`` and against
    T* = cpu * gpu / (cpu + gpu) of the same round (the three lists are one sample per round,
    in round order).

    Raises ValueError if the lists differ in length, are empty or hold a non-positive time.
    """
    n = len(variant_ms)
    if n == 0 or len(cpu_ms) != n or len(gpu_ms) != n:
        raise ValueError(
            f"paired_ratios needs one sample per round of each: got {n} variant, "
            f"{len(cpu_ms)} CPU and {len(gpu_ms)} GPU samples"
        )
    if min(*variant_ms, *cpu_ms, *gpu_ms) <= 0:
        raise ValueError("paired_ratios: latencies must be positive")
    speedup, of_t_star = [], []
    for v, c, g in zip(variant_ms, cpu_ms, gpu_ms):
        speedup.append(min(c, g) / v)
        of_t_star.append(c * g / (c + g) / v)
    return PairedRatios(speedup, of_t_star)


#: A/B within this fraction of 1 (either way: the band is symmetric in log) is a tie in
#: :class:`PairedAB`'s sign test.
AB_TIE = 0.005
_TIE_LOG = math.log1p(AB_TIE)


@dataclass
class PairedAB:
    """Build A against build B of the same model, round by round, pooled over runs.

    ``ratios`` are A's latency over B's in the same round (above 1: A slower). The sign test
    asks how likely as many or more lopsided rounds would be if neither build were faster
    (ties, ratios within 0.5% of 1, are dropped as the test requires).
    """

    ratios: list[float]

    @property
    def median(self) -> float:
        """Median A/B ratio over the pooled rounds."""
        return float(np.median(self.ratios))

    @property
    def rounds_a_slower(self) -> int:
        """Rounds in which A was slower than B by more than the tie band."""
        return sum(1 for r in self.ratios if math.log(r) > _TIE_LOG)

    @property
    def rounds_a_faster(self) -> int:
        """Rounds in which A was faster than B by more than the tie band."""
        return sum(1 for r in self.ratios if math.log(r) < -_TIE_LOG)

    @property
    def sign_test_p(self) -> float:
        """Two-sided exact sign test over the rounds that are not ties."""
        k, n = self.rounds_a_slower, self.rounds_a_slower + self.rounds_a_faster
        if n == 0:
            return 1.0
        # integer numerator and denominator: exact, no float overflow for long runs
        tail = sum(math.comb(n, i) for i in range(max(k, n - k), n + 1)) / 2**n
        return min(1.0, 2.0 * tail)

    def to_json(self) -> dict:
        """The summary and every round's ratio, for a result JSON."""
        return {
            "median_ratio": round(self.median, 4),
            "rounds": len(self.ratios),
            "rounds_a_slower": self.rounds_a_slower,
            "rounds_a_faster": self.rounds_a_faster,
            "sign_test_p": float(f"{self.sign_test_p:.3g}"),
            "ratios": [round(r, 4) for r in self.ratios],
        }


def paired_ab(runs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> PairedAB:
    """Pool per-round latency ratios A/B over runs.

    Parameters
    ----------
    runs
        Per run, A's and B's latencies: one sample per round-robin round, in round order.

    Returns
    -------
    PairedAB
        Every round's A/B ratio, run after run.

    Raises
    ------
    ValueError
        If a run's lists differ in length or hold a latency that is not a positive finite
        number, or if there is no round at all.
    """
    ratios: list[float] = []
    for i, (a, b) in enumerate(runs):
        if len(a) != len(b):
            raise ValueError(
                f"paired_ab: run {i} has {len(a)} samples of A and {len(b)} of B; "
                "pair samples of the same rounds"
            )
        bad = [x for x in (*a, *b) if not (math.isfinite(x) and x > 0)]
        if bad:
            raise ValueError(f"paired_ab: run {i} has a latency that is not positive: {bad[0]}")
        ratios.extend(x / y for x, y in zip(a, b))
    if not ratios:
        raise ValueError("paired_ab: no rounds to compare")
    return PairedAB(ratios)


def overlapped(a: Sequence[Interval], b: Sequence[Interval]) -> tuple[list[float], list[float]]:
    """Durations of the runs of ``a`` and of ``b`` (``(start, end)`` intervals, seconds) that lie
    wholly inside the window where both loops were running: from the later first start to the
    earlier last end. Runs outside it had the machine (partly) to themselves."""
    if not a or not b:
        return [], []
    lo = max(a[0][0], b[0][0])
    hi = min(a[-1][1], b[-1][1])

    def inside(runs: Sequence[Interval]) -> list[float]:
        return [end - start for start, end in runs if start >= lo and end <= hi]

    return inside(a), inside(b)


@dataclass
class ConcurrentBound:
    """Each processor's latency while the other runs its own whole-model inferences.

    ``t_star_ms`` = 1 / (1/cpu_ms + 1/gpu_ms) is the ideal bound T* under the contention of a
    real co-execution (shared memory bandwidth, caches, the host thread): what two independent
    inferences, one per processor, reach together. A split of one inference also pays for
    sharing and synchronisation, so it rarely beats this bound.
    """

    cpu_ms: float
    gpu_ms: float
    cpu_runs: int
    gpu_runs: int
    seconds: float

    @property
    def t_star_ms(self) -> float:
        return 1.0 / (1.0 / self.cpu_ms + 1.0 / self.gpu_ms)


def concurrent_bound(
    run_cpu: Callable[[], object],
    run_gpu: Callable[[], object],
    seconds: float = 2.0,
    min_runs: int = 3,
    max_seconds: float = 60.0,
) -> ConcurrentBound:
    """Loop ``run_gpu`` in a thread and ``run_cpu`` in this one (each call must return only
    when its inference has finished, device synchronised) until ``seconds`` have passed and each
    has ``min_runs`` runs inside the overlap window (:func:`overlapped`); median latencies.

    ``run_cpu`` stays on the calling thread because TVM's CPU thread pool belongs to the thread
    that configured it (``pin_tvm_threads``); the GPU loop only enqueues and waits. Raises
    RuntimeError if either loop fails or the window never fills within ``max_seconds``.
    """
    cpu_runs: list[Interval] = []
    gpu_runs: list[Interval] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def gpu_loop() -> None:
        try:
            while not stop.is_set():
                t0 = time.perf_counter()
                run_gpu()
                gpu_runs.append((t0, time.perf_counter()))
        except BaseException as exc:  # reported on the calling thread
            failure.append(exc)
            stop.set()

    worker = threading.Thread(target=gpu_loop, name="codl-gpu-loop", daemon=True)
    begin = time.perf_counter()
    worker.start()
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            run_cpu()
            cpu_runs.append((t0, time.perf_counter()))
            elapsed = cpu_runs[-1][1] - begin
            in_cpu, in_gpu = overlapped(cpu_runs, list(gpu_runs))
            if elapsed >= seconds and min(len(in_cpu), len(in_gpu)) >= min_runs:
                break
            if elapsed >= max_seconds:
                raise RuntimeError(
                    f"concurrent runs: {len(in_cpu)} CPU and {len(in_gpu)} GPU runs overlapped "
                    f"in {elapsed:.0f} s; {min_runs} each needed"
                )
    finally:
        stop.set()
        worker.join()
    if failure:
        raise RuntimeError(f"the GPU loop failed: {failure[0]!r}") from failure[0]
    in_cpu, in_gpu = overlapped(cpu_runs, gpu_runs)
    return ConcurrentBound(
        cpu_ms=float(np.median(in_cpu)) * 1e3,
        gpu_ms=float(np.median(in_gpu)) * 1e3,
        cpu_runs=len(in_cpu),
        gpu_runs=len(in_gpu),
        seconds=round(time.perf_counter() - begin, 2),
    )
