#!/usr/bin/env bash
# One machine, two pipelines: the emulated-SoC A/B of soc_alone.sh (its SOC_* settings; with
# SOC_ALONE_SKIP_PROFILE=1 unless a CPU-alone campaign is carried), then h100.sh (its H100_*
# settings). Wait for SOC_DONE_AB, then DONE (written by h100.sh only). Logs: pipeline_soc.log,
# pipeline_h100.log.
set -u
SOC_ALONE_DONE_FLAG=SOC_DONE_AB bash /tmp/code/soc_alone.sh > /tmp/res/pipeline_soc.log 2>&1
bash /tmp/code/h100.sh > /tmp/res/pipeline_h100.log 2>&1
