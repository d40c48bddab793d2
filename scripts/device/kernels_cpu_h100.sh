#!/usr/bin/env bash
# One H100 machine for the kernel benchmarks and the H100 planner benchmark: kernels.sh (per op, CPU and NVIDIA
# OpenCL, with CPU_ALONE_VARIANTS), cpu.sh (whole models on the CPU alone with VARIANTS; its
# DONE flag becomes CPU_DONE), then h100.sh (the planner benchmark on NVIDIA OpenCL + 16
# threads, H100_MODELS). Flags: KERNELS_DONE, CPU_DONE, H100_BUILT, H100_VERIFIED, ALL_DONE.
set -u
r=/tmp/res
bash /tmp/code/kernels.sh
bash /tmp/code/cpu.sh
mv $r/DONE $r/CPU_DONE 2>/dev/null
bash /tmp/code/h100.sh
touch $r/ALL_DONE
