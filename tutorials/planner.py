"""
Plan a model's co-execution with a cost model
=============================================

codl-tvm's planner picks, for every convolution, pooling and matmul, whether to split it between
the GPU and the CPU, along output rows (``H``) or output channels (``OC``) and with which GPU
share, and which consecutive operators to run as a chain (CoDL sections 4.1 and 4.2). It reads
the model and a latency cost model; it never changes the model itself. This tutorial plans the
bundled CNN, reads the plan report, looks at the chains, runs the plan and compares it with the
single-processor runs, then lets the device decide between them (``--verify``, with a plan
refined from timelines as one more candidate).

.. note::

   The cost model is the one codl-tvm ships for an **emulated SoC** (PoCL on
   8 Xeon cores as the GPU, TVM's CPU kernels on 8 others; fitted on measurements from
   ``codl-tvm profile``, see the README), so predicted times describe that device pair, not the
   machine running this tutorial. For your device, profile it and fit a model with
   ``codl-tvm cost-model fit``, then pass it to the planner
   (``codl-tvm plan MODEL.onnx --cost-model M.json``).
"""

# %%
# A cost model
# ------------
# ``default_model_path`` finds the model shipped for a target preset; any model fitted with
# ``codl-tvm cost-model fit`` loads the same way.
import json
import tempfile
from pathlib import Path

import numpy as np

import codl_tvm
from codl_tvm.core.plan import PartitionPlan, partitionable_ops, uniform_plan
from codl_tvm.cost_model import load_model
from codl_tvm.cost_model.defaults import default_model_path
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.latency import compile_artifact
from codl_tvm.options import CompileOptions
from codl_tvm.planner import PlannerConfig, comparison_table, plan_all, plan_model
from codl_tvm.runtime.artifact import load_artifact

cost_model = load_model(default_model_path("emulated-soc"))
print(cost_model.kind, cost_model.meta.get("dataset"))
model = load_onnx(bundled_model_path())
print([op.name for op in partitionable_ops(model.mod)])

# %%
# Plan and read the report
# ------------------------
# Every row is one operator or one chain: the dimension and GPU ratio chosen, the predicted
# latency of running it whole on the CPU and on the GPU, the predicted co-execution latency
# (CoDL's Eq. 2, data-sharing costs included), and the reason. The summary compares the predicted
# total with the CPU-only and GPU-only predictions and with the ideal bound
# ``T* = 1 / (1/Tcpu + 1/Tgpu)``.
plan, report = plan_model(model.mod, cost_model, model_name="codl_small_cnn")
print(report.table())

# %%
# Which operators were chained, and why
# -------------------------------------
# A chain is computed by each processor from the chain's input to its output, recomputing the
# halo rows its filters need, so data is shared only at the chain's entry and exit. The planner
# keeps a chain when that saves more than the redundant halo computation costs: the gain is
# against the same operators planned one by one. Predicted chain gains are often a few percent,
# inside the cost model's error, and on the emulated SoC such chains ran slower than the same
# operators unchained; so a chain must be predicted to gain more than
# ``PlannerConfig.chain_min_gain`` (10%) of its one-by-one latency. The report's notes name every
# chain the margin turned down; ``PlannerConfig(chain_min_gain=0)`` is CoDL's Algorithm 1 as
# published.
for d in report.chains():
    print(f"{' -> '.join(d.ops)}: {d.dim} at {d.ratio:.1f}; {d.reason}")
for note in report.notes:
    if "chain_min_gain" in note:
        print("turned down:", note)

# %%
# The plan is an ordinary :class:`~codl_tvm.core.plan.PartitionPlan` (save it with ``plan.save``);
# the report saves as JSON.
print(plan.to_json(indent=None))
plan.validate(model.mod)

# %%
# Weights that stream from memory
# -------------------------------
# The profiler times each part alone and repeats it, so its weights stay cached; inside a model
# a batch-1 dense reads its weights from memory (on the emulated SoC its parts ran 1.6-2.9x
# slower than predicted, ``scripts/plan_vs_timeline.py``). ``PlannerConfig(weight_gbps=(cpu,
# gpu))`` (``--weight-gbps``) predicts no part faster than its weights' bytes over that rate.
# The rates here are made low enough to decide every split: an OC split then balances the two
# processors at the rates' ratio (GPU share 3/4), and each split records its predicted parts.
_, slow = plan_model(model.mod, cost_model, config=PlannerConfig(weight_gbps=(0.001, 0.003)))
for d in slow.decisions:
    if d.cpu_part_ms is not None:
        print(f"{d.ops[0]}: {d.dim} at {d.ratio:.1f}, parts {d.cpu_part_ms:.3f} / "
              f"{d.gpu_part_ms:.3f} ms (CPU / GPU)")  # fmt: skip

# %%
# Baselines
# ---------
# The same function plans the baselines: CPU only, GPU only, uLayer-like (an OC split of every
# operator with the ratio picked by a FLOPs-linear model), CoDL without chains, H only, OC only.
print(comparison_table(plan_all(model.mod, cost_model)))

# %%
# Run the plan and compare with the single-processor runs
# -------------------------------------------------------
# ``codl_tvm.compile`` builds the planned model on the local OpenCL device and the CPU. Its output
# equals the unpartitioned model's. Here the OpenCL "GPU" is a CPU OpenCL runtime on the same
# cores as the CPU part, so the latencies below show the machinery, not the imaginary device's
# speedup.
x = random_inputs(model, seed=0)["input"]
single = {
    "GPU only": plan_model(model.mod, cost_model, mode="gpu_only")[0],
    "CPU only": plan_model(model.mod, cost_model, mode="cpu_only")[0],
}
planned = codl_tvm.compile(model.mod, plan)
y = planned([x])[0]
reference = codl_tvm.compile(model.mod, PartitionPlan())([x])[0]
err = float(np.max(np.abs(y - reference)))
print(f"max abs difference to the unpartitioned model: {err:.3g}")
assert err < 1e-4
print(f"planned : {planned.time([x], number=3, repeat=1).median_ms:.2f} ms")
for name, p in single.items():
    built = codl_tvm.compile(model.mod, p)
    assert np.max(np.abs(built([x])[0] - reference)) < 1e-4
    print(f"{name:<8}: {built.time([x], number=3, repeat=1).median_ms:.2f} ms")

# %%
# Let the device decide: measuring, and ``--verify``
# --------------------------------------------------
# A cost model cannot see everything co-execution costs on a real device (contention for
# memory bandwidth, synchronisation waits, the kernels outside the plan), and gains of 10-20%
# are within its error. So ``codl-tvm compile MODEL.onnx -o OUT/`` builds the plan co-executed
# *and* for each processor alone, times the three on this machine (or on a board through
# ``--tracker``) round-robin and keeps the fastest: the artifact is never slower than one
# processor. ``--no-measure`` skips this (cross-compiling without a device), and the manifest
# then says the choice is unchecked. ``--verify N`` (``CompileOptions(verify=N)``) times N
# rounds and adds candidates, as below. The timings are in the artifact's manifest.
#
# The same timing calibrates the cost model: the model run on each processor alone is compared
# with its predicted latency, and where the two processors missed by different factors (the
# shipped model describes another machine, so they usually do) the plan is re-made with each
# processor's predictions scaled by its factor and timed as one more candidate,
# ``coexec:codl:calibrated``.
out = Path(tempfile.mkdtemp()) / "small_cnn"
options = CompileOptions(cost_model=default_model_path("emulated-soc"), verify=2)
compile_artifact(bundled_model_path(), out, options)
manifest = json.loads((out / "manifest.json").read_text())
verify = manifest["verify"]
print({k: f"{v:.2f} ms" for k, v in verify["median_ms"].items()}, "-> kept", verify["chosen"])
cal = manifest["plan"].get("calibration")
if cal:
    scales = f"CPU x{cal['cpu_scale']:.2f}, GPU x{cal['gpu_scale']:.2f}"
    print("calibration:", scales, "re-planned:", cal["candidates"] or "no new plan")
artifact = load_artifact(out)
inputs, expected = artifact.reference()
got = artifact([inputs[s.name] for s in artifact.model.inputs])
assert all(np.max(np.abs(g - e)) < 1e-4 for g, e in zip(got, expected))

# %%
# A candidate measured inside the model: ``--refine``
# ---------------------------------------------------
# ``--refine 1`` (``CompileOptions(refine=1)``) adds a candidate measured inside the model: the
# fastest co-executed build of the first timing is traced, each split's time on each processor
# is read off the timelines (every kernel carries the split it computes), and every split moves
# to the GPU share that balances them, as ``codl-tvm refine`` does. The result is built as
# ``coexec:refined`` and timed with the others, so it is kept only if it is the fastest. Here
# the start is a plan that splits every operator on H with 10% for the GPU.
lopsided = uniform_plan(model.mod, "H", 0.1)
out = Path(tempfile.mkdtemp()) / "small_cnn_refined"
options = CompileOptions(plan=lopsided, verify=1, refine=1, refine_traces=2)
compile_artifact(bundled_model_path(), out, options)
manifest = json.loads((out / "manifest.json").read_text())
for name, record in manifest["plan"]["refine"]["candidates"].items():
    moved = [
        f"{r['split']} {r['built_share']:.2f}->{r['new_ratio']:.2f}"
        for r in record["splits"]
        if "new_ratio" in r
    ]
    print(f"{name} (from {record['from']}):", ", ".join(moved))
print("kept", manifest["verify"]["chosen"])
artifact = load_artifact(out)
inputs, expected = artifact.reference()
got = artifact([inputs[s.name] for s in artifact.model.inputs])
assert all(np.max(np.abs(g - e)) < 1e-4 for g, e in zip(got, expected))
