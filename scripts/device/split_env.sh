# Sourced by soc_k.sh and soc_alone.sh: the emulated SoC split k (SOC_K, default 12) as the
# profiler and soc.sh use it: PoCL on cores 0..k-1, TVM's pool on the other 16-k; the result,
# dataset and cost-model directories.
set -u
. /tmp/code/env.sh
cd /tmp/code
K=${SOC_K:-12}
r=/tmp/res p=codl_tvm/data/cost_models/datasets cm=codl_tvm/data/cost_models
export POCL_CPU_MAX_CU_COUNT=$K POCL_AFFINITY=1 CODL_OPENCL_PLATFORM=portable
export TVM_NUM_THREADS=$((16 - K))
