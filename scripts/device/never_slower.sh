#!/usr/bin/env bash
# Never slower than the best single processor (bench_never_slower.py): a default
# `codl-tvm compile` (tag `default`: plans, times the plan and each processor alone on this
# machine, keeps the fastest) against each processor alone, in evaluation rounds apart from the
# compile's own, on models outside the ten the cost models were fitted on (exported here from
# torchvision's and timm's definitions with seeded random weights: scripts/export_unseen_models.py)
# and on the ten, each on three platforms: the emulated SoC at k = 14 and k = 12, each planned
# with its own shipped cost model (`NS_K14_MODEL=scaled`: k = 14 with the k = 12 model scaled
# by core counts, as the balance sweep does), and
# the H100 (NVIDIA OpenCL + 16 threads). `NS_UNSEEN=none` or `NS_KNOWN=none` skips that set, `NS_PLATFORMS` platforms.
# Each platform's end is a flag; after the last set's H100 comes the compile time of a default compile against
# `--no-measure` (one compile at a time, no build cache). onnxruntime on the CPU stand-in's
# cores is timed beside each model (`run --onnxruntime`).
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res b=/tmp/b cm=codl_tvm/data/cost_models
known=${NS_KNOWN:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
unseen=${NS_UNSEEN:-mobilenet_v2,shufflenet_v2,densenet121,regnet_x_400mf,efficientnet_b0,lraspp_mobilenet_v3,mobilenet_v2_wide,resnet18_narrow}
rounds=${NS_ROUNDS:-5}
plat=",${NS_PLATFORMS:-k14,h100,k12},"  # which of the three, e.g. k14,h100 on a short lease
k12=(--preset emulated-soc --modes "${NS_MODES:-codl}" --cost-model $cm/emulated-soc-k12.json
     --model-dir /tmp/unseen --build-cache $b/cache_soc --keep-build-cache)
# k = 14: its own cost model (profiled at that split); NS_K14_MODEL=scaled: the k = 12 model
# with TVM's CPU x 4/2, PoCL x 12/14 (compile_artifact's processor_scale), as runs before it
if [ "${NS_K14_MODEL:-own}" = scaled ]; then
  k14=("${k12[@]}" --processor-scale 2,0.857143)
else
  k14=(--preset emulated-soc --modes "${NS_MODES:-codl}" --cost-model $cm/emulated-soc-k14.json
       --model-dir /tmp/unseen --build-cache $b/cache_soc --keep-build-cache)
fi
h100=(--preset device-h100 --modes "${NS_MODES:-codl}" --cost-model $cm/device-h100.json
      --model-dir /tmp/unseen --keep-build-cache)
# NS_TRACE=TAGS: timelines of codl and these co-executed modes (e.g. codl_hostorder, with
# NS_MODES=codl,codl_hostorder: the issue order's A/B), with their gap breakdowns.
trace=()
if [ -n "${NS_TRACE:-}" ]; then trace=(--trace-dir $r/traces --trace-also "$NS_TRACE"); fi
# Models exported here: the unseen ones, and those of the compile-time phase outside the ten.
exported=$(python3 - "$unseen" "${NS_COMPILE_MODELS:-squeezenet,mobilenet_v2}" <<'PY'
import sys
from codl_tvm.frontend.models import LIGHT_MODELS
from codl_tvm.frontend.zoo import ZOO_MODELS
names = [n for arg in sys.argv[1:] for n in arg.split(",") if n and n != "none"]
print(" ".join(dict.fromkeys(n for n in names if n not in (*LIGHT_MODELS, *ZOO_MODELS))))
PY
)
if [ -n "$exported" ]; then
  python3 scripts/export_unseen_models.py -o /tmp/unseen --only $exported > $r/export.log 2>&1
  cp /tmp/unseen/models.json $r/unseen_models.json
fi
touch $r/EXPORTED
soc() {  # k, compile args name, models, run JSON: the default compiles, then evaluation rounds
  local k=$1 models=$3 out=$4; local -n args=$2
  export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
  for m in ${models//,/ }; do  # model by model: a lease cut short keeps whole models
    python3 scripts/bench_planner.py compile --default --models "$m" "${args[@]}" \
      --out $b/k$k --tvm-cpus $k-15 >> $r/k${k}_default.log 2>&1
    python3 scripts/bench_planner.py run --dir $b/k$k --models "$m" --platform portable \
      --tvm-cpus $k-15 --rounds "$rounds" --number 2 --plan-repeat 0 --concurrent-s 0 --append --onnxruntime \
      "${trace[@]}" --out $r/$out >> $r/k${k}_run.log 2>&1
  done
}
gpu() {  # models, run JSON: the H100's default compiles, then evaluation rounds
  local models=$1 out=$2
  (
    export TVM_NUM_THREADS=16 CODL_OPENCL_PLATFORM=nvidia
    python3 scripts/bench_planner.py compile --default --models "$models" "${h100[@]}" \
      --out $b/h100 >> $r/h100_default.log 2>&1
    for m in ${models//,/ }; do
      python3 scripts/bench_planner.py run --dir $b/h100 --models "$m" --platform nvidia \
        --rounds "$rounds" --number 5 --plan-repeat 0 --concurrent-s 0 --append --onnxruntime \
        "${trace[@]}" --out $r/$out >> $r/h100_run.log 2>&1
    done
  )
}
warm() {  # directory, platform, compute units (PoCL)
  CODL_OPENCL_PLATFORM=$2 POCL_CPU_MAX_CU_COUNT=$3 POCL_AFFINITY=0 python3 \
    scripts/bench_planner.py warm --dir $1 --platform $2 --jobs 15 >> $r/warm.log 2>&1
}
build() {  # models: the SoC's builds (CPU, PoCL, codl at k = 14) beside the H100's, then codl
  # at k = 12 (its CPU and GPU builds copied: they do not depend on k)
  local models=$1
  local jobs=15; [[ $plat == *,h100,* ]] && jobs=10
  local k12_beside=0
  if [[ $plat == *,k14,* ]]; then
    CODL_OPENCL_PLATFORM=portable python3 scripts/bench_planner.py compile --jobs $jobs \
      --models "$models" "${k14[@]}" --out $b/k14 >> $r/k14_compile.log 2>&1 &
  elif [[ $plat == *,k12,* ]]; then  # nothing to copy from k = 14: k = 12 builds beside the H100
    k12_beside=1
    CODL_OPENCL_PLATFORM=portable python3 scripts/bench_planner.py compile --jobs $jobs \
      --models "$models" "${k12[@]}" --out $b/k12 >> $r/k12_compile.log 2>&1 &
  fi
  if [[ $plat == *,h100,* ]]; then
    local h100_jobs=6; [[ $plat == ,h100, ]] && h100_jobs=14  # alone: all the cores
    CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_planner.py compile --jobs $h100_jobs \
      --models "$models" "${h100[@]}" --out $b/h100 >> $r/h100_compile.log 2>&1 &
  fi
  wait
  if [[ $plat == *,k12,* ]]; then
    if [ $k12_beside = 0 ]; then
      for m in ${models//,/ }; do
        mkdir -p $b/k12/$m && cp -r $b/k14/$m/cpu $b/k14/$m/gpu $b/k12/$m/ 2>/dev/null
      done
      python3 scripts/bench_planner.py compile --jobs 15 --models "$models" "${k12[@]}" \
        --out $b/k12 >> $r/k12_compile.log 2>&1
    fi
    warm $b/k12 portable 12
  fi
  [[ $plat == *,k14,* ]] && warm $b/k14 portable 14
  [[ $plat == *,h100,* ]] && warm $b/h100 nvidia 1
}
compile_time() {  # a default compile's time against --no-measure (one compile at a time, no
  # build cache), once
  [ -f $r/COMPILE_TIME_DONE ] && return
  (
    export POCL_CPU_MAX_CU_COUNT=12 POCL_AFFINITY=1 TVM_NUM_THREADS=4 CODL_OPENCL_PLATFORM=portable
    python3 scripts/bench_never_slower.py compile-time \
      --models "${NS_COMPILE_MODELS:-squeezenet,mobilenet_v2}" --model-dir /tmp/unseen \
      --preset emulated-soc --cost-model $cm/emulated-soc-k12.json \
      --warm-up-counts "${NS_WARM_UP_COUNTS:-}" \
      --out $r/compile_time.json > $r/compile_time.log 2>&1
  )
  touch $r/COMPILE_TIME_DONE
}
platforms() {  # models, suffix of the run JSONs and flags: k = 14, the H100, k = 12
  local models=$1 sfx=$2
  build "$models"
  touch $r/BUILT$sfx
  [[ $plat == *,k14,* ]] && soc 14 k14 "$models" never_slower_k14$sfx.json
  touch $r/K14_DONE$sfx
  [[ $plat == *,h100,* ]] && gpu "$models" never_slower_h100$sfx.json
  touch $r/H100_DONE$sfx
  # a short phase, before the longer k = 12 one a lease may not reach
  if [ -n "$sfx" ] || [ "$known" = none ]; then compile_time; fi
  [[ $plat == *,k12,* ]] && soc 12 k12 "$models" never_slower_k12$sfx.json
  touch $r/K12_DONE$sfx
}
# A short lease measures the compile time first (NS_COMPILE_FIRST=1).
if [ "${NS_COMPILE_FIRST:-0}" = 1 ]; then compile_time; fi
# 1. The unseen models; 2. the ten (their own builds, after the unseen ones' timing).
if [ "$unseen" != none ]; then platforms "$unseen" ""; fi
if [ "$known" != none ]; then platforms "$known" _known; fi
touch $r/KNOWN_DONE
compile_time
touch $r/DONE
