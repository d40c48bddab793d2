#!/usr/bin/env bash
# Run-to-run repeatability of the profiler on the emulated SoC (k = 8): 71 sampled parts
# (12 CoDL-sampled convs whole and halved on H and OC, both processors) compiled there, then
# measured twice under each timing protocol, alternating so drift favours neither:
# "new" (the defaults: 10 samples of >= 2 ms, median) and "long" (10 samples of >= 20 ms).
# scripts/noise_analysis.py --runs compares each protocol's two runs. About 2 minutes.
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res/noise
mkdir -p $r
export POCL_CPU_MAX_CU_COUNT=8 POCL_AFFINITY=1 CODL_OPENCL_PLATFORM=portable TVM_NUM_THREADS=8
python3 -m codl_tvm.cli profile --sample 12 --max-gflops 0.5 --dims H,OC,none --ratios 0.5 \
  --compile-dir /tmp/val --preset emulated-soc --threads 8 > $r/compile.log 2>&1
for run in a b; do
  python3 -m codl_tvm.cli profile --run-dir /tmp/val --tvm-cpus 8-15 --no-sharing \
    -o $r/new_$run.jsonl > $r/run_new_$run.log 2>&1
  python3 -m codl_tvm.cli profile --run-dir /tmp/val --tvm-cpus 8-15 --no-sharing \
    --min-repeat-ms 20 -o $r/long_$run.jsonl > $r/run_long_$run.log 2>&1
done
for p in new long; do
  python3 scripts/noise_analysis.py --runs $r/${p}_a.jsonl $r/${p}_b.jsonl \
    --out $r/noise_ab_$p.json > $r/analysis_$p.log 2>&1
done
touch /tmp/res/NOISE_DONE
