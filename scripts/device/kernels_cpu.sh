#!/usr/bin/env bash
# One machine for the CPU benchmarks: kernels.sh (per op, CPU and NVIDIA OpenCL), then cpu.sh (whole models
# on the CPU alone with VARIANTS, kernel by kernel for LAYER_MODELS); with SOC_MODELS set,
# cpu_soc.sh instead (cpu.sh, then soc.sh on those models with SOC_K and its cost model).
set -u
bash /tmp/code/kernels.sh
if [ -n "${SOC_MODELS:-}" ]; then bash /tmp/code/cpu_soc.sh; else bash /tmp/code/cpu.sh; fi
