#!/usr/bin/env bash
# Per-kernel benchmark on the device machine: CoDL's conv shapes and the other ops of
# scripts/bench_kernels.py, compiled there, TVM's CPU (8 threads on cores 0-7; the default build
# and the CPU-alone build) against onnxruntime, NVIDIA OpenCL against PyTorch/cuDNN (TF32 on, as
# cuDNN defaults, and off). OPENCL_VARIANTS: OpenCLConfig A/B builds ('name:key=value,...;...').
# CPU_ALONE_VARIANTS: CPU-alone builds with CPUConfig overrides (same syntax); KERNEL_OPS: a
# comma-separated subset of the operators. 13 operators in 5-10 builds each: about 3 minutes.
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res
variants=${OPENCL_VARIANTS:-nosplit:conv_split_k=1}
python3 scripts/bench_kernels.py --compile-dir /tmp/b/kernels --opencl-devices nvidia \
  --opencl-variants "$variants" --cpu-alone --cpu-alone-variants "${CPU_ALONE_VARIANTS:-}" \
  --ops "${KERNEL_OPS:-}" > $r/kernels_compile.log 2>&1
touch $r/KERNELS_BUILT
python3 scripts/bench_kernels.py --run-dir /tmp/b/kernels --threads 8 --cpus 0-7 \
  --opencl-platform nvidia --opencl-config nvidia --torch --min-seconds 0.3 --number 3 \
  --repeat 7 --out $r/kernels_nvidia.json > $r/kernels_run.log 2>&1
touch $r/KERNELS_DONE
