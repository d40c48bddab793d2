#!/usr/bin/env bash
# One machine for issues 4 and 7: kernels.sh and cpu.sh (CPU-alone A/B variants, flag DONE),
# then the k = 12 profile of the carried campaigns and the refit (soc_k.sh with
# SOC_K_PROFILE_ONLY=1; PROFILE_LIMIT seconds per campaign), flag ALL_DONE.
set -u
bash /tmp/code/kernels.sh
bash /tmp/code/cpu.sh
SOC_K=12 SOC_K_PROFILE_ONLY=1 PROFILE_LIMIT=${PROFILE_LIMIT:-330} bash /tmp/code/soc_k.sh
touch /tmp/res/ALL_DONE
