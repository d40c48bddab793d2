#!/usr/bin/env bash
# Emulated SoC: PoCL on k cores (0..k-1, default 8) is the GPU, TVM's CPU kernels on the others.
# Build every variant in parallel (and codl-tvm's CPU builds of whole models, weights constant,
# with variants), time the CPU builds against onnxruntime on 8 threads, run every planner
# artifact once in parallel to fill the OpenCL program caches, then time (`--verify`, then
# `run`) one model at a time.
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${SOC_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
cm=codl_tvm/data/cost_models
b=/tmp/b/soc r=/tmp/res
# SOC_K: PoCL's cores (0..k-1); TVM gets the other 16-k. SOC_COST_MODEL / SOC_ORACLE: the cost
# model and the measured table of that split (k = 8: the shipped ones).
k=${SOC_K:-8}
export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
tvm_cpus=$k-15
# SOC_MODES: the planner variants (bench_planner.py --modes; e.g. add codl_alone, codl built with
# the CPU-alone kernels on every CPU function, or codl_streaming, planned with
# SOC_WEIGHT_GBPS=CPU,GPU as compile --weight-gbps).
common=(--preset emulated-soc --models "$models"
        --modes "${SOC_MODES:-codl,codl_no_chain,h_only,oc_only,ulayer_like}"
        --cost-model "${SOC_COST_MODEL:-$cm/emulated-soc.json}"
        --oracle "${SOC_ORACLE:-codl_tvm/data/cost_models/datasets/oracle_emulated_soc.json}" --out $b
        ${SOC_WEIGHT_GBPS:+--weight-gbps "$SOC_WEIGHT_GBPS"})
# CPU_MODELS=none: no CPU-model section (cpu.sh measured them on this machine already).
cpu_models=${CPU_MODELS:-squeezenet,bvlc_alexnet,resnet50,inception_v1,vgg19,posenet}
(python3 scripts/bench_planner.py compile --jobs 12 "${common[@]}" --keep-build-cache \
   > $r/soc_compile.log 2>&1; touch $r/BUILT) &
if [ "$cpu_models" != none ]; then
# The CPU builds: direct/GEMM kernels (no tag), what `codl-tvm compile --device cpu` builds for
# AVX-512 (Winograd 3x3 and channel-packed convs: tag cpualone), and packed convs alone on the
# models with small maps (tag packed).
python3 scripts/bench_cpu_models.py compile --constant-weights --models "$cpu_models" \
  --out /tmp/b/cpu_models > $r/cpu_models_compile.log 2>&1 &
python3 scripts/bench_cpu_models.py compile --constant-weights --models "$cpu_models" \
  --tag cpualone --winograd --packed --cpu-alone --out /tmp/b/cpu_models \
  > $r/cpu_models_cpualone_compile.log 2>&1 &
packed_models=${PACKED_MODELS:-squeezenet,resnet50,inception_v1,posenet}
python3 scripts/bench_cpu_models.py compile --constant-weights --models "$packed_models" \
  --tag packed --packed --out /tmp/b/cpu_models > $r/cpu_models_packed_compile.log 2>&1 &
fi
wait  # for the planner builds too
if [ "$cpu_models" != none ]; then
# CPU models first, while nothing else runs: codl-tvm (every variant) and onnxruntime on 8
# threads, round-robin.
TVM_NUM_THREADS=8 python3 scripts/bench_cpu_models.py run --dir /tmp/b/cpu_models --threads 8 --rounds 5 \
  --out $r/cpu_models_8threads_constant.json > $r/cpu_models_run.log 2>&1
# Where the CPU time goes, kernel by kernel, beside onnxruntime's nodes (the models furthest
# from onnxruntime).
TVM_NUM_THREADS=8 python3 scripts/bench_cpu_models.py layers --dir /tmp/b/cpu_models --threads 8 --runs 10 \
  --models "${LAYER_MODELS:-resnet50-cpualone,posenet-cpualone}" --out $r/cpu_layers.json > $r/cpu_layers.log 2>&1
rm -rf /tmp/b/cpu_models
fi
touch $r/CPU_DONE
POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
  > $r/soc_warm.log 2>&1
touch $r/WARM
# SOC_ROUNDS: round-robin samples per variant (default 3). SOC_VERIFY=0 skips the measured
# re-plans (`--verify`), about 3 minutes for five models.
if [ "${SOC_VERIFY:-1}" != 0 ]; then
python3 scripts/bench_planner.py compile "${common[@]}" --verify 3 \
  --verify-modes codl_no_chain,h_only,oc_only --tvm-cpus $tvm_cpus > $r/soc_verify.log 2>&1
fi
touch $r/VERIFIED
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform portable \
    --tvm-cpus $tvm_cpus --rounds "${SOC_ROUNDS:-3}" --number 2 --trace-dir $r/traces_soc --append \
    --out $r/planner_emulated_soc.json >> $r/soc_run.log 2>&1
done
touch $r/SOC_DONE
