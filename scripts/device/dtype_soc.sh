#!/usr/bin/env bash
# The emulated SoC's GPU data type at split k (DTYPE_K, default 14: PoCL on cores 0..k-1, TVM on
# the others), measured as `codl-tvm profile --data-type` measures it for a user (common
# operators on buffers and on images, round-robin, and the image conversions alone), recorded in
# a copy of k's shipped cost model (/tmp/res/emulated-soc-kK.json).
set -u
. /tmp/code/env.sh
cd /tmp/code
k=${DTYPE_K:-14}
export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
python3 -m codl_tvm.cli profile --data-type \
  --cost-model codl_tvm/data/cost_models/emulated-soc-k$k.json \
  --out /tmp/res/emulated-soc-k$k.json > /tmp/res/dtype_soc_k$k.log 2>&1
touch /tmp/res/DONE
