"""Profiling over a device farm: every remote registered under one tracker key measures a share
of the jobs in parallel.

The host compiles every part once (:func:`codl_tvm.profiling.parts.compile_part`); a
:class:`codl_tvm.rpc.client.DeviceFarm` then hands the measurements to the free devices of the key,
one job at a time per device, with a per-job timeout and retries. A job whose device fails or
dies is retried on another device (the failing device is named in the log and dropped from the
farm); the records of all devices are merged into one dataset, in job order, each job measured
once. Resuming works as for :func:`codl_tvm.profiling.profile.profile`: jobs already in the
dataset are skipped.

Every device records its own description (``device`` field of the records); the devices of one
key are expected to be the same kind of phone or board.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from codl_tvm.build.targets import get_preset
from codl_tvm.profiling.parts import (
    ProfileError,
    RPCSession,
    TimingConfig,
    compile_part,
    device_description,
    measure_op,
)
from codl_tvm.profiling.profile import ProfileJob, _label, _open, _sharing, job_key
from codl_tvm.rpc.client import DeviceFarm

__all__ = ["FarmSession", "profile_farm"]


class FarmSession(RPCSession):
    """An :class:`RPCSession` that uploads every library under a fresh name, so a job retried on
    a device that already loaded the same file does not overwrite a loaded library."""

    def load_module(self, path: str | Path):
        path = Path(path)
        name = f"{path.stem}-{uuid.uuid4().hex[:10]}{path.suffix}"
        self.session.upload(str(path), name)
        return self.session.load_module(name)


def profile_farm(
    jobs: Sequence[ProfileJob],
    output: str | Path,
    tracker: str,
    key: str,
    work_dir: str | Path | None = None,
    timing: TimingConfig = TimingConfig(),
    sharing_sizes: Sequence[int] = (4096, 65536, 1 << 20),
    gpu_target=None,
    cpu_target=None,
    meta: dict | None = None,
    job_timeout_s: float = 300.0,
    retries: int = 2,
    max_devices: int | None = None,
    request_timeout_s: float = 30.0,
    log: Callable[[str], None] | None = print,
    preset: str | None = None,
) -> dict[str, int]:
    """Compile ``jobs`` here and measure them on every free device of ``key`` in parallel.

    Parameters
    ----------
    jobs
        From :func:`codl_tvm.profiling.profile.make_jobs`.
    output
        The dataset (``.jsonl``) to write or resume.
    tracker, key
        The TVM RPC tracker ``HOST:PORT`` and the device key (the servers must have loaded
        codl-tvm's OpenCL plugin: ``python -m codl_tvm.rpc.client serve --opencl``).
    job_timeout_s, retries
        Per-job bound, and how many more attempts a failed job gets (on any live device).
    max_devices
        Use at most this many devices (default: every free one).
    request_timeout_s
        Bound on getting at least one device.
    log
        Receives progress and failure lines (``None``: quiet).
    preset
        The devices' target preset (``codl_tvm.build.targets``): its targets, unless given, and its
        (cross-)toolchain build the parts (default: this machine's).

    Returns
    -------
    dict
        ``measured``, ``skipped`` (already in the dataset), ``sharing`` records, ``devices`` used
        and ``retried`` (failed attempts that were retried).

    Raises
    ------
    codl_tvm.rpc.client.RPCError
        The tracker is unreachable or no device of ``key`` is free.
    ProfileError
        Some jobs failed on every attempt (the records of the others are written first; the
        message names each failed job and its last device and error).
    """
    say = log or (lambda _msg: None)
    lock = threading.Lock()
    retried = [0]
    if preset is not None:
        gpu_target = gpu_target or get_preset(preset).target("gpu")
        cpu_target = cpu_target or get_preset(preset).target("cpu")

    def _on_failure(i: int, device: str, error: str, again: bool) -> None:
        with lock:
            retried[0] += int(again)
        say(
            f"job {i} ({_label(todo[i])}) failed on {device}: {error}"
            + ("; retrying on another device" if again else "; no attempts left")
        )

    with DeviceFarm(tracker, key, max_devices, request_timeout_s) as farm:
        names = [d.name for d in farm.devices]
        say(f"device farm '{key}': {len(names)} device(s): {', '.join(names)}")
        first = FarmSession(farm.devices[0].session)
        device = device_description(first, gpu_target, cpu_target)
        writer, done = _open(output, meta, timing)
        todo = [j for j in jobs if job_key(j.params, j.partition, j.processor, device) not in done]
        with writer, tempfile.TemporaryDirectory(prefix="codl-farm-") as tmp:
            directory = Path(work_dir) if work_dir else Path(tmp)
            directory.mkdir(parents=True, exist_ok=True)
            compiled = [
                compile_part(
                    j.params,
                    j.partition,
                    j.processor,
                    directory,
                    gpu_target if j.processor == "gpu" else cpu_target,
                    j.name,
                    preset=preset,
                )
                for j in todo
            ]
            say(f"compiled {len(compiled)} parts; measuring on {len(names)} device(s)")
            descriptions: dict[str, dict] = {}

            def _job(part):
                def run(remote):
                    sess = FarmSession(remote.session)
                    with lock:
                        desc = descriptions.get(remote.name)
                    if desc is None:
                        desc = device_description(sess, gpu_target, cpu_target)
                        with lock:
                            descriptions[remote.name] = desc
                    return measure_op(sess, part, directory, desc, timing)

                return run

            results = farm.run(
                [_job(c) for c in compiled],
                job_timeout_s=job_timeout_s,
                retries=retries,
                on_failure=_on_failure,
            )
            measured = 0
            for r in results:
                if r.ok:
                    writer.append(r.value)
                    measured += 1
            n_sharing = 0
            if sharing_sizes and farm.devices:
                n_sharing = _sharing(
                    FarmSession(farm.devices[0].session), writer, device, sharing_sizes, None
                )
    failed = [r for r in results if not r.ok]
    counts = {
        "measured": measured,
        "skipped": len(jobs) - len(todo),
        "sharing": n_sharing,
        "devices": len(names),
        "retried": retried[0],
    }
    say(
        f"farm: {measured} measured, {counts['skipped']} skipped, {counts['retried']} retried, "
        f"{len(failed)} failed"
    )
    if failed:
        lines = [
            f"job {r.index} ({_label(todo[r.index])}): {r.error} (last device {r.device})"
            for r in failed
        ]
        raise ProfileError(
            f"{len(failed)} of {len(todo)} profiling jobs failed on every attempt; the others "
            f"were written to {output}:\n" + "\n".join(lines)
        )
    return counts
