"""The OpenCL runtime plugin: zero-copy SVM, copies, timers, threads, device selection, errors and
the program cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tvm

from codl_tvm import runtime

pytestmark = pytest.mark.opencl

SCALE_SRC = """
__kernel void scale_add(__global float* restrict y, __global const float* restrict x,
                        float a, int n) {
  int i = get_global_id(0);
  if (i < n) y[i] = a * x[i] + 1.0f;
}
"""
SCALE_FUNCS = {
    "scale_add": (["handle", "handle", "float32", "int32"], ["blockIdx.x", "threadIdx.x"])
}


def _scale_module():
    return runtime.opencl_module_from_source(SCALE_SRC, SCALE_FUNCS)


def _launch_scale(mod, y, x, a, n, block=64):
    grid = (n + block - 1) // block
    mod["scale_add"](y, x, a, n, grid, block)


def _cpu_double_func():
    from tvm import te

    a = te.placeholder((256,), "float32", name="a")
    b = te.compute((256,), lambda i: a[i] * 2.0 + 3.0, name="b")
    func = te.create_prim_func([a, b]).with_attr("global_symbol", "double")
    return tvm.compile(tvm.IRModule({"double": func}), target=tvm.target.Target({"kind": "llvm"}))


def test_info(opencl):
    assert opencl.devices, "no device selected"
    assert opencl.svm_mode in ("fine", "coarse", "buffer")
    assert runtime.svm_mode() == opencl.svm_mode
    dev = tvm.opencl(0)
    assert dev.exist
    assert dev.device_name == opencl.devices[0].name


def test_kernel_from_source_matches_numpy(opencl):
    n = 1000
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    dev = tvm.opencl(0)
    xd, yd = tvm.runtime.tensor(x, dev), tvm.runtime.empty((n,), "float32", dev)
    _launch_scale(_scale_module(), yd, xd, 2.5, n)
    np.testing.assert_allclose(yd.numpy(), 2.5 * x + 1.0, rtol=1e-6)


def test_zero_copy_cpu_kernel_reads_and_writes_opencl_tensors(opencl):
    if opencl.svm_mode != "fine":
        pytest.skip("zero-copy host access without map/unmap needs fine-grained SVM")
    dev = tvm.opencl(0)
    x = np.arange(256, dtype=np.float32)
    a = tvm.runtime.tensor(x, dev)
    b = tvm.runtime.empty((256,), "float32", dev)
    # A TVM CPU kernel runs directly on the OpenCL tensors' memory through CPU views.
    _cpu_double_func()["double"](runtime.cpu_view(a), runtime.cpu_view(b))
    np.testing.assert_array_equal(b.numpy(), 2 * x + 3)
    # numpy writes through DLPack land in the OpenCL tensor with no copy; a GPU kernel reads them.
    host_a = np.from_dlpack(runtime.cpu_view(a))
    host_a[:] = 7.0
    c = tvm.runtime.empty((256,), "float32", dev)
    _launch_scale(_scale_module(), c, a, 1.0, 256)
    np.testing.assert_array_equal(c.numpy(), np.full(256, 8.0, np.float32))
    # ... and the GPU kernel's output is visible to numpy through the view after a sync.
    dev.sync()
    np.testing.assert_array_equal(np.from_dlpack(runtime.cpu_view(c)), np.full(256, 8.0))
    assert (
        np.from_dlpack(runtime.cpu_view(c)).ctypes.data
        == np.from_dlpack(runtime.cpu_view(c)).ctypes.data
    )


def test_cpu_view_rejects_cpu_tensor(opencl):
    with pytest.raises(Exception, match="expects an OpenCL tensor"):
        runtime.cpu_view(tvm.runtime.tensor(np.zeros(4, np.float32)))


def test_copies_honour_byte_offsets(opencl):
    dev = tvm.opencl(0)
    base = tvm.runtime.tensor(np.zeros(64, np.float32), dev)
    # A view 16 floats in: host->device and device->host copies go to the right bytes.
    view = base._create_view((8,), "float32", relative_byte_offset=64)
    view.copyfrom(np.arange(8, dtype=np.float32) + 1)
    expect = np.zeros(64, np.float32)
    expect[16:24] = np.arange(8) + 1
    np.testing.assert_array_equal(base.numpy(), expect)
    np.testing.assert_array_equal(view.numpy(), np.arange(8) + 1)
    # device->device into an offset view
    other = tvm.runtime.tensor(np.full(64, -1.0, np.float32), dev)
    dst = other._create_view((8,), "float32", relative_byte_offset=128)
    view.copyto(dst)
    expect2 = np.full(64, -1.0, np.float32)
    expect2[32:40] = np.arange(8) + 1
    np.testing.assert_array_equal(other.numpy(), expect2)


def test_time_evaluator_and_kernel_records(opencl):
    n = 1 << 16
    dev = tvm.opencl(0)
    mod = _scale_module()
    x = tvm.runtime.tensor(np.ones(n, np.float32), dev)
    y = tvm.runtime.empty((n,), "float32", dev)
    timer = mod.time_evaluator("scale_add", dev, number=3, repeat=2)
    res = timer(y, x, 2.0, n, n // 64, 64)
    assert len(res.results) == 2 and all(t > 0 for t in res.results)
    with runtime.record_kernels() as events:
        for _ in range(3):
            _launch_scale(mod, y, x, 2.0, n)
    assert [e.name for e in events] == ["scale_add"] * 3
    assert all(e.end_ns >= e.start_ns >= e.queued_ns > 0 for e in events)
    np.testing.assert_array_equal(y.numpy(), np.full(n, 3.0, np.float32))


def test_kernels_from_many_threads(opencl):
    dev = tvm.opencl(0)
    mod = _scale_module()
    n = 4096
    errors = []

    def work(k: int) -> None:
        try:
            x = tvm.runtime.tensor(np.full(n, k, np.float32), dev)
            y = tvm.runtime.empty((n,), "float32", dev)
            for _ in range(20):
                _launch_scale(mod, y, x, 2.0, n)
            np.testing.assert_array_equal(y.numpy(), np.full(n, 2.0 * k + 1.0))
        except Exception as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_failed_build_shows_build_log(opencl):
    mod = runtime.opencl_module_from_source(
        "__kernel void broken(__global float* y) { y[0] = undefined_symbol; }",
        {"broken": (["handle"], ["blockIdx.x"])},
    )
    y = tvm.runtime.empty((4,), "float32", tvm.opencl(0))
    with pytest.raises(RuntimeError, match=r"clBuildProgram failed.*build log") as info:
        mod["broken"](y, 1)
    assert "undefined_symbol" in str(info.value)


def test_failed_launch_names_the_call(opencl):
    max_wg = opencl.devices[0].max_work_group_size
    dev = tvm.opencl(0)
    x = tvm.runtime.tensor(np.ones(4, np.float32), dev)
    y = tvm.runtime.empty((4,), "float32", dev)
    with pytest.raises(RuntimeError, match="clEnqueueNDRangeKernel failed"):
        _scale_module()["scale_add"](y, x, 1.0, 4, 1, max_wg * 2)


def test_corrupt_module_blob_is_a_clear_error(opencl):
    import tvm_ffi

    loader = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.opencl")
    with pytest.raises(ValueError, match="corrupt OpenCL module blob"):
        loader(b"\x02\x00\x00\x00\x00\x00\x00\x00cl\xff\xff\xff\xff\xff\xff\xff\x7f")


def test_unknown_device_index_is_a_clear_error(opencl):
    n = len(opencl.devices)
    with pytest.raises(Exception, match=rf"opencl\({n}\) does not exist"):
        tvm.runtime.empty((4,), "float32", tvm.opencl(n))


# -- separate processes: selection happens once per process ------------------------------------


def _python(code: str, env: dict[str, str] | None = None, timeout: int = 240):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


RUN_SCALE = """
import json, numpy as np, tvm
from codl_tvm import runtime
from tests.test_runtime import _launch_scale, _scale_module
runtime.load()
dev = tvm.opencl(0)
x = tvm.runtime.tensor(np.arange(100, dtype=np.float32), dev)
y = tvm.runtime.empty((100,), "float32", dev)
_launch_scale(_scale_module(), y, x, 3.0, 100)
ok = bool(np.array_equal(y.numpy(), 3.0 * np.arange(100, dtype=np.float32) + 1.0))
print(json.dumps({"ok": ok, "svm": runtime.svm_mode(), "stats": runtime.cache_stats(),
                  "platform": runtime.info().platform}))
"""


def _run_scale(env: dict[str, str]) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    env = {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
    proc = _python(RUN_SCALE, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_program_cache_skips_the_compiler_on_second_start(opencl, tmp_path):
    env = {"CODL_TVM_CACHE_DIR": str(tmp_path)}
    first = _run_scale(env)
    assert first["ok"]
    assert first["stats"]["source_builds"] >= 1 and first["stats"]["disk_writes"] >= 1
    second = _run_scale(env)
    assert second["ok"]
    assert second["stats"]["source_builds"] == 0 and second["stats"]["disk_hits"] >= 1
    # A corrupt cached binary is rebuilt from source, not trusted.
    for f in (tmp_path / "opencl-programs").glob("*.bin"):
        f.write_bytes(b"not a program binary")
    third = _run_scale(env)
    assert third["ok"]
    assert third["stats"]["source_builds"] >= 1 and third["stats"]["disk_errors"] >= 1


@pytest.mark.parametrize("mode", ["coarse", "buffer"])
def test_fallback_allocation_modes(opencl, tmp_path, mode):
    modes = ["fine", "coarse", "buffer"]
    if modes.index(mode) < modes.index(opencl.svm_mode):
        pytest.skip(f"device supports only {opencl.svm_mode}")
    out = _run_scale({"CODL_OPENCL_SVM": mode, "CODL_TVM_CACHE_DIR": str(tmp_path)})
    assert out["ok"] and out["svm"] == mode


def test_platform_selection_by_environment(opencl, tmp_path):
    word = opencl.platform.split()[0]
    out = _run_scale({"CODL_OPENCL_PLATFORM": word.lower(), "CODL_TVM_CACHE_DIR": str(tmp_path)})
    assert out["ok"] and out["platform"] == opencl.platform
    proc = _python(
        "from codl_tvm import runtime; runtime.load(platform='no-such-platform'); runtime.info()"
    )
    assert proc.returncode != 0
    assert "No usable OpenCL platform matches 'no-such-platform'" in proc.stderr
    assert opencl.platform in proc.stderr  # the message lists what exists


def test_device_index_out_of_range_by_environment(opencl):
    proc = _python(
        "from codl_tvm import runtime; runtime.load(); runtime.info()", {"CODL_OPENCL_DEVICE": "17"}
    )
    assert proc.returncode != 0
    assert "OpenCL device index 17 does not exist" in proc.stderr


def test_no_platform_is_one_clear_message(tmp_path):
    empty = tmp_path / "vendors"
    empty.mkdir()
    proc = _python(
        "from codl_tvm import runtime; runtime.load(); runtime.info()",
        {"OCL_ICD_VENDORS": str(empty), "PYOPENCL_HOME": str(tmp_path)},
    )
    assert proc.returncode != 0
    assert "No OpenCL platform found" in proc.stderr
    assert proc.stderr.count("Traceback") <= 1
