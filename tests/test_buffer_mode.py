"""Devices without SVM: the plugin's buffer mode (host-mapped ``ALLOC_HOST_PTR`` buffers).

The local device has SVM, so ``CODL_OPENCL_SVM=buffer`` forces the fallback. The mode is chosen
once, when the plugin initialises, so each test runs in its own process. Co-execution there maps
buffers for the CPU's kernels, gives byte-offset views to GPU kernels as sub-buffers (a
temporary copy where the offset is not aligned for one) and syncs with events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.opencl

REPO = Path(__file__).resolve().parent.parent


def _run_in_buffer_mode(code: str, tmp_path: Path, *args: str) -> dict:
    """Run ``code`` (Python, or ``args`` after ``-m`` when ``code`` is empty) in a process
    whose OpenCL runtime runs in buffer mode; return the JSON of its last stdout line."""
    env = {
        **os.environ,
        "CODL_OPENCL_SVM": "buffer",
        "CODL_TVM_CACHE_DIR": str(tmp_path),
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1] if code else proc.stdout)


COEXEC = """
import json
import numpy as np
import onnxruntime as ort
import codl_tvm
from codl_tvm import runtime
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.runtime import sync as coexec
from tests.test_rpc_aarch64_opencl import PLAN, _chain_model

proto = _chain_model()  # an H split, an OC split and one chain of two convs
model = load_onnx(proto)
feeds = random_inputs(model, seed=3)
want = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
got = codl_tvm.compile(model.mod, PLAN)([feeds[s.name] for s in model.inputs])
errs = [
    float(np.max(np.abs(g - w))) / max(1.0, float(np.max(np.abs(w))))
    for g, w in zip(got, want)
]
print(json.dumps({"svm": runtime.svm_mode(), "sync": coexec.sync_mode(),
                  "stats": runtime.buffer_stats(), "rel_errs": errs}))
"""


def test_coexec_chain_matches_onnxruntime_in_buffer_mode(opencl, tmp_path):
    pytest.importorskip("onnxruntime")
    out = _run_in_buffer_mode(COEXEC, tmp_path)
    assert out["svm"] == "buffer"
    # polling a flag needs fine-grained SVM atomics: buffers sync on marker events
    assert out["sync"] == "event"
    # the CPU parts ran on host mappings of the GPU's buffers
    assert out["stats"]["host_maps"] > 0
    assert out["rel_errs"] and max(out["rel_errs"]) <= 1e-4, out["rel_errs"]


VIEWS = """
import json
import numpy as np
import tvm
from codl_tvm import runtime
from tests.test_runtime import _cpu_double_func, _launch_scale, _scale_module

dev = tvm.opencl(0)
mod = _scale_module()
xs = np.arange(2048, dtype=np.float32)
x = tvm.runtime.tensor(xs, dev)
y = tvm.runtime.tensor(np.zeros(2048, np.float32), dev)
checks = {}
# 3 floats in: no device aligns a sub-buffer to 12 bytes, so the view runs on a temporary copy;
# 4096 bytes in is aligned on every device (CL_DEVICE_MEM_BASE_ADDR_ALIGN is at most 4096 bits)
yv = y._create_view((100,), "float32", relative_byte_offset=12)
xv = x._create_view((100,), "float32", relative_byte_offset=4096)
_launch_scale(mod, yv, xv, 3.0, 100)
want = np.zeros(2048, np.float32)
want[3:103] = 3 * xs[1024:1124] + 1
checks["unaligned_out_aligned_in"] = bool(np.array_equal(y.numpy(), want))
checks["after_first"] = runtime.buffer_stats()
# the same aligned view again reuses its sub-buffer; one unaligned view as input and output
_launch_scale(mod, yv, yv, 2.0, 100)
_launch_scale(mod, y._create_view((8,), "float32", relative_byte_offset=4096), xv, 1.0, 8)
want[3:103] = 2 * want[3:103] + 1
want[1024:1032] = xs[1024:1032] + 1
checks["in_place_and_cached"] = bool(np.array_equal(y.numpy(), want))
checks["after_second"] = runtime.buffer_stats()
# a CPU kernel and numpy work on host mappings; a GPU kernel then reads what they wrote
a = tvm.runtime.tensor(xs[:256], dev)
b = tvm.runtime.empty((256,), "float32", dev)
_cpu_double_func()["double"](runtime.cpu_view(a), runtime.cpu_view(b))
checks["cpu_kernel"] = bool(np.array_equal(b.numpy(), 2 * xs[:256] + 3))
np.from_dlpack(runtime.cpu_view(a))[:] = 7.0
c = tvm.runtime.empty((256,), "float32", dev)
_launch_scale(mod, c, a, 1.0, 256)
checks["gpu_reads_host_writes"] = bool(np.array_equal(c.numpy(), np.full(256, 8.0, np.float32)))
dev.sync()
checks["host_reads_gpu_writes"] = bool(np.all(np.from_dlpack(runtime.cpu_view(c)) == 8.0))
checks["maps"] = runtime.buffer_stats()["host_maps"]
# svm_map / svm_unmap (the profiler's map and unmap costs) map and unmap buffers too
runtime.svm_map(c)
runtime.svm_map(c)  # already mapped: no second mapping
runtime.svm_unmap(c)
runtime.svm_map(c)
checks["explicit_maps"] = runtime.buffer_stats()["host_maps"] - checks["maps"]
print(json.dumps(checks))
"""


def test_views_at_unaligned_offsets_and_cpu_views_in_buffer_mode(opencl, tmp_path):
    out = _run_in_buffer_mode(VIEWS, tmp_path)
    assert out["unaligned_out_aligned_in"]
    assert out["after_first"] == {"host_maps": 0, "sub_buffers": 1, "staged_views": 1}
    assert out["in_place_and_cached"]
    # the 8-float view at 4096 is a second sub-buffer; the in-place view was staged once
    assert out["after_second"] == {"host_maps": 0, "sub_buffers": 2, "staged_views": 2}
    assert out["cpu_kernel"] and out["gpu_reads_host_writes"] and out["host_reads_gpu_writes"]
    # a, b, then a again (its mapping ended at the GPU kernel's launch), then c
    assert out["maps"] == 4
    assert out["explicit_maps"] == 1  # c was still mapped by its view: unmap, map again


def test_info_says_buffer_mode(opencl, tmp_path):
    out = _run_in_buffer_mode("", tmp_path, "-m", "codl_tvm.cli", "info", "--json")
    assert out["svm_mode"] == "buffer"
    assert out["memory"] == "buffer (host-mapped, no SVM)"
