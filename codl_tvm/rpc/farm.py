"""Device farms: every free device of one tracker key, running jobs in parallel threads.

:class:`DeviceFarm` requests every free device of a key (:func:`codl_tvm.rpc.client.request_remote`)
and spreads jobs over them, one job at a time per device, with a per-job timeout and retries; a
device that stops answering is dropped. The profiler measures operators this way
(:mod:`codl_tvm.profiling.farm`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from codl_tvm.core.errors import NoFreeDevice, RemoteFailure
from codl_tvm.rpc.client import RemoteDevice, request_remote, tracker_address, wait_for_devices

__all__ = ["DeviceFarm", "JobResult"]


@dataclass(frozen=True)
class JobResult:
    """The outcome of one farm job.

    Attributes
    ----------
    index
        The job's position in the list given to :meth:`DeviceFarm.run`.
    value
        What the job returned (``None`` on failure).
    error
        Why the last attempt failed, or ``None``.
    device
        The device of the last attempt.
    attempts
        How many times the job ran.
    """

    index: int
    value: Any
    error: str | None
    device: str | None
    attempts: int

    @property
    def ok(self) -> bool:
        return self.error is None


class DeviceFarm:
    """Every free device of one key, running jobs in parallel threads.

    Use as a context manager::

        with DeviceFarm("127.0.0.1:9190", "android", request_timeout_s=10) as farm:
            results = farm.run([job1, job2, ...], job_timeout_s=60, retries=1)

    A job is a callable ``job(remote: RemoteDevice) -> value``. Each device runs one job at a time.
    A job that raises or exceeds ``job_timeout_s`` is retried (on any device) up to ``retries``
    more times; a device whose session no longer answers is dropped from the farm; jobs left
    when every device is gone fail with the reason.

    Parameters
    ----------
    tracker, key
        The tracker address and device key.
    max_devices
        Use at most this many devices (default: all free ones).
    request_timeout_s
        Bound on getting the devices (at least one must be free).
    session_timeout_s
        Server-side session limit (0: none); it also frees a device stuck in a job.
    """

    def __init__(
        self,
        tracker: str | tuple[str, int],
        key: str,
        max_devices: int | None = None,
        request_timeout_s: float = 10.0,
        session_timeout_s: float = 0.0,
    ) -> None:
        self.tracker = tracker_address(tracker)
        self.key = key
        self.max_devices = max_devices
        self.request_timeout_s = request_timeout_s
        self.session_timeout_s = session_timeout_s
        self.devices: list[RemoteDevice] = []

    def __enter__(self) -> DeviceFarm:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> list[RemoteDevice]:
        """Request every free device of the key (at least one, within the request timeout)."""
        free = wait_for_devices(self.tracker, self.key, 1, self.request_timeout_s)
        want = free if self.max_devices is None else min(free, self.max_devices)
        for _ in range(want):
            try:
                self.devices.append(
                    request_remote(
                        self.tracker,
                        self.key,
                        timeout_s=2.0,
                        session_timeout_s=self.session_timeout_s,
                    )
                )
            except (NoFreeDevice, RemoteFailure):
                break  # taken by someone else in the meantime, or broken
        if not self.devices:
            self.devices.append(
                request_remote(
                    self.tracker, self.key, self.request_timeout_s, self.session_timeout_s
                )
            )
        return self.devices

    def close(self) -> None:
        for dev in self.devices:
            dev.close()
        self.devices = []

    @staticmethod
    def _alive(dev: RemoteDevice, timeout_s: float = 5.0) -> bool:
        box: dict[str, bool] = {}

        def _probe() -> None:
            try:
                dev.session.get_function("tvm.rpc.server.workpath")("probe")
                box["ok"] = True
            except Exception:
                box["ok"] = False

        worker = threading.Thread(target=_probe, daemon=True)
        worker.start()
        worker.join(timeout_s)
        return box.get("ok", False)

    def run(
        self,
        jobs: Sequence[Callable[[RemoteDevice], Any]],
        job_timeout_s: float = 60.0,
        retries: int = 1,
        on_failure: Callable[[int, str, str, bool], None] | None = None,
    ) -> list[JobResult]:
        """Run ``jobs`` over the farm's devices; results come back in job order.

        ``on_failure(job_index, device_name, error, retried)`` is called (from a worker thread)
        for every failed attempt, so callers can log which device failed.
        """
        if not self.devices:
            self.open()
        pending: queue.Queue[tuple[int, int]] = queue.Queue()
        for i in range(len(jobs)):
            pending.put((i, 0))
        results: dict[int, JobResult] = {}
        lock = threading.Lock()
        live = [len(self.devices)]

        def _finish(i: int, result: JobResult) -> None:
            with lock:
                results[i] = result

        def _worker(dev: RemoteDevice) -> None:
            while True:
                with lock:
                    if len(results) == len(jobs):
                        return
                try:
                    i, done = pending.get(timeout=0.1)
                except queue.Empty:
                    continue
                box: dict[str, Any] = {}

                def _job(i: int = i) -> None:
                    try:
                        box["value"] = dev.call(f"running job {i}", lambda: jobs[i](dev))
                    except Exception as exc:
                        box["err"] = str(exc)

                runner = threading.Thread(target=_job, daemon=True)
                runner.start()
                runner.join(job_timeout_s)
                attempts = done + 1
                if runner.is_alive():
                    err = f"job {i} timed out after {job_timeout_s:g} s on {dev.name}"
                elif "err" in box:
                    err = box["err"]
                else:
                    _finish(i, JobResult(i, box.get("value"), None, dev.name, attempts))
                    continue
                healthy = not runner.is_alive() and self._alive(dev)
                if on_failure is not None:
                    try:
                        on_failure(i, dev.name, err, attempts <= retries)
                    except Exception:  # a logging callback must not stop the farm
                        pass
                if attempts <= retries:
                    pending.put((i, attempts))
                else:
                    _finish(i, JobResult(i, None, err, dev.name, attempts))
                if not healthy:
                    with lock:
                        live[0] -= 1
                        last = live[0] == 0
                        if dev in self.devices:
                            self.devices.remove(dev)  # dropped from the farm for good
                    if last:  # nobody is left to run the queue: fail what remains
                        while True:
                            try:
                                j, n = pending.get_nowait()
                            except queue.Empty:
                                break
                            _finish(
                                j,
                                JobResult(
                                    j,
                                    None,
                                    f"no live device left under key "
                                    f"'{self.key}' (last error: {err})",
                                    None,
                                    n,
                                ),
                            )
                    return

        threads = [
            threading.Thread(target=_worker, args=(d,), daemon=True, name=f"farm-{d.name}")
            for d in self.devices
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[i] for i in range(len(jobs))]
