#!/usr/bin/env bash
# Pipelined throughput (Pipe-it, scripts/bench_pipeline.py) on emulated big/little clusters and
# a GPU: PoCL on cores 0..G-1 (the GPU, G = PIPE_GPU_CORES, default 1), "big" = TVM's kernels for
# the host CPU (AVX-512) on the next 8 cores, "little" = kernels for PIPE_ISA (default
# little=x86-64-v3-nofma: AVX2 without FMA) on the rest (7 cores with G = 1).
# Why G = 1 (the first run had G = 4: gpu:0-3,big:4-11,little:12-15): PoCL on 4 cores ran the
# five CNNs 23-35x slower than the 8 big cores (91-630 ms a frame), so the optimal pipeline gave
# it 0-4 light layers and 0-5 % more throughput, while pipelined throughput grows with CPU cores
# (stages of 1-3 cores): from the same tables, the optimum on 6 big + 4 little cores is 20-27 %
# below 8 big + 4 little, and little cores scale well (1 -> 4 cores: 2.9-4.1x). Four PoCL cores
# are worth more as CPU stages; PIPE_GPU_CORES=4 repeats the first run's split.
# The big/little per-core ratio is measured and reported (little_over_big_1core, and the
# summary's little_over_big_1core_in_pipe_it_range; Pipe-it's range is 2-5x): x86-64-v2
# (SSE4.2) measured 4.7-7.0x, so the default is AVX2 without FMA;
# PIPE_ISA=little=x86-64-v3 (with FMA) narrows the gap, little=x86-64-v2 or x86-64 widen it.
# kernel_all is every core with the little ISA (TVM's static parallel-for chunks make a
# big.LITTLE kernel end with its little threads); kernel_all_big_isa, the host ISA on every
# core, is an upper bound this emulation allows and a phone does not.
# Builds run in PIPE_JOBS processes, then every layer is timed on 1..n cores of each group, the
# stages searched (heuristic, exhaustive <= 3, from predicted latencies), the chosen pipelines
# built, and PIPE_FRAMES frames streamed through each pipeline and baseline, one at a time.
# Throughput is the steady rate (first to last output; the fill is reported apart) for every
# configuration alike; the executor's hand-off per stage is measured and counted by the search;
# the CPU topology (SMT siblings) is recorded. About 21 minutes for the five models with 48
# frames and both time matrices (the lease's 30 minutes hold it after stage 1); trim with
# PIPE_MODELS, PIPE_FRAMES, PIPE_ROUNDS (streams of each configuration, default 3), PIPE_GPU_FRAMES (GPU-alone baseline, default 8), PIPE_NUMBER,
# PIPE_REPEAT, PIPE_NO_CODL=1 (skips the codl latency-plan baseline and its build),
# PIPE_NO_UNDER_LOAD=1 (skips the second time matrix, each layer timed beside a load on every
# other core, and the plans searched on it), PIPE_STAGE_ROUNDS (pipelines whose stages are timed
# together for the staged plans, default 16; 0 skips them), PIPE_SKIP (configurations not
# streamed, e.g. gpu,replicas,kernel_all_big_isa).
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res
g=${PIPE_GPU_CORES:-1}
export POCL_CPU_MAX_CU_COUNT=$g POCL_AFFINITY=1 CODL_OPENCL_PLATFORM=portable
groups=${PIPE_GROUPS:-gpu:0-$((g - 1)),big:$g-$((g + 7)),little:$((g + 8))-15}
python3 scripts/bench_pipeline.py \
  --models "${PIPE_MODELS:-bvlc_alexnet,inception_v1,posenet,resnet50,squeezenet}" \
  --groups "$groups" --isa "${PIPE_ISA:-little=x86-64-v3-nofma}" --jobs "${PIPE_JOBS:-15}" \
  --frames "${PIPE_FRAMES:-40}" --rounds "${PIPE_ROUNDS:-3}" --gpu-frames "${PIPE_GPU_FRAMES:-8}" --number "${PIPE_NUMBER:-2}" --repeat "${PIPE_REPEAT:-3}" \
  --stage-rounds "${PIPE_STAGE_ROUNDS:-16}" --skip "${PIPE_SKIP:-}" ${PIPE_NO_CODL:+--no-codl} ${PIPE_NO_UNDER_LOAD:+--no-under-load} --work /tmp/b/pipeline --out $r/pipeline.json \
  > $r/pipeline_bench.log 2>&1
touch $r/DONE
