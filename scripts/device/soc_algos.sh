#!/usr/bin/env bash
# Emulated SoC with the CPU-alone kernels in the cost model: measure the
# Winograd/packed CPU conv parts compiled here (`profile_campaign.py --algorithms
# winograd,packed`, carried as .device/prof_soc_algos.tar.xz) on the SoC's CPU cores (8-15),
# refit the shipped emulated-soc GBDT on the direct and the algorithm datasets, then run
# soc.sh with that model (so co-executed CPU parts get those kernels), then ksweep.sh.
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res
cm=codl_tvm/data/cost_models
mkdir -p /tmp/prof
tar -xJf /tmp/code/prof_soc_algos.tar.xz -C /tmp/prof
p=codl_tvm/data/cost_models/datasets
export POCL_CPU_MAX_CU_COUNT=8 POCL_AFFINITY=1 CODL_OPENCL_PLATFORM=portable  # as soc.sh
TVM_NUM_THREADS=8 taskset -c 8-15 python3 -m codl_tvm.cli profile \
  --run-dir /tmp/prof/prof_soc_algos -o $p/emulated_soc_algos.jsonl > $r/profile_algos.log 2>&1
cp $p/emulated_soc_algos.jsonl $r/
touch $r/PROFILED
# The shipped model's recipe (holdout 0.3, seed 0, interference filter 3x), on both datasets.
python3 -m codl_tvm.cli cost-model fit $p/emulated_soc.jsonl $p/emulated_soc_algos.jsonl \
  --kind gbdt -o $cm/emulated-soc.json > $r/fit.log 2>&1
python3 -m codl_tvm.cli cost-model eval $cm/emulated-soc.json $p/emulated_soc.jsonl \
  $p/emulated_soc_algos.jsonl --json > $r/cost_model_eval_emulated_soc_algos.json 2>> $r/fit.log
cp $cm/emulated-soc.json $r/
touch $r/FITTED
CPU_MODELS=${CPU_MODELS:-squeezenet,resnet50,inception_v1,vgg19,posenet} \
SOC_MODELS=${SOC_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet} \
  bash /tmp/code/soc.sh
bash /tmp/code/ksweep.sh
