"""Profiling over a device farm: every remote registered under one tracker key measures a share
of the jobs in parallel.

The host compiles every part once (:func:`codl_tvm.profiling.part_build.compile_part`); a
:class:`codl_tvm.rpc.farm.DeviceFarm` then hands the measurements to the free devices of the key,
one job at a time per device, with a per-job timeout and retries. A job whose device fails or
dies is retried on another device (the failing device is named in the log and dropped from the
farm); the records of all devices are merged into one dataset, in job order, each job measured
once. Resuming works as for :func:`codl_tvm.profiling.profile.profile`: jobs already in the
dataset are skipped. :func:`profile_farm` takes its settings as one :class:`FarmOptions`.

Every device records its own description (``device`` field of the records); the devices of one
key are expected to be the same kind of phone or board.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codl_tvm.build.targets import get_preset
from codl_tvm.core.errors import ProfileError
from codl_tvm.profiling.part_build import CompiledPart, compile_part
from codl_tvm.profiling.profile import (
    ProfileJob,
    append_sharing,
    job_key,
    job_label,
    open_dataset,
)
from codl_tvm.profiling.sessions import RPCSession, device_description
from codl_tvm.profiling.timing import TimingConfig, measure_op
from codl_tvm.rpc.client import RemoteDevice, parse_address
from codl_tvm.rpc.farm import DeviceFarm, JobResult

__all__ = ["FarmOptions", "FarmSession", "profile_farm"]

logger = logging.getLogger(__name__)


class FarmSession(RPCSession):
    """An :class:`RPCSession` that uploads every library under a fresh name, so a job retried on
    a device that already loaded the same file does not overwrite a loaded library."""

    def load_module(self, path: str | Path):
        path = Path(path)
        name = f"{path.stem}-{uuid.uuid4().hex[:10]}{path.suffix}"
        self.session.upload(str(path), name)
        return self.session.load_module(name)


@dataclass(frozen=True)
class FarmOptions:
    """Where and how :func:`profile_farm` measures.

    Attributes
    ----------
    tracker, key
        The TVM RPC tracker ``HOST:PORT`` and the device key (the servers must have loaded
        codl-tvm's OpenCL plugin: ``codl-tvm serve --opencl``).
    timing
        The timing protocol of every measurement (recorded in the dataset).
    sharing_sizes
        Bytes of the data-sharing measurements (empty: none).
    preset
        The devices' target preset (``codl_tvm.build.targets``): its targets, unless given, and
        its (cross-)toolchain build the parts (default: this machine's).
    gpu_target, cpu_target
        The targets of the parts (default: the preset's, else this machine's).
    job_timeout_s, retries
        Per-job bound, and how many more attempts a failed job gets (on any live device).
    max_devices
        Use at most this many devices (default: every free one).
    request_timeout_s
        Bound on getting at least one device.
    work_dir
        Where the parts' libraries are built (default: a temporary directory).

    Raises
    ------
    ProfileError
        On construction, for a value no run can use (the message names the field).
    """

    tracker: str
    key: str
    timing: TimingConfig = field(default_factory=TimingConfig)
    sharing_sizes: tuple[int, ...] = (4096, 65536, 1 << 20)
    preset: str | None = None
    gpu_target: Any = None
    cpu_target: Any = None
    job_timeout_s: float = 300.0
    retries: int = 2
    max_devices: int | None = None
    request_timeout_s: float = 30.0
    work_dir: str | Path | None = None

    def __post_init__(self) -> None:
        try:
            parse_address(self.tracker)
        except ValueError as exc:
            raise ProfileError(f"`tracker`: {exc}") from None
        if not self.key:
            raise ProfileError("`key` is empty: give the device key the servers registered with")
        if self.job_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ProfileError(
                f"`job_timeout_s` and `request_timeout_s` must be positive (got "
                f"{self.job_timeout_s:g}, {self.request_timeout_s:g})"
            )
        if self.retries < 0:
            raise ProfileError(f"`retries` must be at least 0, not {self.retries}")
        if self.max_devices is not None and self.max_devices < 1:
            raise ProfileError(f"`max_devices` must be at least 1, not {self.max_devices}")
        if any(int(n) <= 0 for n in self.sharing_sizes):
            raise ProfileError(
                f"`sharing_sizes` must be positive byte counts: {self.sharing_sizes}"
            )

    def targets(self) -> tuple[Any, Any]:
        """The GPU and CPU targets of the parts: as given, else the preset's (else ``None``,
        this machine's)."""
        if self.preset is None:
            return self.gpu_target, self.cpu_target
        preset = get_preset(self.preset)
        return self.gpu_target or preset.target("gpu"), self.cpu_target or preset.target("cpu")


def profile_farm(
    jobs: Sequence[ProfileJob],
    output: str | Path,
    options: FarmOptions,
    meta: dict | None = None,
) -> dict[str, int]:
    """Compile ``jobs`` here and measure them on every free device of ``options.key`` in
    parallel; progress and failures go to this module's logger.

    Parameters
    ----------
    jobs
        From :func:`codl_tvm.profiling.profile.make_jobs`.
    output
        The dataset (``.jsonl``) to write or resume.
    options
        The farm and the measurements (:class:`FarmOptions`).
    meta
        The dataset's header fields, for a new dataset (a resumed one must match them).

    Returns
    -------
    dict
        ``measured``, ``skipped`` (already in the dataset), ``sharing`` records, ``devices`` used
        and ``retried`` (failed attempts that were retried).

    Raises
    ------
    codl_tvm.core.errors.RPCError
        The tracker is unreachable or no device of the key is free.
    ProfileError
        Some jobs failed on every attempt (the records of the others are written first; the
        message names each failed job and its last device and error).
    """
    gpu_target, cpu_target = options.targets()
    with DeviceFarm(
        options.tracker, options.key, options.max_devices, options.request_timeout_s
    ) as farm:
        names = [d.name for d in farm.devices]
        logger.info("device farm '%s': %d device(s): %s", options.key, len(names), ", ".join(names))
        device = device_description(FarmSession(farm.devices[0].session), gpu_target, cpu_target)
        writer, done = open_dataset(output, meta, options.timing)
        todo = [j for j in jobs if job_key(j.params, j.partition, j.processor, device) not in done]
        with writer, tempfile.TemporaryDirectory(prefix="codl-farm-") as tmp:
            directory = Path(options.work_dir) if options.work_dir else Path(tmp)
            directory.mkdir(parents=True, exist_ok=True)
            compiled = [
                compile_part(
                    j.params,
                    j.partition,
                    j.processor,
                    directory,
                    gpu_target if j.processor == "gpu" else cpu_target,
                    j.name,
                    preset=options.preset,
                )
                for j in todo
            ]
            logger.info("compiled %d parts; measuring on %d device(s)", len(compiled), len(names))
            results, retried = _measure(farm, todo, compiled, directory, options)
            measured = 0
            for r in results:
                if r.ok:
                    writer.append(r.value)
                    measured += 1
            n_sharing = 0
            if options.sharing_sizes and farm.devices:
                first = FarmSession(farm.devices[0].session)
                n_sharing = append_sharing(first, writer, device, options.sharing_sizes, None)
    counts = {
        "measured": measured,
        "skipped": len(jobs) - len(todo),
        "sharing": n_sharing,
        "devices": len(names),
        "retried": retried,
    }
    _check_failures(results, todo, counts, output)
    return counts


def _measure(
    farm: DeviceFarm,
    todo: list[ProfileJob],
    compiled: list[CompiledPart],
    directory: Path,
    options: FarmOptions,
) -> tuple[list[JobResult], int]:
    """Measure every compiled part on the farm; returns the results in job order and how many
    failed attempts were retried."""
    gpu_target, cpu_target = options.targets()
    lock = threading.Lock()
    retried = [0]
    descriptions: dict[str, dict] = {}

    def _on_failure(i: int, device: str, error: str, again: bool) -> None:
        with lock:
            retried[0] += int(again)
        logger.warning(
            "job %d (%s) failed on %s: %s; %s",
            i,
            job_label(todo[i]),
            device,
            error,
            "retrying on another device" if again else "no attempts left",
        )

    def _job(part: CompiledPart):
        def run(remote: RemoteDevice):
            sess = FarmSession(remote.session)
            with lock:
                desc = descriptions.get(remote.name)
            if desc is None:
                desc = device_description(sess, gpu_target, cpu_target)
                with lock:
                    descriptions[remote.name] = desc
            return measure_op(sess, part, directory, desc, options.timing)

        return run

    results = farm.run(
        [_job(c) for c in compiled],
        job_timeout_s=options.job_timeout_s,
        retries=options.retries,
        on_failure=_on_failure,
    )
    return results, retried[0]


def _check_failures(
    results: list[JobResult], todo: list[ProfileJob], counts: dict[str, int], output
) -> None:
    """Log the run's counts; raise for the jobs that failed on every attempt."""
    failed = [r for r in results if not r.ok]
    logger.info(
        "farm: %d measured, %d skipped, %d retried, %d failed",
        counts["measured"],
        counts["skipped"],
        counts["retried"],
        len(failed),
    )
    if failed:
        lines = [
            f"job {r.index} ({job_label(todo[r.index])}): {r.error} (last device {r.device})"
            for r in failed
        ]
        raise ProfileError(
            f"{len(failed)} of {len(todo)} profiling jobs failed on every attempt; the others "
            f"were written to {output}:\n" + "\n".join(lines)
        )
