"""Gates: GPU work held on the device until the CPU signals (``codl.coexec.gpu_gate`` /
``cpu_signal``), on every CPU OpenCL platform installed here (PoCL and Intel's), each in a
process of its own (a process uses one platform)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.opencl

# Runs in a child process with CODL_OPENCL_PLATFORM set: a kernel y = 2x + 1 enqueued behind a
# gate must leave y untouched until the signal, and be done (and right) after it.
_CHILD = textwrap.dedent(
    """
    import json, time
    import numpy as np
    import tvm
    from codl_tvm import runtime
    from codl_tvm.runtime import sync

    runtime.load()
    src = '''
    __kernel void scale_add(__global float* restrict y, __global const float* restrict x,
                            float a, int n) {
      int i = get_global_id(0);
      if (i < n) y[i] = a * x[i] + 1.0f;
    }
    '''
    mod = runtime.opencl_module_from_source(
        src, {"scale_add": (["handle", "handle", "float32", "int32"],
                            ["blockIdx.x", "threadIdx.x"])})
    n = 4096
    dev = tvm.opencl(0)
    x = tvm.runtime.tensor(np.arange(n, dtype="float32"), dev)
    y = tvm.runtime.tensor(np.zeros(n, dtype="float32"), dev)
    out = {"platform": runtime.info().platform, "supported": sync.gates_supported(),
           "reason": sync.gates_unsupported_reason()}
    if out["supported"]:
        mod["scale_add"](y, x, 0.0, n, n // 64, 64)  # warm: the program is built before the gate
        dev.sync()
        np.copyto(np.from_dlpack(runtime.cpu_view(y)), 0.0)
        gate = sync.gpu_gate()
        mod["scale_add"](y, x, 2.0, n, n // 64, 64)
        mark = sync.gpu_mark()
        time.sleep(0.2)  # ample time for a device that ignored the gate to run the kernel
        out["before_signal"] = float(np.abs(np.from_dlpack(runtime.cpu_view(y))).max())
        sync.cpu_signal(gate)
        sync.cpu_wait(mark)
        want = 2.0 * np.arange(n, dtype="float32") + 1.0
        out["after_signal_err"] = float(np.abs(np.from_dlpack(runtime.cpu_view(y)) - want).max())
        try:
            sync.cpu_signal(gate)
        except Exception as exc:  # a gate is signalled once
            out["second_signal"] = str(exc).splitlines()[0]
    print("RESULT " + json.dumps(out))
    """
)


def _platforms() -> list[str]:
    return ["pocl", "intel"]


def _run(platform: str) -> dict | None:
    env = {**os.environ, "CODL_OPENCL_PLATFORM": platform}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        if "no OpenCL platform" in proc.stderr or "not found" in proc.stderr:
            return None
        raise AssertionError(f"{platform}: child failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.parametrize("platform", _platforms())
def test_gpu_work_behind_a_gate_waits_for_the_cpu_signal(opencl, platform):
    out = _run(platform)
    if out is None:
        pytest.skip(f"no {platform} OpenCL platform here")
    assert platform in out["platform"].lower() or platform == "pocl", out
    # both CPU OpenCL platforms here have fine-grained SVM and user events
    assert out["supported"], out["reason"]
    assert out["reason"] == ""
    assert out["before_signal"] == 0.0, "the kernel behind the gate ran before the signal"
    assert out["after_signal_err"] == 0.0
    assert "already-signalled co-execution gate" in out["second_signal"]


def test_finish_sync_mode_refuses_gates_and_says_why(opencl):
    """clFinish would wait for GPU work behind a gate: in that mode the device cannot gate,
    and the gate itself raises instead of deadlocking."""
    from codl_tvm.runtime import sync

    before = sync.sync_mode()
    sync.set_sync_mode("finish")
    try:
        assert not sync.gates_supported()
        assert "finish" in sync.gates_unsupported_reason()
        with pytest.raises(Exception, match="cannot hold GPU work for the CPU"):
            sync.gpu_gate()
    finally:
        sync.set_sync_mode(before)
    assert sync.gates_supported() == (sync.gates_unsupported_reason() == "")
