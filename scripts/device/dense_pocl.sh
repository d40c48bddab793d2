#!/usr/bin/env bash
# Batch-1 dense layers on the emulated SoC's GPU (PoCL on cores 0..k-1, SOC_K default 12):
# dlight's rule (the default) against codl's OpenCL dense rule, its GEMV path (gemv) and its
# GEMM path for one row (gemm1: a work-item per 16 output features, the weight read as
# vectors); TVM's CPU build and onnxruntime on the other 16-k cores. VGG's fc6 included.
#   there: SOC_K=12 bash /tmp/code/dense_pocl.sh (after stage2.sh; about 2 minutes)
. /tmp/code/split_env.sh  # K, r and the split's environment
ops=${DENSE_OPS:-dense_4096_1000,dense_9216_4096,dense_25088_4096}
python3 scripts/bench_kernels.py --compile-dir /tmp/b/dense --opencl-devices pocl \
  --opencl-variants "${DENSE_VARIANTS:-gemm1:dense=1,dense_gemm_min_m=1;gemv:dense=1}" \
  --ops "$ops" > $r/dense_compile.log 2>&1
python3 scripts/bench_kernels.py --run-dir /tmp/b/dense --threads $((16 - K)) --cpus $K-15 \
  --opencl-platform portable --opencl-config pocl --min-seconds 0.3 --number 3 --repeat 7 \
  --out $r/dense_pocl_k$K.json > $r/dense_run.log 2>&1
touch $r/DENSE_DONE
