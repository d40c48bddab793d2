#!/usr/bin/env bash
# One machine: soc.sh (the emulated-SoC planner benchmark; pass SOC_K, SOC_COST_MODEL,
# SOC_ORACLE, SOC_MODELS, SOC_MODES, CPU_MODELS in the environment), then noise_ab.sh (the
# profiler's run-to-run repeatability at k = 8). Flags: SOC_DONE, NOISE_DONE, ALL_DONE.
set -u
bash /tmp/code/soc.sh
bash /tmp/code/noise_ab.sh
touch /tmp/res/ALL_DONE
