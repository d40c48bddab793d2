"""
Deploy a model to a device behind a TVM RPC tracker
===================================================

Phones and boards are reached through TVM's RPC stack: a *tracker* on the workstation keeps a
queue of devices, each device runs an *RPC server* registered with the tracker under a *key*
("android", "rk3588", ...), and a client asks the tracker for a free device of a key, uploads a
compiled library and runs it there.

This tutorial walks through that path with codl-tvm:

1. start a tracker and an RPC server,
2. compile an ONNX model for the device's target preset,
3. upload, run it remotely and compare the outputs with the host,
4. measure the remote latency with ``time_evaluator``,
5. co-execute it on an aarch64 device's OpenCL GPU and CPU (the emulated aarch64 OpenCL device
   by default, a real board or phone by naming its tracker key),
6. spread jobs over every device of a key (a device farm), as the profiler does.

With ``local_demo = True`` (the default, used in CI) the tracker and the server run on this
machine and the "device" is its own CPU. Set ``local_demo = False`` and the environment variables
``CODL_TVM_TRACKER`` (``HOST:PORT``), ``CODL_TVM_KEY`` and ``CODL_TVM_TARGET`` to use a real
device.
"""

# %%
# Setup
# -----
# On the workstation, a tracker is one command::
#
#   python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190
#
# On a Linux board (or an x86 machine), codl-tvm's server is TVM's RPC server plus a function
# reporting its TVM version and machine, so the client can check them before uploading::
#
#   codl-tvm serve --tracker WORKSTATION:9190 --key rk3588 --host 0.0.0.0
#
# Add ``--opencl`` to load codl-tvm's OpenCL runtime plugin into the server (TVM's PyPI wheel has
# no OpenCL runtime of its own). On an Android phone, TVM's Android RPC app registers with the
# tracker the same way; it does not report its version, so codl-tvm warns and continues.
#
# Without a device, ``scripts/emulated_aarch64.py serve --tracker 127.0.0.1:9190`` starts an
# aarch64 Python with TVM's aarch64 wheel under qemu-user and registers it as ``aarch64-emu``;
# with ``--opencl`` (as root) it adds Debian's arm64 PoCL as the "GPU" and codl-tvm's plugin
# cross-built for aarch64 (``codl-tvm build-runtime --target linux-arm64``).

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

from codl_tvm.build import targets
from codl_tvm.core.plan import ChainPlan, OpPartition, PartitionPlan
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives import deploy
from codl_tvm.objectives.deploy import DeployOptions
from codl_tvm.rpc import client as rpc_utils
from codl_tvm.rpc.farm import DeviceFarm

local_demo = True
# codl-tvm logs its progress (connecting, checking versions, compiling, uploading) through
# ``logging``; show it here as plain lines
logging.basicConfig(level=logging.INFO, format="%(message)s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


started: list[subprocess.Popen] = []
if local_demo:
    port = free_port()
    tracker = f"127.0.0.1:{port}"
    key = "local-cpu"
    target = "host"
    started.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tvm.exec.rpc_tracker",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--port-end",
                str(port + 1),
                "--silent",
            ],
            start_new_session=True,
        )
    )
    # the server retries the tracker until it is up; wait_for_devices waits for both
    server_port = free_port()
    started.append(
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "codl_tvm.cli",
                "serve",  # codl-tvm serve
                "--tracker",
                tracker,
                "--key",
                key,
                "--port",
                str(server_port),
                "--port-end",
                str(server_port + 1),
                "--silent",
                "--opencl",  # load the OpenCL plugin: --device opencl/coexec need it
            ],
            start_new_session=True,
        )
    )
else:
    tracker = os.environ["CODL_TVM_TRACKER"]
    key = os.environ["CODL_TVM_KEY"]
    target = os.environ.get("CODL_TVM_TARGET")  # None: chosen from what the device reports

rpc_utils.wait_for_devices(tracker, key, count=1, timeout_s=90)
summary = rpc_utils.tracker_summary(tracker)
print("tracker queue:", summary["queue_info"])

# %%
# Target presets
# --------------
# A preset names the TVM target of one kind of device (JSON-dict targets, as TVM 0.27 wants).
# Cross presets are linked with the Android NDK when ``TVM_NDK_CC`` is set, else with
# clang + lld (``-nostdlib``: the device's TVM runtime resolves every symbol when it loads the
# library, so no aarch64 sysroot is needed on the workstation).

for preset in targets.PRESETS.values():
    print(f"{preset.name:18s} link: {targets.link_method(preset):5s} {preset.description}")

# %%
# Deploy and compare
# ------------------
# :func:`codl_tvm.objectives.deploy.deploy`, its settings in one
# :class:`~codl_tvm.objectives.deploy.DeployOptions`, requests a device (failing after
# ``request_timeout_s`` if the tracker does not answer or no device is free), checks the remote
# TVM version, compiles, uploads, runs, and compares with a build for this machine's CPU. The
# command line does the same::
#
#   codl-tvm deploy model.onnx --tracker HOST:PORT --key KEY --target android-arm64
#
# (``codl-tvm deploy --list-targets`` lists the presets.)

model = load_onnx(bundled_model_path())
inputs = random_inputs(model, seed=0)
result = deploy.deploy(
    model,
    DeployOptions(tracker, key, target=target, number=3, repeat=3, request_timeout_s=30),
    inputs,
)
print(f"ran on {result.device} ({result.preset}); remote reports {result.remote_versions}")
print(f"max abs difference against the host: {result.max_abs_error:.3g}, matches: {result.matches}")
print(f"remote latency: median {result.run.median_ms:.3f} ms over {result.run.repeats} repeats")

# %%
# Co-execution on the device
# --------------------------
# ``device="coexec"`` builds the model so that every partitionable operator runs partly on the
# device's OpenCL GPU and partly on its CPU (here a uniform plan: half of the output channels on
# each; ``plan=`` takes a :class:`~codl_tvm.core.plan.PartitionPlan` or its JSON file). The plugin
# is not inside the uploaded library: the RPC server loaded it at start-up (``codl-tvm serve
# --opencl``), and every model uploaded later uses it. The outputs are compared with the host's
# unpartitioned build::
#
#   codl-tvm deploy model.onnx --tracker HOST:PORT --key KEY --device coexec --dim OC --ratio 0.5

if (result.remote_versions or {}).get("opencl") == "1":
    rpc_utils.wait_for_devices(tracker, key, count=1, timeout_s=30)
    coexec = deploy.deploy(
        model,
        DeployOptions(
            tracker,
            key,
            target="pocl" if local_demo else os.environ.get("CODL_TVM_GPU_TARGET"),
            device="coexec",
            dim="OC",
            ratio=0.5,
            number=3,
            repeat=3,
            request_timeout_s=30,
        ),
        inputs,
    )
    print(f"co-executed on {coexec.device}: max abs difference {coexec.max_abs_error:.3g}")
    print(f"co-executed latency: median {coexec.run.median_ms:.3f} ms")
    assert coexec.matches, coexec.max_abs_error
else:
    print(
        "the device has no usable OpenCL plugin:",
        (result.remote_versions or {}).get("opencl_error"),
    )

# %%
# Co-execution on an aarch64 device
# ---------------------------------
# The same call reaches an aarch64 board or phone: name its key in ``CODL_TVM_AARCH64_KEY`` (its
# server runs ``codl-tvm serve --opencl``, see docs/boards.md). Without one, the emulated aarch64
# OpenCL device is used where its root is prepared (``sudo python scripts/emulated_aarch64.py
# prepare --opencl``, cached in ``~/.cache``). A server that has no plugin gets one uploaded:
# cross-built for the device and checked (machine, TVM version, sources) before anything is sent.
# The plan mixes an H split, an OC split and one chain; the target preset follows what the device
# reports (``linux-arm64-pocl`` for the emulated one). Latencies measured under qemu are labelled as
# emulated: they say nothing about hardware.

repo = Path(__file__).resolve().parent.parent
emulator = repo / "scripts" / "emulated_aarch64.py"
aarch64_key = os.environ.get("CODL_TVM_AARCH64_KEY")
emulated_port = None
if aarch64_key is None and local_demo:
    cache = Path(os.environ.get("CODL_TVM_CACHE_DIR", Path.home() / ".cache" / "codl-tvm"))
    stamp = cache / "aarch64-emu" / "sysroot" / ".codl-tvm-ready.json"
    ready = stamp.is_file() and json.loads(stamp.read_text()).get("opencl")
    if ready and os.geteuid() == 0:
        emulated_port, aarch64_key = free_port(), "aarch64-emu-cl"
        subprocess.run(
            [sys.executable, str(emulator), "serve", "--opencl", "--tracker", tracker,
             "--key", aarch64_key, "--port", str(emulated_port)],
            check=True,
            timeout=900,
        )  # fmt: skip

if aarch64_key:
    plan = PartitionPlan(
        ops=(OpPartition("conv2d_0", "H", 0.5), OpPartition("conv2d_1", "OC", 0.5)),
        chains=(ChainPlan(("conv2d_4", "conv2d_5"), "H", 0.5),),
    )
    arm_options = DeployOptions(
        tracker, aarch64_key, device="coexec", plan=plan, number=1, repeat=1,
        request_timeout_s=120,
    )  # fmt: skip
    arm = deploy.deploy(model, arm_options, inputs)
    where = arm.remote_versions or {}
    label = f" [emulated: {where['emulated']}]" if "emulated" in where else ""
    print(f"co-executed on {arm.device} ({arm.preset}, {where.get('opencl_device')})")
    print(f"max abs difference against the host: {arm.max_abs_error:.3g}, matches: {arm.matches}")
    print(f"latency: median {arm.run.median_ms:.3f} ms{label}")
    assert arm.matches, arm.max_abs_error
else:
    print(
        "no aarch64 device: set CODL_TVM_AARCH64_KEY to a board's key, or prepare the emulated "
        "one with `sudo python scripts/emulated_aarch64.py prepare --opencl`"
    )

# %%
# A device farm
# -------------
# :class:`codl_tvm.rpc.farm.DeviceFarm` takes every free device of a key and runs jobs on them in
# parallel threads, with a per-job timeout and retries (a job whose device fails is retried on
# another, and the failed device leaves the farm). A job receives a connected
# :class:`~codl_tvm.rpc.client.RemoteDevice`. The profiler measures operators this way::
#
#   codl-tvm profile --sample 20 --rpc HOST:PORT --rpc-key KEY --farm -o data/soc.jsonl

library = deploy.compile_for(model.mod, result.preset)
batches = [[random_inputs(model, seed=s)["input"]] for s in range(3)]


def make_job(x):
    return lambda remote: deploy.run_remote(remote, library, x, repeat=0).outputs[0]


rpc_utils.wait_for_devices(tracker, key, count=1, timeout_s=30)
with DeviceFarm(tracker, key, request_timeout_s=30) as farm:
    print("farm devices:", [d.name for d in farm.devices])
    jobs = farm.run([make_job(x) for x in batches], job_timeout_s=120, retries=1)
for job in jobs:
    print(
        f"job {job.index} on {job.device}: ok={job.ok}, "
        f"top class {int(np.argmax(job.value)) if job.ok else None}"
    )

# %%
# Clean up
# --------
# Each process was started in its own session; ending the group also ends TVM's worker
# processes under it.
if emulated_port is not None:
    subprocess.run(
        [sys.executable, str(emulator), "stop", "--port", str(emulated_port)], timeout=60
    )
for proc in reversed(started):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
