"""
Co-execute an ONNX model on the GPU and the CPU
===============================================

This tutorial imports an ONNX model, adds codl-tvm's passes to a TVM build, runs the model with
every convolution and pooling split between the OpenCL device and the CPU, compares the result
with the unpartitioned model, and looks at the timeline of one inference.

It runs on the local OpenCL device (a CPU OpenCL runtime installed from PyPI), so the two
"processors" share the same cores here: the numbers show that the machinery works, not a speedup.
On a phone (or the emulated SoC of the benchmarks) the GPU part and the CPU part run on
different hardware.
"""

# %%
# Import the model
# ----------------
# codl-tvm ships a small CNN (3x3, strided, depthwise and 1x1 convolutions, batch-norm, a residual
# add, max and average pooling, a classifier). Any ONNX model with static shapes works the same.
import numpy as np
import tvm

import codl_tvm
from codl_tvm import runtime
from codl_tvm.core.plan import (
    ChainPlan,
    OpPartition,
    PartitionPlan,
    partitionable_ops,
    uniform_plan,
)
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path

model = load_onnx(bundled_model_path())
print([op.name for op in partitionable_ops(model.mod)])

# %%
# Choose a partition plan
# -----------------------
# A :class:`~codl_tvm.core.plan.PartitionPlan` names, for every operator or chain of operators, the
# dimension it is split along (output rows ``H`` or output channels ``OC``) and the GPU's share
# of the output. A chain is computed by each processor from its own rows from start to end,
# recomputing the halo rows its filters need (CoDL's operator chain), so data is shared only at
# the chain's entry and exit.
plan = PartitionPlan(
    ops=(OpPartition("conv2d_2", "OC", 0.5),),
    chains=(
        ChainPlan(("conv2d_0", "conv2d_1"), "H", 0.5),
        ChainPlan(("max_pool2d_3", "conv2d_4", "conv2d_5", "conv2d_6", "avg_pool2d_7"), "H", 0.6),
    ),
)
print(plan.to_json(indent=None))

# %%
# Add the codl passes to a TVM build
# ----------------------------------
# The co-execution pipeline is an ordinary Relax pipeline: it splits the operators, places every
# kernel on its processor (OpenCL for the GPU, LLVM for the CPU), makes the parts write disjoint
# regions of one shared tensor, and inserts the synchronisation. ``tvm.compile`` does the rest.
from codl_tvm.build.pipeline import coexec_pipeline  # noqa: E402

gpu = tvm.target.Target({"kind": "opencl"}, host={"kind": "llvm"})
cpu = tvm.target.Target({"kind": "llvm"})
ex = tvm.compile(model.mod, target=gpu, relax_pipeline=coexec_pipeline(plan, gpu, cpu))

# %%
# The VM runs the library on two devices: the OpenCL device (shared tensors live there, in
# shared virtual memory) and the CPU. The codl-tvm runtime plugin provides OpenCL to TVM's wheel.
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from tvm.runtime.vm import VirtualMachine  # noqa: E402

runtime.load()
print(runtime.info().platform, runtime.info().svm_mode)
lib_path = Path(tempfile.mkdtemp()) / "coexec.so"
ex.export_library(str(lib_path))
vm = VirtualMachine(tvm.runtime.load_module(str(lib_path)), [tvm.opencl(0), tvm.cpu(0)])

x = random_inputs(model, seed=0)["input"]
y = vm["main"](tvm.runtime.tensor(x, tvm.opencl(0))).numpy()

# %%
# Compare with the unpartitioned model
# ------------------------------------
from codl_tvm.build.runner import build  # noqa: E402

reference = build(model.mod, "cpu")([x])[0]
err = float(np.max(np.abs(y - reference)))
print(f"max abs difference: {err:.3g}")
assert err < 1e-4

# %%
# The same in one call
# --------------------
# ``codl_tvm.compile`` wraps the steps above; a uniform plan splits every operator alike.
built = codl_tvm.compile(model.mod, uniform_plan(model.mod, "OC", 0.3))
print(np.max(np.abs(built([x])[0] - reference)))
for row in built.placements[:3]:
    print(row)

# %%
# Look at the trace
# -----------------
# Each GPU kernel comes from OpenCL event timestamps, each CPU kernel and synchronisation wait
# from host timestamps, on one time base. Open the JSON in chrome://tracing or Perfetto.
from codl_tvm.profiling.trace import trace_inference  # noqa: E402
from codl_tvm.runtime import sync  # noqa: E402

print("sync mechanism:", sync.sync_mode())
trace = trace_inference(built, [x])
out_dir = Path(tempfile.mkdtemp(prefix="codl-quickstart-"))
trace.save_chrome(out_dir / "trace.json")
trace.save_png(out_dir / "trace.png")
print(trace.summary())
print("trace:", out_dir / "trace.json", "and its timeline", out_dir / "trace.png")
