#!/usr/bin/env bash
# Choosing k of the emulated SoC (the two processors' single-processor latencies on a
# reference model within 2x): time the GPU build on PoCL with k CUs on cores 0..k-1 and the CPU
# build with 16-k TVM threads on cores k..15, one process at a time, for a few k. Uses the
# artifacts soc.sh built (/tmp/b/soc/MODEL/{cpu,gpu}); one line per run in ksweep.log.
set -u
. /tmp/code/env.sh
cd /tmp/code
b=/tmp/b/soc r=/tmp/res
models=${KSWEEP_MODELS:-resnet50,vgg16,fst}
for m in ${models//,/ }; do
  for k in ${KSWEEP_K:-8 10 12}; do
    gpu=$(CODL_OPENCL_PLATFORM=portable POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=0 \
      taskset -c 0-$((k - 1)) python3 -m codl_tvm.cli run $b/$m/gpu --repeat 5 --number 1 \
      2>&1 | grep -o "latency: median [0-9.]* ms")
    cpu=$(TVM_NUM_THREADS=$((16 - k)) taskset -c $k-15 python3 -m codl_tvm.cli run $b/$m/cpu \
      --repeat 5 --number 1 2>&1 | grep -o "latency: median [0-9.]* ms")
    echo "model $m k $k gpu_cus $k cpu_threads $((16 - k)) gpu [$gpu] cpu [$cpu]" | tee -a $r/ksweep.log
  done
done
touch $r/KSWEEP_DONE
