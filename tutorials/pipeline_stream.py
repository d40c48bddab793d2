"""
Stream frames through a three-stage pipeline
============================================

For a camera or a video what counts is frames per second. Pipe-it's answer: cut the model into
contiguous stages, run each stage on its own processors, and keep several frames in flight, so
that while the last stage finishes frame ``i`` the first one already works on frame ``i + 2``.

This tutorial measures every layer of a small CNN on three processor groups, searches the
stages, builds each stage for its group (a "big" CPU core with the host's full instruction set, a
"little" core with kernels for a narrower one, and the OpenCL device), streams frames through
the pipeline, checks the outputs against the unpartitioned model and draws the timeline.

Here the groups are cores of one machine (and the OpenCL device is a CPU runtime on the same
cores), so the numbers show the machinery, not a phone's speed-up: on a phone the groups are its
big and little clusters and its GPU (``--groups`` of ``codl-tvm compile --objective
throughput``), and ``scripts/bench_pipeline.py`` measures the emulated clusters of the benchmark
machine.
"""

# %%
# The model and its layers
# ------------------------
# A Pipe-it layer is a major operator (a convolution or a matrix product) with the operators
# after it up to the next one, so its bias, activation and pooling stay with it. A pipeline cuts
# only between layers.
import os
import tempfile

import numpy as np

from codl_tvm import runtime
from codl_tvm.build.runner import build
from codl_tvm.frontend.importer import load_onnx, random_inputs
from codl_tvm.frontend.models import bundled_model_path
from codl_tvm.objectives.stage_build import build_pipeline, layer_shapes
from codl_tvm.planner.stages.search import (
    PipelinePlan,
    PipelineStage,
    ProcessorGroup,
    recost_plan,
    search_pipeline,
)
from codl_tvm.profiling.layers import profile_layers
from codl_tvm.runtime.staged_artifact import load_pipeline

model = load_onnx(bundled_model_path())
shapes = layer_shapes(model.mod)
for s in shapes:
    print(
        f"{s.name:>12} {s.layer_type:<17} N={s.out_pixels:<5} K={s.filter_size:<4} M={s.out_maps}"
    )

# %%
# Processor groups
# ----------------
# A CPU group is a set of cores with its own thread pool and instruction set: ``big`` gets the
# host's (AVX-512 where the CPU has it), ``little`` x86-64-v2 (SSE4.2, no AVX) on x86-64. The
# ``gpu`` group is the OpenCL device. Two cores are enough (CI has two); with one, there is no
# little core and the pipeline has two stages.
runtime.load()
cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
groups = [ProcessorGroup("big", "cpu", (cores[0],)), ProcessorGroup("gpu", "gpu", ())]
if len(cores) > 1:
    groups.append(ProcessorGroup("little", "cpu", (cores[1],)))

# %%
# Measure the time matrix and search
# ----------------------------------
# :func:`~codl_tvm.profiling.layers.profile_layers` times every layer on every (group, core count)
# (Pipe-it's time matrix), here while the other group's cores run the model's layers
# (``under_load``), as the other stages of a stream keep them busy: stages share caches and
# memory bandwidth, which a layer timed alone does not see;
# :func:`~codl_tvm.planner.stages.search.search_pipeline` runs Pipe-it's Algorithms 1-3 with the
# GPU as a stage: the pipeline whose slowest stage is fastest.
table = profile_layers(model, groups, number=2, repeat=2, under_load=True)
for key in table.keys():
    print(key, np.round(table[key], 3))
best = search_pipeline(table, groups)
print("searched:", best.describe(), f"predicted {best.throughput_fps:.0f} frames/s")

# %%
# The search may prefer fewer stages for a model this small (one processor may be fastest on
# every layer). To show a pipeline with a stage per group all the same, cut it into thirds then,
# one group per stage, and cost it with the same table.
n = table.n_layers
bounds = [0, n // 3, 2 * n // 3, n][: len(groups) + 1]
bounds[-1] = n
three = recost_plan(
    PipelinePlan(
        tuple(
            PipelineStage(g.name, 1, g.cores, a, b, 0.0)
            for g, a, b in zip(groups, bounds, bounds[1:], strict=False)
        ),
        "thirds",
    ),
    table,
)
plan = best if len(best.stages) == len(groups) else three
print("built:", plan.describe(), [f"{s.latency_ms:.3f} ms" for s in plan.stages])

# %%
# Build and stream
# ----------------
# Each stage becomes a library of its own, built for its group; the artifact records the
# stages. :meth:`~codl_tvm.runtime.staged_artifact.Pipeline.stream` runs one thread per stage,
# pinned
# to the stage's cores (TVM's CPU thread pool belongs to the thread that runs the kernels, so
# each stage gets its own), with bounded queues between them; outputs come back in input order.
work = tempfile.mkdtemp(prefix="codl-pipeline-")
out = build_pipeline(model, plan, groups, os.path.join(work, "pipe"))
pipe = load_pipeline(out)
frames = [random_inputs(model, seed=i) for i in range(24)]
with pipe.stream(frames[:2]) as warmup:  # the OpenCL driver compiles its kernels on first use
    list(warmup)
with pipe.stream(frames, timeline=True) as stream:
    outputs = list(stream)
stats = stream.stats()
print(
    f"{stats.frames} frames, {stats.frames_per_s:.0f} frames/s, latency median "
    f"{stats.latency_median_ms:.2f} ms, p99 {stats.latency_p99_ms:.2f} ms"
)

# %%
# The pipeline computes what the whole model computes:
reference = build(model.mod, "cpu")
err = max(
    float(np.max(np.abs(o[0] - reference(list(f.values()))[0])))
    for f, o in zip(frames, outputs, strict=True)
)
print(f"max abs difference against the unpartitioned build: {err:.2g}")
assert err < 1e-4

# %%
# The timeline
# ------------
# One row per stage, one character per time slot, the frame's last digit where the stage ran
# it: frames move diagonally from stage to stage, and every stage is busy with a different
# frame at once.
spans = stats.spans
end = max(t1 for _, _, _, t1 in spans)
width = 96
for k, name in enumerate(stats.stage_names):
    row = [" "] * width
    for stage, frame, t0, t1 in spans:
        if stage == k:
            for c in range(int(t0 / end * (width - 1)), int(t1 / end * (width - 1)) + 1):
                row[c] = str(frame % 10)
    print(f"{name:>14} |{''.join(row)}|")
