#!/usr/bin/env bash
# The H100's GPU data type, measured as `codl-tvm profile --data-type` measures it for a user
# (common operators on buffers and on images, round-robin, and the image conversions alone),
# recorded in a copy of the shipped device-h100 cost model (/tmp/res/device-h100.json).
set -u
. /tmp/code/env.sh
cd /tmp/code
export TVM_NUM_THREADS=16 CODL_OPENCL_PLATFORM=nvidia
# The record is for the shipped H100 model: another GPU (an H200 lease) would not match it.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
  echo "not an H100: $(nvidia-smi --query-gpu=name --format=csv,noheader)" > /tmp/res/dtype_h100.log
  touch /tmp/res/DONE; exit 0
fi
python3 -m codl_tvm.cli profile --data-type --cost-model codl_tvm/data/cost_models/device-h100.json \
  --out /tmp/res/device-h100.json > /tmp/res/dtype_h100.log 2>&1
touch /tmp/res/DONE
