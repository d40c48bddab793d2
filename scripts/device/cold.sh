#!/usr/bin/env bash
# Cold inference (NNV12): process start to first output, broken down, for the CPU, GPU and
# co-executed builds of the benchmark models, on NVIDIA OpenCL and on PoCL (12 cores), against
# onnxruntime's session creation plus first run (bench_cold.py).
# The builds are compiled once (device-h100 preset; the compile stores NVIDIA's program
# binaries), then PoCL's binaries are added to the same artifacts (one folder holds both; on
# PoCL the co-executed build keeps the H100 plan: the cold path is what is measured).
# Each build is compiled a second time with its weights beside its library (bench_cold.py
# beside: <build>-beside, loaded on a thread while the first run goes on), when a scenario
# needs it.
# Per platform: COLD_SCENARIOS (default nocache,aot,beside; a CPU build runs cpu and beside)
# and warm for every model and build, and onnxruntime; the ablation (COLD_ABLATION_SCENARIOS)
# for COLD_ABLATION_MODELS (none: no ablation).
# Settings: COLD_MODELS, COLD_BUILDS (cpu,gpu,codl; the codl build is compiled only when named),
# COLD_PLATFORMS (nvidia and/or portable, run one after the other), COLD_SCENARIOS,
# COLD_ABLATION_MODELS, COLD_ABLATION_SCENARIOS, COLD_JOBS (parallel builds, 15).
# Each step's start and end go to cold_steps.log (seconds since the epoch), to plan leases.
# Three models on one platform (e.g. COLD_MODELS=squeezenet,resnet50,inception_v1
# COLD_ABLATION_MODELS=none): see scripts/device/README.md for the measured durations.
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${COLD_MODELS:-squeezenet,inception_v1,posenet,retinaface,fst,bvlc_alexnet,resnet50,yolov2,vgg16,vgg19}
ablation=${COLD_ABLATION_MODELS:-squeezenet,resnet50,vgg16}
platforms=${COLD_PLATFORMS:-nvidia}
builds=${COLD_BUILDS:-cpu,gpu,codl}
scenarios=${COLD_SCENARIOS:-nocache,aot,beside}
ablation_scenarios=${COLD_ABLATION_SCENARIOS:-nocache,cache,aot,beside,aot_lazy,overlap_only,aot_warm_pages,beside_sequential,context_sequential,pool_lazy,compiler_lib}
jobs=${COLD_JOBS:-15}
b=/tmp/b/cold r=/tmp/res
step() { echo "$1 $(date +%s)" >> $r/cold_steps.log; }
modes=""
case ",$builds," in *,codl,*) modes=codl ;; esac
step compile_start
CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_planner.py compile --jobs "$jobs" \
  --preset device-h100 --cost-model codl_tvm/data/cost_models/device-h100.json \
  --models "$models" --modes "$modes" --out $b > $r/cold_compile.log 2>&1
step compile_end
want_beside=0
case ",$scenarios," in *,beside*) want_beside=1 ;; esac
if [ "$ablation" != none ]; then
  case ",$ablation_scenarios," in *,beside*) want_beside=1 ;; esac
fi
if [ $want_beside = 1 ]; then
  CODL_OPENCL_PLATFORM=nvidia python3 scripts/bench_cold.py beside --dir $b --models "$models" \
    --builds "$builds" --jobs "$jobs" > $r/cold_beside.log 2>&1
fi
step beside_end
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
      --jobs "$jobs" > $r/cold_binaries_$p.log 2>&1
    step "binaries_${p}_end"
  fi
  python3 scripts/bench_cold.py run --dir $b --models "$models" --builds "$builds" \
    --platform "$p" --scenarios "$scenarios" --ort-threads $ort \
    --out $r/cold_$p.json --plot $r/cold_$p.png > $r/cold_$p.log 2>&1
  step "run_${p}_end"
  touch $r/COLD_${p}_MAIN
  if [ "$ablation" != none ]; then
    python3 scripts/bench_cold.py run --dir $b --models "$ablation" --builds "$builds" \
      --platform "$p" --scenarios "$ablation_scenarios" \
      --out $r/cold_ablation_$p.json --plot $r/cold_ablation_$p.png > $r/cold_ablation_$p.log 2>&1
    step "ablation_${p}_end"
  fi
  touch $r/COLD_${p}_DONE
done
touch $r/DONE
