#!/usr/bin/env bash
# Cold inference (NNV12): process start to first output, broken down, for the CPU, GPU and
# co-executed builds of the benchmark models, on NVIDIA OpenCL and on PoCL (12 cores), against
# onnxruntime's session creation plus first run (bench_cold.py).
# The builds are compiled once (device-h100 preset; the compile stores NVIDIA's program
# binaries), then PoCL's binaries are added to the same artifacts (one folder holds both; on
# PoCL the co-executed build keeps the H100 plan: the cold path is what is measured).
# Each build is compiled a second time with its weights beside its library (bench_cold.py
# beside: <build>-beside, loaded on a thread while the first run goes on).
# Per platform: nocache, aot, beside and warm for every model and build; the ablation (cache,
# aot_lazy, overlap_only, aot_warm_pages, beside_sequential) for COLD_ABLATION_MODELS.
# COLD_MODELS, COLD_ABLATION_MODELS, COLD_BUILDS (cpu,gpu,codl), COLD_PLATFORMS (default nvidia:
# about 12 minutes of builds and 9 of runs; portable on its own lease takes about 12 + 2
# minutes of builds and PoCL binaries, then 15-20 of runs, PoCL's first compiles being slow).
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${COLD_MODELS:-squeezenet,inception_v1,posenet,retinaface,fst,bvlc_alexnet,resnet50,yolov2,vgg16,vgg19}
ablation=${COLD_ABLATION_MODELS:-squeezenet,resnet50,vgg16}
platforms=${COLD_PLATFORMS:-nvidia}
builds=${COLD_BUILDS:-cpu,gpu,codl}
b=/tmp/b/cold r=/tmp/res
CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_planner.py compile --jobs 15 \
  --preset device-h100 --cost-model codl_tvm/data/cost_models/device-h100.json \
  --models "$models" --modes codl --out $b > $r/cold_compile.log 2>&1
CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_cold.py beside --dir $b --models "$models" \
  --builds "$builds" --jobs 15 > $r/cold_beside.log 2>&1
touch $r/COLD_BUILT
for p in ${platforms//,/ }; do
  if [ "$p" = portable ]; then
    export POCL_CPU_MAX_CU_COUNT=12 POCL_AFFINITY=1 TVM_NUM_THREADS=4 ort=12
  else
    export TVM_NUM_THREADS=16 ort=16
    unset POCL_CPU_MAX_CU_COUNT POCL_AFFINITY
  fi
  if [ "$p" != nvidia ]; then
    CODL_OPENCL_PLATFORM=$p python3 scripts/bench_cold.py binaries --dir $b --platform "$p" \
      --jobs 15 > $r/cold_binaries_$p.log 2>&1
  fi
  python3 scripts/bench_cold.py run --dir $b --models "$models" --builds "$builds" \
    --platform "$p" --scenarios nocache,aot,beside --ort-threads $ort \
    --out $r/cold_$p.json --plot $r/cold_$p.png > $r/cold_$p.log 2>&1
  touch $r/COLD_${p}_MAIN
  python3 scripts/bench_cold.py run --dir $b --models "$ablation" --builds gpu,codl \
    --platform "$p" \
    --scenarios nocache,cache,aot,beside,aot_lazy,overlap_only,aot_warm_pages,beside_sequential \
    --out $r/cold_ablation_$p.json --plot $r/cold_ablation_$p.png > $r/cold_ablation_$p.log 2>&1
  touch $r/COLD_${p}_DONE
done
touch $r/DONE
