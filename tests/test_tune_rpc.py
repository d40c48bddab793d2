"""``compile --tune --tracker H:P --key K``: the operators outside the cost model's data measured
on the tracker's device, through a real TVM RPC tracker and codl-tvm's RPC server with its
OpenCL plugin (``codl-tvm serve --opencl``), both on 127.0.0.1 as separate processes.

The remote device is this machine's own OpenCL driver behind the server: its measurements must
still never stand in for this machine's (nor this machine's for its), as their descriptions
differ (``remote``, the tracker key). No test compares a latency.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from codl_tvm.cli import main
from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.frontend.importer import load_onnx
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.tune import tune_candidates, tune_operators
from codl_tvm.planner import PlannerConfig, plan_model
from codl_tvm.planner.policy import planning_context
from codl_tvm.rpc import client as rpc_utils
from tests.rpc_support import free_port, server_command, tracker_command
from tests.test_tune import novel_cost_model

PRESET = "opencl"
KEY = "tune"


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tracker(opencl) -> Iterator[str]:
    """TVM's tracker and one codl-tvm server with the OpenCL plugin under :data:`KEY`."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    procs = [subprocess.Popen(tracker_command(port), start_new_session=True)]
    try:
        cmd = server_command(addr, KEY, free_port(), "--opencl")
        procs.append(subprocess.Popen(cmd, start_new_session=True))
        rpc_utils.wait_for_devices(addr, KEY, 1, timeout_s=90)
        yield addr
    finally:
        for proc in reversed(procs):
            _stop(proc)


@pytest.fixture(scope="module")
def model():
    return load_onnx(bundled_model_path())


@pytest.fixture(scope="module")
def cost_model():
    return novel_cost_model()


@pytest.fixture(scope="module")
def cost_model_file(cost_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tune_rpc_model") / "synthetic.json"
    cost_model.save(path)
    return path


@pytest.mark.rpc
@pytest.mark.opencl
def test_tune_on_the_trackers_device(tracker, model, cost_model, cost_model_file, tmp_path):
    """Tuned on the tracker's device: every flagged operator measured there, recorded as the
    remote's (its key named); this machine's tuning does not take them, a rerun there does."""
    with planning_context(PRESET, cost_model_file) as config:
        found = tune_candidates(model.mod, cost_model, config, (0.5,))
        remote = tune_operators(
            model.mod, cost_model, config, 600, tmp_path, PRESET, (0.5,), remote=(tracker, KEY)
        )
        assert remote.tuned == tuple(c.name for c in found) and not remote.left, remote.failed
        assert remote.parts_measured == sum(len(c.jobs) for c in found) and remote.cached == ()
        assert remote.device["remote"] is True and remote.device["rpc_key"] == KEY
        assert f"RPC {tracker}, key {KEY}" in remote.on
        records = load_dataset(remote.cache).op_records
        assert len(records) == remote.parts_measured
        assert all(dict(r.device) == remote.device and r.latency_ms > 0 for r in records)
        record = remote.record()
        assert record["on"] == remote.on and record["device"]["rpc_key"] == KEY
        assert (record["measured_fresh"], record["predicted"]) == (len(found), 0)
        assert [o["name"] for o in record["operators"]] == list(remote.tuned)
        # this machine: the remote's measurements do not stand in for its own (nothing left
        # of the budget to measure with, so every operator stays predicted)
        here = tune_operators(model.mod, cost_model, config, 1e-9, tmp_path, PRESET, (0.5,))
        assert here.tuned == () and here.left == remote.tuned and here.table is None
        assert here.device["remote"] is False
        # the tracker's device again: every operator from the cache, nothing measured
        again = tune_operators(
            model.mod, cost_model, config, 600, tmp_path, PRESET, (0.5,), remote=(tracker, KEY)
        )
        assert again.parts_measured == 0 and again.cached == again.tuned == remote.tuned
        assert again.table.table == remote.table.table
    # the planner plans them on the remote's measurements
    plan_config = PlannerConfig(cpu=config.cpu, gpu=config.gpu, tuned_parts=remote.table)
    _, report = plan_model(model.mod, cost_model, "codl", plan_config)
    rows = {d.ops[0]: d for d in report.decisions if not d.is_chain}
    assert all(rows[n].provenance == "measured" for n in remote.tuned if n in rows)


def test_compile_tune_with_an_unreachable_tracker_is_one_line(cost_model_file, tmp_path, capsys):
    """The tracker is asked for a device before anything is built: one line, exit 2."""
    out = tmp_path / "out"
    args = ["compile", str(bundled_model_path()), "-o", str(out), "--tune", "5"]
    args += ["--cost-model", str(cost_model_file)]
    assert main([*args, "--tracker", f"127.0.0.1:{free_port()}", "--key", KEY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("codl-tvm: error: tune: "), err
    assert "cannot reach the RPC tracker" in err[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.rpc
@pytest.mark.opencl
def test_compile_tune_through_the_tracker(tracker, cost_model_file, tmp_path, capsys):
    """``compile --tune --tracker --key``: the flagged operators measured on the remote device
    (the manifest says where, and what), planned on those measurements, the builds verified
    there too; the artifact checks out against its reference."""
    out = tmp_path / "art"
    args = ["compile", str(bundled_model_path()), "--preset", "pocl", "-o", str(out)]
    args += ["--cost-model", str(cost_model_file), "--build-cache", str(tmp_path / "cache")]
    assert main([*args, "--tune", "600", "--tracker", tracker, "--key", KEY]) == 0
    capsys.readouterr()
    manifest = json.loads((out / "manifest.json").read_text())
    tune = manifest["tune"]
    assert f"RPC {tracker}, key {KEY}" in tune["on"] and tune["device"]["remote"] is True
    assert tune["measured"] == tune["flagged"] > 0 and tune["measured_fresh"] == tune["measured"]
    assert f"RPC {tracker}, key {KEY}" in manifest["verify"]["on"]
    decisions = json.loads((out / "plan_report.json").read_text())["decisions"]
    measured = {d["ops"][0] for d in decisions if d["provenance"] == "measured"}
    assert measured == {o["name"] for o in tune["operators"]}
    assert main(["run", str(out)]) == 0
    assert "-> OK" in capsys.readouterr().out
