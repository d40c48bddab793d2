#!/usr/bin/env bash
# PoCL's dense kernel changed (codl's GEMM path for batch 1, schedules/presets.py POCL): measure
# the GPU dense parts again at split k (SOC_K, default 12), refit the k-alone cost model without
# the old GPU dense records (dlight's GEMV, impl "reduction"), then refine.sh with it.
#   here:  python scripts/profile_campaign.py --preset emulated-soc --threads 4 --models \
#            vgg19,vgg16,resnet50,inception_v1,bvlc_alexnet --dense 30 --only dense:gpu \
#            --out .device/prof_k12_dense   (carry .device/prof_k12_dense.tar.xz in call 2)
#   there: SOC_K=12 bash /tmp/code/dense_refit.sh (started by stage2.sh dense_refit.sh)
. /tmp/code/split_env.sh  # K, r, p, cm and the split's environment
mkdir -p /tmp/prof
tar -xJf /tmp/code/prof_k${K}_dense.tar.xz -C /tmp/prof
timeout "${PROFILE_LIMIT:-420}" python3 -m codl_tvm.cli profile --run-dir /tmp/prof/prof_k${K}_dense \
  --tvm-cpus $K-15 -o $r/emulated_soc_k${K}_dense.jsonl > $r/profile_dense.log 2>&1
touch $r/PROFILED
data=($p/emulated_soc_k$K.jsonl $p/emulated_soc_k${K}_alone.jsonl $r/emulated_soc_k${K}_dense.jsonl)
drop=(--drop dense:gpu:reduction)
python3 -m codl_tvm.cli cost-model fit "${data[@]}" "${drop[@]}" --kind gbdt \
  -o /tmp/heldout_dense.json > $r/fit_dense.log 2>&1
python3 -m codl_tvm.cli cost-model eval /tmp/heldout_dense.json "${data[@]}" --json \
  > $r/cost_model_eval_k${K}_dense.json 2>> $r/fit_dense.log
python3 -m codl_tvm.cli cost-model fit "${data[@]}" "${drop[@]}" --kind gbdt --holdout 0 \
  -o /tmp/refit.json >> $r/fit_dense.log 2>&1 && cp /tmp/refit.json $cm/emulated-soc-k$K-alone.json
cp $cm/emulated-soc-k$K-alone.json $r/
touch $r/FITTED
bash /tmp/code/refine.sh
