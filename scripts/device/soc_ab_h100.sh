#!/usr/bin/env bash
# One machine, two pipelines: the emulated-SoC A/B of soc_alone.sh (its SOC_* settings), then
# h100.sh (its H100_* settings). soc_alone.sh's DONE becomes SOC_DONE_AB; h100.sh writes DONE.
set -u
bash /tmp/code/soc_alone.sh
mv /tmp/res/DONE /tmp/res/SOC_DONE_AB
mv /tmp/res/pipeline.log /tmp/res/pipeline_soc.log 2>/dev/null || true
bash /tmp/code/h100.sh
