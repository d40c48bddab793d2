#!/usr/bin/env bash
# Never slower than the best single processor (bench_never_slower.py): a default
# `codl-tvm compile` (tag `default`: plans, times the plan and each processor alone on this
# machine, keeps the fastest) against each processor alone, in evaluation rounds apart from the
# compile's own, on models outside the ten the cost models were fitted on (exported here from
# torchvision's and timm's definitions with seeded random weights: scripts/export_unseen_models.py)
# and on the ten. Platforms: the emulated SoC at k = 14 (the ten and the unseen models) and
# k = 12 (the unseen models), planned with the shipped k = 12 cost model (at k = 14 scaled by
# core counts, as the balance sweep does), and the H100 (NVIDIA OpenCL + 16 threads; the unseen
# models). Phases in order of importance, each ending in a flag; the last is the compile time
# of a default compile against `--no-measure` (one compile at a time, no build cache).
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res b=/tmp/b cm=codl_tvm/data/cost_models
known=${NS_KNOWN:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
unseen=${NS_UNSEEN:-mobilenet_v2,shufflenet_v2,densenet121,regnet_x_400mf,efficientnet_b0,lraspp_mobilenet_v3,mobilenet_v2_wide,resnet18_narrow}
rounds=${NS_ROUNDS:-5}
k12=(--preset emulated-soc --modes codl --cost-model $cm/emulated-soc-k12.json
     --model-dir /tmp/unseen --build-cache $b/cache_soc --keep-build-cache)
# k = 14: TVM's CPU x 4/2, PoCL x 12/14 (compile_artifact's processor_scale)
k14=("${k12[@]}" --processor-scale 2,0.857143)
h100=(--preset device-h100 --modes codl --cost-model $cm/device-h100.json
      --model-dir /tmp/unseen --keep-build-cache)
python3 scripts/export_unseen_models.py -o /tmp/unseen --only ${unseen//,/ } > $r/export.log 2>&1
cp /tmp/unseen/models.json $r/unseen_models.json
touch $r/EXPORTED
soc() {  # k, compile args name, models, run JSON: the default compiles, then evaluation rounds
  local k=$1 models=$3 out=$4; local -n args=$2
  export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
  python3 scripts/bench_planner.py compile --default --models "$models" "${args[@]}" \
    --out $b/k$k --tvm-cpus $k-15 >> $r/k${k}_default.log 2>&1
  for m in ${models//,/ }; do
    python3 scripts/bench_planner.py run --dir $b/k$k --models "$m" --platform portable \
      --tvm-cpus $k-15 --rounds "$rounds" --number 2 --plan-repeat 0 --concurrent-s 0 --append \
      --out $r/$out >> $r/k${k}_run.log 2>&1
  done
}
warm() {  # directory, platform, compute units (PoCL)
  CODL_OPENCL_PLATFORM=$2 POCL_CPU_MAX_CU_COUNT=$3 POCL_AFFINITY=0 python3 \
    scripts/bench_planner.py warm --dir $1 --platform $2 --jobs 15 >> $r/warm.log 2>&1
}
# 1. The unseen models: builds for the SoC (CPU, PoCL, codl at k = 14) beside the H100's, then
# codl at k = 12 (its CPU and GPU builds copied: they do not depend on k).
CODL_OPENCL_PLATFORM=portable python3 scripts/bench_planner.py compile --jobs 10 --models "$unseen" \
  "${k14[@]}" --out $b/k14 > $r/k14_compile.log 2>&1 &
CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_planner.py compile --jobs 6 --models "$unseen" \
  "${h100[@]}" --out $b/h100 > $r/h100_compile.log 2>&1 &
wait
for m in ${unseen//,/ }; do
  mkdir -p $b/k12/$m && cp -r $b/k14/$m/cpu $b/k14/$m/gpu $b/k12/$m/ 2>/dev/null
done
python3 scripts/bench_planner.py compile --jobs 15 --models "$unseen" "${k12[@]}" --out $b/k12 \
  > $r/k12_compile.log 2>&1
touch $r/BUILT
warm $b/k14 portable 14; warm $b/k12 portable 12; warm $b/h100 nvidia 1
touch $r/WARM
soc 14 k14 "$unseen" never_slower_k14.json
touch $r/K14_DONE
(
  export TVM_NUM_THREADS=16 CODL_OPENCL_PLATFORM=nvidia
  python3 scripts/bench_planner.py compile --default --models "$unseen" "${h100[@]}" --out $b/h100 \
    > $r/h100_default.log 2>&1
  for m in ${unseen//,/ }; do
    python3 scripts/bench_planner.py run --dir $b/h100 --models "$m" --platform nvidia \
      --rounds "$rounds" --number 5 --plan-repeat 0 --concurrent-s 0 --append \
      --out $r/never_slower_h100.json >> $r/h100_run.log 2>&1
  done
)
touch $r/H100_DONE
soc 12 k12 "$unseen" never_slower_k12.json
touch $r/K12_DONE
# 2. The ten at k = 14 (their own builds now: timing above ran on a quiet machine).
if [ "$known" != none ]; then
  CODL_OPENCL_PLATFORM=portable python3 scripts/bench_planner.py compile --jobs 15 --models "$known" \
    "${k14[@]}" --out $b/k14 > $r/k14_known_compile.log 2>&1
  warm $b/k14 portable 14
  soc 14 k14 "$known" never_slower_k14_known.json
fi
touch $r/KNOWN_DONE
# 3. A default compile's time against --no-measure (one compile at a time, no build cache).
export POCL_CPU_MAX_CU_COUNT=12 POCL_AFFINITY=1 TVM_NUM_THREADS=4 CODL_OPENCL_PLATFORM=portable
python3 scripts/bench_never_slower.py compile-time --models "${NS_COMPILE_MODELS:-squeezenet,mobilenet_v2}" \
  --model-dir /tmp/unseen --preset emulated-soc --cost-model $cm/emulated-soc-k12.json \
  --out $r/compile_time.json > $r/compile_time.log 2>&1
touch $r/DONE
