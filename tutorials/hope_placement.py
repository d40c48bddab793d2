"""
Place an Inception module's branches on the GPU and the CPU at once (HOPE)
==========================================================================

CoDL splits each operator between the processors; where every split costs more in data sharing
than it gains, its planner keeps the whole model on one processor. Models with parallel branches
(Inception modules, residual shortcuts, SqueezeNet's expand convolutions) have another way to use
both: run whole branches on different processors at the same time. The placement modes plan
that on the model's operator graph, as HOPE does: ``hope`` solves the placement and the order on
each processor exactly (OR-Tools CP-SAT), ``hope_greedy`` is HOPE's greedy search, ``starpu`` and
``mosaic`` are the baselines HOPE compares with, and ``codl_hope`` lets each operator also be
split (CoDL's split as a third choice). ``auto`` plans with ``codl``, ``hope``, ``hope_greedy``
and ``codl_hope`` and keeps the lowest predicted latency.

This tutorial builds one Inception module, looks at its operator graph, compares the modes'
predicted latencies, builds the ``hope`` plan on the local OpenCL device, checks it against the
unpartitioned model and draws the timeline of one inference.

.. note::

   The cost model here is fitted on an imaginary device pair (``codl_tvm.cost_model.synthetic``:
   two equally fast processors whose data sharing is expensive), so the plan and its predicted
   times describe that pair. The local OpenCL "GPU" is a CPU OpenCL runtime on the same cores
   as the CPU part: the timeline shows the two lanes working, not the imaginary pair's speed.
   For a real device, fit a cost model on its measurements (``codl-tvm profile``, ``codl-tvm
   cost-model fit``) and compile with ``codl-tvm compile MODEL.onnx -o OUT/ --mode hope`` (or
   ``--mode auto``; ``--verify N`` times the plan against each processor alone).
"""

# %%
# An Inception module
# -------------------
# A stem convolution, then three branches that read its output: a 1x1 convolution, a 1x1 then a
# 3x3 convolution, and a 3x3 max-pool then a 1x1 convolution, concatenated along channels.
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import codl_tvm
from codl_tvm.core.plan import PartitionPlan
from codl_tvm.cost_model.synthetic import SyntheticDevice, synthetic_cost_model
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.planner.placement.graph import build_graph
from codl_tvm.planner.placement.hope import greedy_schedule
from codl_tvm.planner.placement.modes import make_plan
from codl_tvm.profiling.trace import trace_inference


def inception_module(c: int = 32, hw: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), name)

    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["s"], pads=[1, 1, 1, 1]),
        node("Relu", ["s"], ["sr"]),
        node("Conv", ["sr", "wa", "ba"], ["a"]),
        node("Relu", ["a"], ["ar"]),
        node("Conv", ["sr", "wb1", "bb1"], ["b1"]),
        node("Relu", ["b1"], ["b1r"]),
        node("Conv", ["b1r", "wb2", "bb2"], ["b2"], pads=[1, 1, 1, 1]),
        node("Relu", ["b2"], ["b2r"]),
        node("MaxPool", ["sr"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Conv", ["p", "wc", "bc"], ["cc"]),
        node("Relu", ["cc"], ["cr"]),
        node("Concat", ["ar", "b2r", "cr"], ["y"], axis=1),
    ]
    inits = [weight("w0", (c, 3, 3, 3)), weight("b0", (c,))]
    for name, k in (("a", 1), ("b1", 1), ("b2", 3), ("c", 1)):
        inits += [weight(f"w{name}", (c, c, k, k)), weight(f"b{name}", (c,))]
    graph = helper.make_graph(
        nodes,
        "inception_module",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3 * c, hw, hw])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


model = load_onnx(inception_module())
cost_model = synthetic_cost_model(SyntheticDevice(share_ms_per_mb=1.0, presync_ms=0.1))

# %%
# The operator graph
# ------------------
# One node per placeable operator, with its predicted latency on each processor (the cost
# model's whole-operator prediction); bias adds and ReLUs are merged into the convolution that
# produces their input (HOPE's super-ops). The concat is a *follow* node: it runs where all its
# producers ran, else on the home processor, as codl-tvm's placement pass puts it. Each edge
# carries the predicted cost of sharing its tensor when its ends land on different processors.
graph = build_graph(model.mod, cost_model)
for n in graph.nodes:
    kind = "follows its producers" if n.follows else f"CPU {n.cpu_ms:.3f} ms, GPU {n.gpu_ms:.3f} ms"
    print(f"{n.name:<16} {kind}")
for e in graph.edges:
    print(f"{e.src} -> {e.dst}: {e.nbytes / 1024:.0f} KiB, {e.transfer_ms:.3f} ms if moved")

# %%
# Compare the planner modes
# -------------------------
# Every mode returns a :class:`~codl_tvm.core.plan.PartitionPlan` and a report; a placement plan
# gives each operator ratio 1 (whole on the GPU) or 0 (whole on the CPU) and the order in which
# the host issues them. Here every split loses to its sharing cost, so ``codl`` keeps the model
# on one processor, while ``hope`` runs the branches side by side. The baselines find slower
# schedules than the exact one; so does HOPE's greedy search alone (``refine=False``), which maps
# the three branches' first operators to finish them earliest, blind to the 3x3 convolution
# behind one of them. ``hope_greedy`` adds an upward-rank lookahead and a local search to it
# and finds the exact schedule here.
modes = ("codl", "starpu", "mosaic", "hope_greedy", "hope", "codl_hope")
reports = {m: make_plan(model.mod, cost_model, m)[1] for m in modes}
s = reports["hope"].summary
print(f"CPU alone {s.cpu_only_ms:.3f} ms, GPU alone {s.gpu_only_ms:.3f} ms")
for m, r in reports.items():
    print(f"{m:<12} predicted {r.summary.predicted_ms:.3f} ms")
gs_alone = greedy_schedule(graph, refine=False)
print(f"GS alone     predicted {gs_alone.makespan_ms:.3f} ms")
assert reports["hope"].summary.predicted_ms < min(s.cpu_only_ms, s.gpu_only_ms)
assert reports["hope_greedy"].summary.predicted_ms <= 1.05 * s.predicted_ms

# %%
# ``auto`` plans with ``codl``, ``hope``, ``hope_greedy`` and ``codl_hope`` and keeps the plan
# with the lowest prediction (``codl`` on a tie); its report names every candidate's.
plan, report = make_plan(model.mod, cost_model, "auto")
print(report.table())
assert report.mode == "hope"

# %%
# Build and run it
# ----------------
# ``codl_tvm.compile`` builds the plan for the OpenCL device and the CPU. The build issues the
# operators in the schedule's order (GPU work first, so the GPU computes while the host runs the
# CPU's branch); the result equals the unpartitioned model's.
x = random_inputs(model, seed=0)["x"]
built = codl_tvm.compile(model.mod, plan)
y = built([x])[0]
reference = codl_tvm.compile(model.mod, PartitionPlan())([x])[0]
err = float(np.max(np.abs(y - reference)))
print(f"max abs difference to the unpartitioned model: {err:.3g}")
assert err < 1e-4

# %%
# The timeline
# ------------
# One inference traced: GPU kernels from OpenCL event timestamps, CPU kernels and the host's
# synchronisation waits from host timestamps. Each kernel is coloured by the operator it
# computes; the branches placed on the GPU and those on the CPU run in their own lanes, and
# ``overlap_us`` is the time both were busy at once.
trace = trace_inference(built, [x])
lanes: dict[str, set[str]] = {}
for e in trace.events:
    if e.split is not None and e.lane in ("GPU", "CPU"):
        lanes.setdefault(e.split, set()).add(e.lane)
ratio = {e.op: e.ratio for e in plan.ops}
for op in plan.order:
    planned = "GPU" if ratio[op] == 1.0 else "CPU"
    print(f"{op:<10} planned on {planned}, ran on {', '.join(sorted(lanes.get(op, ())))}")
out_dir = Path(tempfile.mkdtemp())
trace.save_png(out_dir / "hope_timeline.png", title="hope: an Inception module on GPU and CPU")
print(trace.summary())
print("timeline:", out_dir / "hope_timeline.png")
