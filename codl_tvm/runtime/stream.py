"""The pipeline executor: frames stream through stages, one host thread per stage.

A pipeline (Pipe-it) runs a model cut into stages, each on its own processors, with several
frames in flight: while stage 2 runs frame ``i``, stage 1 runs frame ``i + 1``. This module runs
any sequence of stage callables that way:

- one host thread per stage (TVM's CPU thread pool belongs to the calling thread, so a stage's
  thread is where its pool lives; :class:`StreamStage` can pin the thread to its cores and run a
  set-up callable in it first), a feeder thread reading the frames;
- bounded queues between them (``queue_size`` frames waiting per stage): a slow stage holds
  the ones before it back instead of letting frames pile up in memory;
- outputs come back in input order, as an iterator (:func:`run_stream`), and
  :meth:`Stream.stats` measures the stream (:class:`StreamStats`: frames/s and per-frame latency
  median and p99, with ``time.perf_counter``);
- a stage (or the frame iterator) that raises stops the stream: every thread stops, and the
  caller's next step re-raises that exception (with a note naming the stage and the frame).
  No thread ever blocks without a timeout, so a failure never hangs the stream; outputs not
  yet returned when a stage fails are dropped.

Bad input is refused before any frame runs: no stages, an empty stream, a stage pinned to cores
this process cannot use; and, when an input shape is declared, a frame of another shape
(frames given as a sequence are all checked before the stream starts, frames from an iterator
before each enters the first stage).

A frame is whatever the first stage takes; shapes are checked on numpy arrays (anything with a
``shape``), mappings of them (named model inputs) and tuples or lists of them.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from codl_tvm.core.errors import ModelError, PlannerError
from codl_tvm.core.groups import process_cpus

__all__ = [
    "Stream",
    "StreamStage",
    "StreamStats",
    "process_cpus",
    "run_stream",
]

Shape = tuple[int, ...]
# What a declared input shape may be: one array's shape, named inputs' shapes, several inputs'.
ShapeSpec = Shape | Mapping[str, Shape] | tuple[Shape, ...]

# How long a blocked thread waits before it looks at the stop flag again.
_POLL_S = 0.05
_END = object()


@dataclass(frozen=True)
class StreamStage:
    """One stage of a stream.

    Parameters
    ----------
    fn
        Takes the previous stage's output (the frame, for the first stage) and returns this
        stage's output.
    name
        For messages and statistics (default: ``stage<i>``).
    cores
        Host cores to pin the stage's thread to (Linux ``sched_setaffinity`` of the thread), or
        None to leave it where the OS puts it.
    setup
        Runs once in the stage's thread before its first frame (after pinning): where a
        per-thread runtime (TVM's CPU thread pool) is configured.
    """

    fn: Callable[[Any], Any]
    name: str = ""
    cores: tuple[int, ...] | None = None
    setup: Callable[[], None] | None = None


@dataclass(frozen=True)
class StreamStats:
    """Measurements of a stream so far.

    Attributes
    ----------
    frames
        Frames that came out of the last stage.
    wall_s
        From the first stage starting the first frame to the last stage finishing the last.
    frames_per_s
        ``frames / wall_s`` (0 before two frames are out): the pipeline's fill (the first
        frame crossing every stage) included, so a short stream through many stages reads low.
    steady_frames_per_s
        Frames per second between the first output and the last (``(frames - 1)`` over that
        span, 0 before two frames are out): the rate once the pipeline is full (Pipe-it
        measures throughput at steady state), fill excluded.
    fill_ms
        From the first stage starting the first frame to the last stage finishing it: what
        the pipeline takes to fill, reported apart from the steady rate.
    latency_median_ms, latency_p99_ms
        Per-frame latency, from the first stage taking the frame to the last stage finishing
        it (waiting in queues between stages included).
    stage_busy_s
        Per stage, the seconds its callable ran (its share of ``wall_s`` is its utilisation).
    stage_names
        The stages' names, in order.
    spans
        With ``timeline=True``: ``(stage, frame, start_s, end_s)`` per stage run, times relative
        to the first frame's start; else empty.
    """

    frames: int
    wall_s: float
    frames_per_s: float
    latency_median_ms: float
    latency_p99_ms: float
    stage_busy_s: tuple[float, ...]
    stage_names: tuple[str, ...]
    spans: tuple[tuple[int, int, float, float], ...] = ()
    steady_frames_per_s: float = 0.0
    fill_ms: float = 0.0


@dataclass
class _Frame:
    index: int
    payload: Any
    start: float = 0.0  # the first stage took it
    end: float = 0.0  # the last stage finished it


def _shape_of(frame: Any) -> Any:
    if hasattr(frame, "shape"):
        return tuple(int(d) for d in frame.shape)
    if isinstance(frame, Mapping):
        return {k: _shape_of(v) for k, v in frame.items()}
    if isinstance(frame, tuple | list):
        return tuple(_shape_of(v) for v in frame)
    return None


def _normalize_shape(spec: Any) -> Any:
    if isinstance(spec, Mapping):
        return {k: _normalize_shape(v) for k, v in spec.items()}
    if isinstance(spec, tuple | list) and all(isinstance(d, int | np.integer) for d in spec):
        return tuple(int(d) for d in spec)
    if isinstance(spec, tuple | list):
        return tuple(_normalize_shape(v) for v in spec)
    raise ModelError(f"input_shape: not a shape, a mapping or a tuple of shapes: {spec!r}")


def _check_shape(frame: Any, index: int, expected: Any) -> None:
    got = _shape_of(frame)
    if got != expected:
        raise ModelError(
            f"stream frame {index}: shape {got} differs from the input shape {expected}"
        )


class Stream(Iterator[Any]):
    """A running stream: iterate it for the outputs, in input order.

    Made by :func:`run_stream`; see there for the arguments. Use it as a context manager (or
    call :meth:`close`) to stop its threads when not iterating to the end; iterating to the end,
    or a failure, stops them too.
    """

    def __init__(
        self,
        stages: Sequence[Callable[[Any], Any] | StreamStage],
        frames: Iterable[Any],
        *,
        queue_size: int = 2,
        input_shape: ShapeSpec | Literal["first"] | None = None,
        timeline: bool = False,
        available_cores: Iterable[int] | None = None,
    ) -> None:
        self._stages = self._check_stages(stages, available_cores)
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise PlannerError(f"queue_size must be a positive integer, got {queue_size!r}")
        frames_iter, first, expected = self._check_frames(frames, input_shape)
        self._expected_shape = expected
        self._timeline = timeline

        self._stop = threading.Event()
        self._error_lock = threading.Lock()
        self._error: tuple[BaseException, str, int | None] | None = None
        n = len(self._stages)
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=queue_size) for _ in range(n + 1)]
        self._busy = [0.0] * n
        self._spans: list[tuple[int, int, float, float]] = []
        self._latencies: list[float] = []
        self._first_start: float | None = None
        self._last_out: float | None = None
        self._first_out: float | None = None
        self._next_index = 0
        self._pending: dict[int, Any] = {}
        self._finished = False

        self._threads = [
            threading.Thread(
                target=self._feed, args=(first, frames_iter), name="codl-stream-feed", daemon=True
            )
        ]
        for i, stage in enumerate(self._stages):
            self._threads.append(
                threading.Thread(
                    target=self._run_stage,
                    args=(i, stage),
                    name=f"codl-stream-{i}-{stage.name}",
                    daemon=True,
                )
            )
        for t in self._threads:
            t.start()

    # checks before anything runs -----------------------------------------------------------
    @staticmethod
    def _check_stages(
        stages: Sequence[Callable[[Any], Any] | StreamStage], available: Iterable[int] | None
    ) -> list[StreamStage]:
        if callable(stages) or isinstance(stages, StreamStage):
            stages = [stages]
        stages = list(stages)
        if not stages:
            raise PlannerError("a stream needs at least one stage")
        avail = set(process_cpus() if available is None else available)
        out = []
        for i, s in enumerate(stages):
            if not isinstance(s, StreamStage):
                if not callable(s):
                    raise PlannerError(f"stream stage {i} is not callable: {s!r}")
                s = StreamStage(s)
            if not callable(s.fn):
                raise PlannerError(f"stream stage {i}: fn is not callable: {s.fn!r}")
            name = s.name or f"stage{i}"
            if s.cores is not None:
                if not s.cores:
                    raise PlannerError(f"stream stage {name!r}: an empty core list")
                missing = sorted(set(s.cores) - avail)
                if missing:
                    raise PlannerError(
                        f"stream stage {name!r} is pinned to cores {missing}, which this "
                        f"process cannot use (available: {sorted(avail)})"
                    )
            out.append(
                StreamStage(s.fn, name, None if s.cores is None else tuple(s.cores), s.setup)
            )
        return out

    @staticmethod
    def _check_frames(frames: Iterable[Any], input_shape: Any) -> tuple[Iterator[Any], Any, Any]:
        if isinstance(frames, Sequence) and not isinstance(frames, str | bytes):
            if len(frames) == 0:
                raise ModelError("the stream has no frames")
            it = iter(frames)
            first = next(it)
        else:
            it = iter(frames)
            try:
                first = next(it)
            except StopIteration:
                raise ModelError("the stream has no frames") from None
        if input_shape is None:
            expected = None
        elif isinstance(input_shape, str):
            if input_shape != "first":
                raise ModelError(f"input_shape: {input_shape!r} is neither a shape nor 'first'")
            expected = _shape_of(first)
        else:
            expected = _normalize_shape(input_shape)
        if expected is not None:
            _check_shape(first, 0, expected)
            if isinstance(frames, Sequence):
                # a sequence is all there: refuse a bad frame before the first one runs
                for i, f in enumerate(frames):
                    _check_shape(f, i, expected)
        return it, first, expected

    # threads -------------------------------------------------------------------------------
    def _fail(self, exc: BaseException, where: str, index: int | None) -> None:
        with self._error_lock:
            if self._error is None:
                self._error = (exc, where, index)
        self._stop.set()

    def _put(self, q: queue.Queue, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue) -> Any:
        while not self._stop.is_set():
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        return _END

    def _feed(self, first: Any, rest: Iterator[Any]) -> None:
        index = 0
        frame = first
        try:
            while True:
                if index > 0 and self._expected_shape is not None:
                    _check_shape(frame, index, self._expected_shape)
                if not self._put(self._queues[0], _Frame(index, frame)):
                    return
                index += 1
                try:
                    frame = next(rest)
                except StopIteration:
                    break
        except BaseException as e:  # the frame iterator's own error, or a bad frame
            self._fail(e, "the frame source", index)
            return
        self._put(self._queues[0], _END)

    def _run_stage(self, i: int, stage: StreamStage) -> None:
        try:
            if stage.cores is not None:
                # pid 0: the calling thread only (Linux); the other stages keep their cores
                os.sched_setaffinity(0, stage.cores)
            if stage.setup is not None:
                stage.setup()
        except BaseException as e:
            self._fail(e, f"stage {stage.name!r} (set-up)", None)
            return
        inbox, outbox = self._queues[i], self._queues[i + 1]
        while True:
            item = self._get(inbox)
            if item is _END:
                self._put(outbox, _END)
                return
            t0 = time.perf_counter()
            if i == 0:
                item.start = t0
            try:
                item.payload = stage.fn(item.payload)
            except BaseException as e:
                self._fail(e, f"stage {stage.name!r}", item.index)
                return
            t1 = time.perf_counter()
            item.end = t1
            self._busy[i] += t1 - t0
            if self._timeline:
                self._spans.append((i, item.index, t0, t1))
            if not self._put(outbox, item):
                return

    # the caller's side ---------------------------------------------------------------------
    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Any:
        while True:
            if self._next_index in self._pending:
                payload = self._pending.pop(self._next_index)
                self._next_index += 1
                return payload
            if self._finished:
                raise StopIteration
            self._raise_if_failed()
            try:
                item = self._queues[-1].get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is _END:
                self._finished = True
                self.close()
                self._raise_if_failed()
                if self._pending:  # frames lost between stages would be a bug here
                    raise RuntimeError(f"stream ended with frames {sorted(self._pending)} early")
                raise StopIteration
            # times from the stages, not from here: a caller slow to take outputs does not
            # count as stream latency
            if self._last_out is None or item.end > self._last_out:
                self._last_out = item.end
            if self._first_out is None or item.end < self._first_out:
                self._first_out = item.end
            if self._first_start is None or item.start < self._first_start:
                self._first_start = item.start
            self._latencies.append(item.end - item.start)
            self._pending[item.index] = item.payload

    def _raise_if_failed(self) -> None:
        if self._error is None:
            return
        self._finished = True
        self._pending.clear()
        self.close()
        exc, where, index = self._error
        note = f"raised in the stream by {where}" + (
            f" on frame {index}" if index is not None else ""
        )
        if hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        raise exc

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every thread of the stream and wait for them (each at most ``timeout_s``: a
        stage callable cannot be interrupted; its thread exits when the call returns)."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout_s)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The stream's threads (feeder first, then one per stage)."""
        return tuple(self._threads)

    def stats(self) -> StreamStats:
        """Measurements of the frames out so far."""
        lat_ms = np.asarray(self._latencies) * 1e3
        frames = len(self._latencies)
        wall = (
            self._last_out - self._first_start
            if self._first_start is not None and self._last_out is not None
            else 0.0
        )
        origin = self._first_start or 0.0
        steady = (
            self._last_out - self._first_out
            if self._first_out is not None and self._last_out is not None
            else 0.0
        )
        return StreamStats(
            frames=frames,
            wall_s=wall,
            frames_per_s=frames / wall if frames > 1 and wall > 0 else 0.0,
            latency_median_ms=float(np.median(lat_ms)) if frames else 0.0,
            latency_p99_ms=float(np.percentile(lat_ms, 99)) if frames else 0.0,
            stage_busy_s=tuple(self._busy),
            stage_names=tuple(s.name for s in self._stages),
            spans=tuple((s, f, t0 - origin, t1 - origin) for s, f, t0, t1 in self._spans),
            steady_frames_per_s=(frames - 1) / steady if frames > 1 and steady > 0 else 0.0,
            fill_ms=(self._first_out - origin) * 1e3 if self._first_out is not None else 0.0,
        )


def run_stream(
    stages: Sequence[Callable[[Any], Any] | StreamStage],
    frames: Iterable[Any],
    *,
    queue_size: int = 2,
    input_shape: ShapeSpec | Literal["first"] | None = None,
    timeline: bool = False,
    available_cores: Iterable[int] | None = None,
) -> Stream:
    """Stream ``frames`` through ``stages``; iterate the result for the outputs, in order.

    Parameters
    ----------
    stages
        Callables (or :class:`StreamStage`), first to last; each takes the previous one's
        output.
    frames
        The inputs: a sequence (checked whole before the stream starts) or any iterable (read
        as the first stage has room, e.g. a camera).
    queue_size
        Frames that may wait before each stage.
    input_shape
        The frames' shape (one array), ``{name: shape}`` (mappings of arrays), a tuple of shapes
        (tuples of arrays), or ``"first"`` (the first frame's); None checks nothing.
    timeline
        Record every stage run's start and end for :attr:`StreamStats.spans`.
    available_cores
        The cores stages may be pinned to (default: this process's CPU affinity).

    Returns
    -------
    Stream
        An iterator of the outputs with :meth:`Stream.stats`.

    Raises
    ------
    PlannerError
        No stages, a stage that is not callable, or one pinned to cores not available.
    ModelError
        No frames, or a frame whose shape differs from ``input_shape``.

    Examples
    --------
    >>> with run_stream([np.negative, np.abs], [np.ones(3)] * 4) as stream:
    ...     outs = list(stream)
    >>> len(outs), stream.stats().frames
    (4, 4)
    """
    return Stream(
        stages,
        frames,
        queue_size=queue_size,
        input_shape=input_shape,
        timeline=timeline,
        available_cores=available_cores,
    )
