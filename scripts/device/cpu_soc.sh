#!/usr/bin/env bash
# One machine, two measurements one after the other: cpu.sh (the CPU alone against onnxruntime,
# CPUConfig A/B; its results move to /tmp/res/cpu/), then soc.sh with CPU_MODELS=none (pass
# SOC_K, SOC_COST_MODEL, SOC_ORACLE, SOC_MODELS in the environment).
set -u
r=/tmp/res
bash /tmp/code/cpu.sh
mkdir -p $r/cpu
mv $r/cpu_models_8threads_constant.json $r/cpu_layers.json $r/compile_*.log $r/cpu_models_run.log \
  $r/cpu_layers.log $r/cpu/ 2>/dev/null
rm -f $r/DONE $r/BUILT $r/RUN
touch $r/CPU_AB_DONE
CPU_MODELS=none bash /tmp/code/soc.sh
touch $r/DONE
