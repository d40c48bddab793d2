"""Builds of one compile in spawned worker processes, beside the compile's own work.

A compile that measures builds its co-executed plan and each processor alone
(:meth:`codl_tvm.build.cache.Libraries.single`). The builds for one processor do not depend on
the plan, so they can start as soon as the compile knows it will measure and run while it plans
and builds the co-executed library. :class:`BackgroundBuilds` starts them in worker processes
and hands each finished library to :class:`~codl_tvm.build.cache.Libraries` when asked.

A worker rebuilds from what it is given: the model file (checked against the spec's SHA-256),
the target preset and a :class:`~codl_tvm.build.cache.BuildSpec` per library. The build function
(``Libraries``' module-level builder, passed by reference) reads every schedule setting from
the spec, so a worker builds what an in-process build of the same spec would.

Where the compile times the libraries on this machine and its OpenCL platform compiles
kernels serially (PoCL), a worker also runs each OpenCL library once in parallel processes
after building it (:func:`~codl_tvm.runtime.warm_up.warm_up`, a job's ``warm`` devices), so its
kernels are compiled into the on-disk caches while the compile plans, not at its first timed run.

Workers are spawned, never forked: TVM's state is not fork-safe. They ignore SIGINT (the
compile decides what a Ctrl-C stops) and end with the compile: :meth:`BackgroundBuilds.close`
terminates those still running, and on Linux a worker also dies with its parent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from codl_tvm.build.targets import TargetPreset
from codl_tvm.core.interrupts import die_with_parent
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.runtime.artifact import file_sha256
from codl_tvm.runtime.warm_up import WarmUpProcesses, warm_up

__all__ = ["BackgroundBuilds", "BuildJob", "BuildResult", "default_workers", "vm_devices"]

logger = logging.getLogger(__name__)

#: Seconds a terminated worker gets to exit before it is killed.
_TERMINATE_WAIT_S = 5.0


def default_workers(jobs: int) -> int:
    """Workers for ``jobs`` builds beside a compile: one core stays with the compile's own
    planning and build, so a 2-core machine gets one worker (which builds its jobs one after
    the other) and a 1-core machine none (every build runs in the compile's process)."""
    return max(0, min(jobs, (os.cpu_count() or 1) - 1))


def vm_devices(spec) -> tuple[str, ...]:
    """The VM's devices of the library ``spec`` (a :class:`~codl_tvm.build.cache.BuildSpec`)
    describes, one per slot, as its timing gives them: an image build's texture scopes take
    slots of their own (the co-executed one's after the CPU's)."""
    from codl_tvm.build.texture import VM_DEVICE_SLOTS  # deferred: TVM's compiler
    from codl_tvm.build.texture_coexec import VM_DEVICES

    if spec.device == "cpu":
        return ("cpu",)
    if spec.device == "opencl":
        return ("opencl",) * (VM_DEVICE_SLOTS if spec.gpu_data_type == "image" else 1)
    return tuple(VM_DEVICES)


@dataclass(frozen=True)
class BuildJob:
    """One library to build: its name in the compile, its spec, where it goes and, to warm
    it up after the build (:func:`~codl_tvm.runtime.warm_up.warm_up`), its VM's devices
    (empty: no warm-up)."""

    name: str
    spec: Any  # a codl_tvm.build.cache.BuildSpec (not imported: cache imports this module)
    path: Path
    warm: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildResult:
    """A finished background build.

    Attributes
    ----------
    name
        The library's name in the compile.
    seconds
        The worker's time for the build and its export (0.0 where the worker died).
    splits, weights
        What the build function returned beside the library (a co-executed build's kernel
        splits, a weights-beside build's weights record), or None.
    error
        The build's error message (None: the library is at its job's path).
    warm_s
        Seconds of its warm-up after the build (None: not warmed up).
    setup_s
        Seconds from its worker's spawn to the model imported there (Python, codl-tvm and
        TVM starting, the model's import), before the worker's first build began.
    """

    name: str
    seconds: float
    splits: dict | None = None
    weights: dict | None = None
    error: str | None = None
    warm_s: float | None = None
    setup_s: float | None = None

    def phases(self) -> dict[str, float]:
        """``setup_s`` and ``warm_s`` where known, in seconds to the millisecond."""
        pairs = (("setup_s", self.setup_s), ("warm_s", self.warm_s))
        return {key: round(value, 3) for key, value in pairs if value is not None}


# build(path, spec, mod, preset) -> (splits, weights record): exports the library to path
Builder = Callable[[Path, Any, Any, TargetPreset], tuple]


class BackgroundBuilds:
    """Build ``jobs`` in ``workers`` spawned processes (the jobs dealt round-robin; each worker
    builds its share one after the other) while the caller goes on.

    Parameters
    ----------
    model_path
        The ONNX model file every job builds.
    model_sha256
        Its SHA-256 as the compile read it: a worker refuses a file changed since.
    preset
        The target preset.
    jobs
        The libraries to build.
    build
        A module-level function (pickled by reference) that builds one job:
        ``build(path, spec, mod, preset) -> (splits, weights)``.
    workers
        How many processes (at least 1; at most ``len(jobs)`` are started).
    """

    def __init__(
        self,
        model_path: Path,
        model_sha256: str,
        preset: TargetPreset,
        jobs: Sequence[BuildJob],
        build: Builder,
        workers: int,
    ) -> None:
        self.jobs = {job.name: job for job in jobs}
        self._results: dict[str, BuildResult] = {}
        self._owner: dict[str, int] = {}
        self._procs: list[tuple[multiprocessing.Process, Connection]] = []
        self._started: set[int] = set()
        self._ended: set[int] = set()
        self._spawned: dict[int, float] = {}  # worker -> perf_counter at its spawn
        self._setup_s: dict[int, float] = {}
        # the readers (one thread a worker) fill the results; result() waits on this
        self._changed = threading.Condition()
        level = logging.getLogger("codl_tvm").getEffectiveLevel()
        ctx = multiprocessing.get_context("spawn")
        count = max(1, min(workers, len(jobs)))
        logger.debug("starting build workers from a thread allowed %s cores", _allowed_cores())
        shares = [list(jobs[i::count]) for i in range(count)]
        for index, share in enumerate(shares):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_work,
                args=(writer, str(model_path), model_sha256, preset, share, build, level),
                name=f"codl-build-{'+'.join(j.name for j in share)}",
                daemon=True,  # never outlives the compile's interpreter
            )
            self._spawned[index] = time.perf_counter()
            proc.start()
            writer.close()  # the worker holds the only writer: its exit ends our reads
            self._procs.append((proc, reader))
            for job in share:
                self._owner[job.name] = index
            # read as messages come, so a worker never waits on a full pipe to log
            threading.Thread(
                target=self._read, args=(index,), name=f"{proc.name}-reader", daemon=True
            ).start()
        logger.info(
            "building %s in %d worker process%s beside the compile",
            ", ".join(self.jobs),
            count,
            "" if count == 1 else "es",
        )

    def __contains__(self, name: str) -> bool:
        return name in self.jobs

    def result(self, name: str) -> BuildResult | None:
        """Wait for job ``name``; None where its worker could not start (the caller builds it
        itself). A worker that dies mid-build gives a result with an error."""
        index = self._owner[name]
        with self._changed:
            self._changed.wait_for(lambda: name in self._results or index in self._ended)
            if name in self._results:
                return self._results[name]
        proc = self._procs[index][0]
        proc.join()
        if index not in self._started:
            logger.info(
                "the build worker %s could not start (exit code %s); building %s here",
                proc.name,
                proc.exitcode,
                name,
            )
            return None
        return BuildResult(name, 0.0, error=f"the build worker died (exit code {proc.exitcode})")

    def _read(self, index: int) -> None:
        """Worker ``index``'s messages: its log records (logged here), its results."""
        reader = self._procs[index][1]
        while True:
            try:
                kind, *rest = reader.recv()
            except (EOFError, OSError):  # the worker exited (or close() closed the pipe)
                break
            if kind == "log":
                name, level, text = rest
                logging.getLogger(name).log(level, "%s", text)
                continue
            with self._changed:
                if kind == "started":
                    self._started.add(index)
                    self._setup_s[index] = time.perf_counter() - self._spawned[index]
                    # the cores it may run on: a worker spawned from a thread TVM's pool
                    # pinned inherits that thread's narrower mask, and so do its warm-ups
                    logger.debug(
                        "build worker %d set up in %.1f s (%s cores allowed)",
                        index,
                        self._setup_s[index],
                        rest[0],
                    )
                elif kind == "setup-failed":
                    logger.info("a build worker could not set up: %s", rest[0])
                else:  # "built"
                    setup = self._setup_s.get(index)
                    self._results[rest[0].name] = dataclasses.replace(rest[0], setup_s=setup)
                self._changed.notify_all()
        with self._changed:
            self._ended.add(index)
            self._changed.notify_all()

    def close(self) -> None:
        """Terminate the workers still running (a compile that stops early, Ctrl-C) and wait
        for every worker to exit."""
        for proc, reader in self._procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(_TERMINATE_WAIT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        # the readers end at the workers' exit (EOF); the pipes close with this object

    def __enter__(self) -> BackgroundBuilds:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _PipeHandler(logging.Handler):
    """Sends a worker's log records to the compile, which logs them as its own."""

    def __init__(self, writer: Connection) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a log line must never fail a build
            self.writer.send(("log", record.name, record.levelno, record.getMessage()))


def _error_text(exc: BaseException) -> str:
    """The message of a failed build (TVM's errors carry the failing function in it)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _work(
    writer: Connection,
    model_path: str,
    model_sha256: str,
    preset: TargetPreset,
    jobs: list[BuildJob],
    build: Builder,
    level: int,
) -> None:
    """A worker's body: import the model, build each job, send one message per job (and its
    log records at ``level`` and above, which the compile logs)."""
    # a terminal's Ctrl-C reaches the whole process group: the compile terminates its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    package = logging.getLogger("codl_tvm")
    package.setLevel(level)
    package.addHandler(_PipeHandler(writer))
    package.propagate = False
    # The first warm-up's processes start now: their start (Python, TVM's runtime; seconds
    # when many start at once) overlaps the model's import and the build instead of following.
    ahead = WarmUpProcesses() if any(job.warm for job in jobs) else None
    try:
        if file_sha256(Path(model_path)) != model_sha256:
            raise RuntimeError(f"{model_path} changed since the compile read it")
        model = load_onnx(model_path)
        mod, inputs = model.mod, [(spec.shape, spec.dtype) for spec in model.inputs]
    except Exception as exc:
        if ahead is not None:
            ahead.close()
        writer.send(("setup-failed", _error_text(exc)))
        writer.close()
        return
    writer.send(("started", _allowed_cores()))
    try:
        for job in jobs:
            result = _build_job(job, build, mod, preset)
            if job.warm and result.error is None:
                # sent once warm: the compile's timing must not overlap the warm-up
                try:
                    seconds = warm_up(job.path, job.warm, inputs, processes=ahead)
                    result = dataclasses.replace(result, warm_s=seconds)
                except Exception as exc:  # a missed warm-up leaves the compiling to the timing
                    logging.getLogger(__name__).info("note: no warm-up of %s: %s", job.name, exc)
                ahead = None  # taken (and closed) by that warm-up
            writer.send(("built", result))
    finally:
        if ahead is not None:  # no job warmed up: nothing to run
            ahead.close()
    writer.close()


def _allowed_cores() -> int | None:
    """The cores this process may run on (None where the platform does not say)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _build_job(job: BuildJob, build: Builder, mod, preset: TargetPreset) -> BuildResult:
    """Build ``job`` with ``build``: its result, with the error where it failed."""
    start = time.perf_counter()
    try:
        splits, weights = build(job.path, job.spec, mod, preset)
        return BuildResult(job.name, time.perf_counter() - start, splits, weights)
    except Exception as exc:  # reported to the compile, which drops the candidate
        logging.getLogger(__name__).debug("%s", traceback.format_exc())
        return BuildResult(job.name, time.perf_counter() - start, error=_error_text(exc))
