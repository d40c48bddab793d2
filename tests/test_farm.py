"""Profiling over a device farm: several real TVM RPC servers on 127.0.0.1 under one tracker key.

The fixtures start ``python -m tvm.exec.rpc_tracker`` and codl-tvm's RPC servers with the OpenCL
plugin (``codl-tvm serve --opencl``, as ``python -m codl_tvm.cli serve``) on free ports.
"""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from codl_tvm.core.errors import ProfileError
from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.cost_model.features import OpParams, part_shape
from codl_tvm.profiling.farm import FarmOptions, profile_farm
from codl_tvm.profiling.profile import job_key, make_jobs
from codl_tvm.profiling.timing import TimingConfig
from codl_tvm.rpc import client as rpc_utils
from tests.rpc_support import Processes, free_port, logged_lines, server_command, start_tracker

pytestmark = [pytest.mark.rpc, pytest.mark.opencl]

TIMING = TimingConfig(warmup=0, repeats=1, number=1)


@pytest.fixture(scope="module")
def procs():
    p = Processes()
    yield p
    p.close()


@pytest.fixture(scope="module")
def tracker(procs) -> str:
    return start_tracker(procs)


def _start_servers(procs, tracker: str, key: str, n: int) -> list[tuple[subprocess.Popen, int]]:
    out = []
    for _ in range(n):
        port = free_port()
        proc = procs.start(server_command(tracker, key, port, "--opencl"))
        out.append((proc, port))
    rpc_utils.wait_for_devices(tracker, key, n, timeout_s=90)
    return out


@pytest.fixture(scope="module")
def jobs():
    """Two small convolutions split along H and OC at one ratio, on both processors (8 jobs)."""
    ops = [
        ("c3", OpParams("conv2d", 16, 16, 8, 16, kernel=3, padding=(1, 1, 1, 1))),
        ("c1", OpParams("conv2d", 8, 8, 16, 32, kernel=1)),
    ]
    return make_jobs(ops, ("H", "OC"), (0.5,))


def _check_dataset(path, jobs, device_names=None):
    """Every job recorded exactly once, with the part shape the job asks for."""
    data = load_dataset(path)  # validates every record (latency > 0, fields, shapes)
    recs = data.op_records
    assert len(recs) == len(jobs)
    keys = [job_key(r.params, r.partition, r.processor, r.device) for r in recs]
    assert len(set(keys)) == len(keys)
    want = {(j.params, j.partition, j.processor) for j in jobs}
    assert {(r.params, r.partition, r.processor) for r in recs} == want
    for r in recs:
        assert r.part == part_shape(r.params, r.partition, r.processor)
        assert r.device["remote"] is True and r.latency_ms > 0
    return data


@pytest.mark.slow
def test_farm_profiles_each_job_once_over_two_devices(procs, tracker, jobs, tmp_path, opencl):
    _start_servers(procs, tracker, "farm2", 2)
    out = tmp_path / "farm.jsonl"
    with logged_lines() as lines:
        options = FarmOptions(tracker, "farm2", timing=TIMING, sharing_sizes=(4096,))
        counts = profile_farm(jobs, out, options)
    assert counts["devices"] == 2, lines
    assert counts["measured"] == len(jobs) and counts["skipped"] == 0 and counts["retried"] == 0
    data = _check_dataset(out, jobs)
    assert len(data.records) - len(data.op_records) == counts["sharing"] >= 1
    # resuming measures nothing again
    rpc_utils.wait_for_devices(tracker, "farm2", 2, timeout_s=30)
    again = profile_farm(jobs, out, FarmOptions(tracker, "farm2", timing=TIMING, sharing_sizes=()))
    assert again["measured"] == 0 and again["skipped"] == len(jobs)
    _check_dataset(out, jobs)


@pytest.mark.slow
def test_killed_server_jobs_are_retried_elsewhere(procs, tracker, jobs, tmp_path, opencl):
    (victim, vport), _ = _start_servers(procs, tracker, "farmkill", 2)

    def kill_after_compiling(line: str) -> None:
        if line.startswith("compiled "):  # devices connected, nothing measured yet: kill one
            threading.Thread(target=Processes.kill, args=(victim,), daemon=True).start()
            time.sleep(0.5)

    out = tmp_path / "kill.jsonl"
    options = FarmOptions(tracker, "farmkill", timing=TIMING, sharing_sizes=(), retries=2)
    with logged_lines(kill_after_compiling) as lines:
        counts = profile_farm(jobs, out, options)
    assert victim.poll() is not None
    assert counts["measured"] == len(jobs)
    assert counts["retried"] >= 1
    failed = [ln for ln in lines if " failed on " in ln]
    assert failed and all(f"farmkill@127.0.0.1:{vport}" in ln for ln in failed), lines
    assert any("retrying on another device" in ln for ln in failed)
    _check_dataset(out, jobs)


def test_farm_errors(tracker, jobs, tmp_path):
    with pytest.raises(rpc_utils.NoFreeDevice, match="no device registered under key 'nokey'"):
        profile_farm(jobs, tmp_path / "x.jsonl", FarmOptions(tracker, "nokey", request_timeout_s=1))
    with pytest.raises(rpc_utils.TrackerUnreachable):
        unreachable = FarmOptions(f"127.0.0.1:{free_port()}", "k", request_timeout_s=1)
        profile_farm(jobs, tmp_path / "x.jsonl", unreachable)
    # options no run can use are refused when they are made, naming the field
    with pytest.raises(ProfileError, match="`retries` must be at least 0"):
        FarmOptions(tracker, "k", retries=-1)
    with pytest.raises(ProfileError, match="`tracker`: tracker address 'localhost'"):
        FarmOptions("localhost", "k")


def test_cli_profile_farm(procs, tracker, tmp_path, capsys, opencl):
    """``codl-tvm profile --sample N --rpc H:P --rpc-key K --farm`` through the real CLI."""
    from codl_tvm.cli import main
    from codl_tvm.profiling.profile import sampled_ops

    _start_servers(procs, tracker, "farmcli", 2)
    out = tmp_path / "cli.jsonl"
    args = [
        *("profile", "--sample", "2", "--max-gflops", "0.02", "--dims", "H", "--ratios", "0.5"),
        *("--warmup", "0", "--repeats", "1", "--number", "1", "--sharing-sizes", "4096"),
        *("--rpc", tracker, "--rpc-key", "farmcli", "--farm", "--job-timeout", "120"),
        *("-o", str(out)),
    ]
    assert main(args) == 0
    jobs = make_jobs(sampled_ops(2, 0, "codl", 0.02), ("H",), (0.5,))
    assert f"measured {len(jobs)} parts" in capsys.readouterr().out
    data = _check_dataset(out, jobs)
    assert len(data.records) > len(data.op_records)  # the sharing records
    # --farm without a tracker: a clear error, nothing written
    bad = tmp_path / "bad.jsonl"
    code = main(["profile", "--sample", "1", "--farm", "-o", str(bad)])
    assert code != 0 and not bad.exists()
    assert "--farm needs --rpc HOST:PORT and --rpc-key KEY" in capsys.readouterr().err
