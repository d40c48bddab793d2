"""
Profile operators and fit latency cost models
=============================================

codl-tvm decides how to split an operator between the GPU and the CPU with a latency predictor
(CoDL section 5). This tutorial measures a handful of convolutions, each split along output rows
(``H``) and output channels (``OC``) at a few GPU ratios, with every part built and timed alone on
its own processor, plus the data-sharing costs; it then fits CoDL's analytical model and a GBDT
model with dispatch features (the fine-grained SVM paper), and reads their accuracy report and
scatter plot.

It runs on the local OpenCL device (a CPU OpenCL runtime from PyPI) on a tiny sample, so the
accuracy printed here says little; the same commands on an emulated SoC (8 Xeon cores as the
GPU through PoCL, 8 as the CPU) and on an H100 with a 16-core Xeon produce the datasets behind
the README's figures::

    codl-tvm profile --sample 300 --ratios 0,0.25,0.5,0.75,1 -o data.jsonl
    codl-tvm cost-model fit data.jsonl -o codl.json --kind codl
    codl-tvm cost-model eval codl.json data.jsonl --plot scatter.png
    codl-tvm cost-model decisions codl.json oracle.json data.jsonl   # models' splits vs measured
"""

# %%
# Sample operators
# ----------------
# The SVM paper's scheme picks, per dimension, a power-of-two interval and then a value inside it;
# we keep the intervals small (up to 63) and reject shapes above 20 MFLOPs so this runs in seconds.
import tempfile
from pathlib import Path

import numpy as np

from codl_tvm.cost_model import evaluate
from codl_tvm.cost_model.dataset import load_dataset
from codl_tvm.cost_model.sampling import SampleSpace, sample_conv2d
from codl_tvm.profiling.profile import make_jobs, profile
from codl_tvm.profiling.timing import TimingConfig

space = SampleSpace("pow2", pow2_k=(2, 5), kernels=(1, 3), strides=(1, 2))
convs = sample_conv2d(np.random.default_rng(0), 5, space, max_gflops=0.02)
for p in convs:
    print(p.describe())

# %%
# Measure every part
# ------------------
# :func:`~codl_tvm.profiling.profile.make_jobs` lists the parts of each operator for each
# partition: at ratio 0.5 a GPU part and a CPU part, at ratio 1 the GPU part only. Each part is
# built as a one-op module of its own shape (checked against what ``PartitionOperators`` makes),
# its implementation and dispatch features are read from the scheduled kernels, and it is timed
# with ``time_evaluator`` (median of the repeats). The dataset is resumable: running this cell
# again measures nothing new.
work = Path(tempfile.mkdtemp(prefix="codl-cost-model-"))
data_path = work / "local.jsonl"
jobs = make_jobs([(None, p) for p in convs], dims=("H", "OC"), ratios=(0.25, 0.5, 1.0))
counts = profile(
    jobs,
    data_path,
    timing=TimingConfig(warmup=1, repeats=3, number=2),
    sharing_sizes=(4096, 1 << 20),
)
print(counts)
data = load_dataset(data_path)
print(f"{len(data.op_records)} part latencies, {len(data.sharing_records)} sharing costs")
r = data.op_records[0]
print(r.params.describe(), r.partition, r.processor, r.impl, r.dispatch, f"{r.latency_ms:.3f} ms")

# %%
# Fit the models
# --------------
# 70% of the records train, 30% are held out (CoDL's split). The CoDL model learns, per kernel
# implementation, the time of one unit of work and scales it with Eq. 3's step function; the GBDT
# model also sees the work-group size and count (GPU) and parallel blocks and vector width (CPU).
# Groups with too few records fall back to the FLOPs model with a warning.
train, test = evaluate.split_records(data.records, holdout=0.3, seed=0)
models = {kind: evaluate.fit_model(kind, train) for kind in ("codl", "gbdt")}

# %%
# Accuracy report and scatter plot
# --------------------------------
# +-10% accuracy and MAPE per processor and implementation, against the FLOPs-linear baseline.
for kind, model in models.items():
    report = evaluate.evaluate(model, test, split="held-out 30%")
    print(f"== {kind} ==")
    print(evaluate.format_report(report))
    plot = work / f"scatter_{kind}.png"
    evaluate.plot_scatter(report, str(plot), title=f"{kind} on the local device")
    print("scatter plot:", plot)

# %%
# What ``cost-model eval`` adds
# -----------------------------
# The full assessment breaks the scores down per processor, implementation and latency band,
# with CoDL's model and the FLOPs line beside the model and two ceilings from the data itself:
# how often repeated measurements of one part agree within +-10% (``ceiling``, when parts were
# measured twice) and how often a part sits within +-10% of the interpolation between its
# operator's neighbouring parts (``smooth``). Datasets of benchmark models (records named
# ``MODEL/OPERATOR``) are also scored leave-one-model-out; this sample has none.
from codl_tvm.cost_model.assessment import assess, format_assessment  # noqa: E402

print(format_assessment(assess(models["gbdt"], data.records, "the local sample", lomo=False)))

# %%
# The kernels of builds for the CPU alone
# ---------------------------------------
# On AVX-512, ``codl-tvm compile --device cpu`` builds qualifying convs as Winograd or
# channel-packed convs. To let the planner predict them (and co-executed CPU parts use them),
# profile them into a dataset of their own (``codl-tvm profile --winograd --packed``); a part
# below an algorithm's thresholds keeps its direct kernel, and its record says so. Fitting takes
# both datasets; each implementation gets its own group.
from codl_tvm.schedules import packed_enabled, winograd_enabled  # noqa: E402

from codl_tvm.cost_model.features import OpParams  # noqa: E402
from codl_tvm.cost_model.part_ir import algorithm_switches  # noqa: E402

# the sampled convs are too narrow for either algorithm; some that qualify (64 input channels):
# 3x3 stride 1 (Winograd) and stride 2 (packed), split along H (each group needs 8 records)
wide = [
    OpParams("conv2d", hw, hw, 64, 32, kernel=3, stride=s, padding=(1, 1, 1, 1))
    for hw in (8, 12, 16)
    for s in (1, 2)
]
algo_path = work / "local-algorithms.jsonl"
cpu_jobs = make_jobs([(None, p) for p in convs], ("H", "OC"), (0.25, 0.5))
cpu_jobs += make_jobs([(None, p) for p in wide], ("H",), (0.25, 0.5, 0.75))
cpu_jobs = [j for j in cpu_jobs if j.processor == "cpu"]
with winograd_enabled("all"), packed_enabled("all"):
    profile(
        cpu_jobs,
        algo_path,
        timing=TimingConfig(warmup=1, repeats=3, number=2),
        sharing_sizes=(),
        meta={"algorithms": algorithm_switches()},  # what `codl-tvm profile` records
    )
algo = load_dataset(algo_path)
print(sorted({r.impl for r in algo.op_records}), "on the CPU with the algorithms on")
both = evaluate.fit_model("gbdt", data.records + algo.records)
print(sorted({k[2] for k in both.boosters if k[:2] == ("conv2d", "cpu")}), "CPU conv groups")
