"""How one compiled part is timed: the protocol (:class:`TimingConfig`), the samples
(:func:`time_samples`) and the record they make (:func:`measure_op`).

Latency is the median of ``time_evaluator`` samples after a warm-up run (on OpenCL through the
runtime plugin's marker-event timer); each sample runs the part enough times to last
``TimingConfig.min_repeat_ms`` (:func:`runs_per_sample`), and the record keeps the fastest and
slowest sample beside the median (:func:`codl_tvm.runtime.threads.pin_tvm_threads` pins TVM's
CPU thread pool for measurements on an emulated SoC). Only TVM's runtime is needed: this runs on
boards and phones.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.dataset import OpRecord
from codl_tvm.profiling.part_build import CompiledPart
from codl_tvm.profiling.sessions import Session

__all__ = [
    "LEGACY_TIMING",
    "MAX_RUNS_PER_SAMPLE",
    "PartTiming",
    "TimingConfig",
    "measure_op",
    "runs_per_sample",
    "time_samples",
]


@dataclass(frozen=True)
class TimingConfig:
    """How latencies are measured: ``warmup`` untimed runs, then ``repeats`` timed samples, each
    the mean of ``number`` runs or more: with ``min_repeat_ms`` > 0, a probe run picks enough runs
    that a sample lasts at least that long (TVM's ``time_evaluator`` knob of that name; the
    record keeps the count in ``number``). The record keeps the median sample and the fastest
    and slowest one.

    The defaults come from ``scripts/noise_analysis.py`` (see docs/benchmarks.md): identical
    parts measured twice disagree by > 1.5x in 6-9% of the pairs on the emulated SoC (a whole
    record's samples disturbed), which a median of 10 samples withstands better than one of
    3-5, and a sample of a sub-0.1 ms part (a third of the SoC records) is a few runs of
    microseconds unless it is made to last ``min_repeat_ms``. At 2 ms that costs about what
    ``--repeats 5 --number 3`` did per part on the SoC's records (more only for parts under
    0.13 ms, at most 10 x 2 ms). On the emulated SoC and the H100 of a 16-core Xeon host
    (``scripts/device/noise_ab.sh``, on two such hosts), two profiling runs of the same 71
    parts agree within +-10% for 39-49% (CPU) and 53-63% (GPU) of them with these defaults,
    51% and 21% with the old ones, 26% and 33% with 20 ms samples: the host's
    run-to-run noise dominates either way.

    ``flush_weights``: CPU parts are timed one run per sample, the weight (every input but the
    data) flushed from the caches before each (TVM's ``cache_flush_cpu_non_first_arg``), as it
    arrives inside a whole model, where every operator's weight was evicted by the others;
    ``min_repeat_ms`` does not apply to them (``repeats * number`` samples of one run)."""

    warmup: int = 1
    repeats: int = 10
    number: int = 1
    flush_weights: bool = False
    min_repeat_ms: float = 2.0

    def __post_init__(self) -> None:
        for name in ("repeats", "number"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TimingConfig.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"TimingConfig.warmup must be an integer >= 0, got {self.warmup!r}")
        m = self.min_repeat_ms
        if isinstance(m, bool) or not isinstance(m, int | float) or not 0 <= m < math.inf:
            raise ValueError(f"TimingConfig.min_repeat_ms must be a number >= 0, got {m!r}")

    def to_meta(self) -> dict:
        """The protocol as a dataset header records it (``meta["timing"]``; a resumed run must
        use the same)."""
        return {
            "warmup": self.warmup,
            "repeats": self.repeats,
            "number": self.number,
            "min_repeat_ms": float(self.min_repeat_ms),
        }


#: The protocol of datasets written before their header recorded one (the defaults then).
LEGACY_TIMING: dict = {"warmup": 1, "repeats": 5, "number": 3, "min_repeat_ms": 0.0}

#: Most runs a sample may take (a part timed at ~0 by a coarse timer would otherwise loop).
MAX_RUNS_PER_SAMPLE = 10_000


def runs_per_sample(probe_ms: float, timing: TimingConfig) -> int:
    """Runs per sample so that one lasts ``timing.min_repeat_ms``, from a probe run's time per
    run ``probe_ms``: at least ``timing.number``, at most ``MAX_RUNS_PER_SAMPLE``.

    Parameters
    ----------
    probe_ms : float
        Time of one run of the part (ms), measured just before.
    timing : TimingConfig
        The protocol (``min_repeat_ms`` 0: always ``number``).

    Returns
    -------
    int
        The runs each timed sample averages.
    """
    if timing.min_repeat_ms <= 0 or not math.isfinite(probe_ms):  # NaN/inf: nothing to size
        return timing.number
    if probe_ms <= 0:  # below the timer's resolution
        return max(timing.number, MAX_RUNS_PER_SAMPLE)
    need = math.ceil(timing.min_repeat_ms / probe_ms)
    return max(timing.number, min(need, MAX_RUNS_PER_SAMPLE))


@dataclass(frozen=True)
class PartTiming:
    """What :func:`time_samples` measured: the median, fastest and slowest sample (ms per run),
    the number of samples and the runs each sample averages."""

    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    number: int


def time_samples(
    session: Session,
    compiled: CompiledPart,
    directory: str | Path,
    timing: TimingConfig = TimingConfig(),
) -> PartTiming:
    """Time ``compiled`` on its processor with ``timing`` (see :class:`TimingConfig`)."""
    dev = session.device(compiled.processor)
    lib = session.load_module(Path(directory) / compiled.library)
    vm = VirtualMachine(lib, dev)
    # Latency does not depend on the values; tiling a short ramp costs a memcpy, where random
    # normals for a sampled operator's GB-sized weights dominated the whole profiling run.
    ramp = np.linspace(-1.0, 1.0, 4099, dtype=np.float32)
    args = [tvm.runtime.tensor(np.resize(ramp, s), dev) for s in compiled.inputs]
    for _ in range(timing.warmup):
        vm["main"](*args)
    dev.sync()
    number = timing.number
    if timing.flush_weights and compiled.processor == "cpu":
        number = 1
        res = vm.time_evaluator(
            "main",
            dev,
            number=1,
            repeat=timing.repeats * timing.number,
            f_preproc="cache_flush_cpu_non_first_arg",
        )(*args)
    else:
        if timing.min_repeat_ms > 0:
            # One sample of `number` runs sizes the others (and warms up once more); through
            # RPC the same call runs on the remote, so the count is the remote's.
            probe = vm.time_evaluator("main", dev, number=timing.number, repeat=1)(*args)
            number = runs_per_sample(float(probe.results[0]) * 1e3, timing)
        res = vm.time_evaluator("main", dev, number=number, repeat=timing.repeats)(*args)
    samples = [float(r) * 1e3 for r in res.results]
    median = float(statistics.median(samples))
    if not median > 0 or not min(samples) > 0:
        raise ProfileError(
            f"{compiled.params.describe()}: {compiled.processor} part measured {median} ms "
            f"(fastest sample {min(samples)} ms; timer resolution too coarse?)"
        )
    return PartTiming(median, min(samples), max(samples), len(samples), number)


def measure_op(
    session: Session,
    compiled: CompiledPart,
    directory: str | Path,
    device: dict,
    timing: TimingConfig = TimingConfig(),
) -> OpRecord:
    """Time one compiled part and return its record (with its samples' spread)."""
    t = time_samples(session, compiled, directory, timing)
    return OpRecord(
        compiled.params,
        compiled.partition,
        compiled.processor,
        compiled.impl,
        t.median_ms,
        t.samples,
        compiled.part,
        compiled.dispatch,
        device,
        compiled.name,
        t.number,
        t.min_ms,
        t.max_ms,
    )
