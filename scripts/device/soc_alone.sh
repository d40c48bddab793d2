#!/usr/bin/env bash
# Co-executed builds with the CPU-alone kernels: measure the campaign of CPU-alone
# Winograd/packed kernels of split k, fit emulated-soc-kK-alone.json from the direct dataset of
# that split (committed) and this one, then soc.sh with it. A cost model fitted with CPU-alone
# data makes every co-executed build use those kernels, so the planner, its fallback and the
# CPU-alone baseline all see the same CPU kernels.
#   here: python scripts/profile_campaign.py --preset emulated-soc --threads $((16-K)) \
#           --models ... --algorithms winograd,packed --cpu-alone --out .device/prof_kK_alone
#         and carry .device/prof_kK_alone.tar.xz in call 2 (stage2 copies it)
#   there: SOC_K=K bash /tmp/code/soc_alone.sh (started by stage2.sh soc_alone.sh)
# SOC_ALONE_PROFILE_ONLY=1 stops after the fit; SOC_ALONE_SKIP_PROFILE=1 uses the committed
# model (a second machine); SOC_ALONE_DONE_FLAG names the final flag (default DONE); other
# SOC_* settings go to soc.sh. AlexNet is back among the models
# since PoCL's dense kernel changed: its GPU build is no longer 25x slower than its CPU build.
. /tmp/code/split_env.sh  # K, r, p, cm and the split's environment
model=$cm/emulated-soc-k$K-alone.json
if [ "${SOC_ALONE_SKIP_PROFILE:-0}" != 1 ]; then
  mkdir -p /tmp/prof
  tar -xJf /tmp/code/prof_k${K}_alone.tar.xz -C /tmp/prof
  timeout "${PROFILE_LIMIT:-840}" python3 -m codl_tvm.cli profile --run-dir /tmp/prof/prof_k${K}_alone \
    --tvm-cpus $K-15 -o $p/emulated_soc_k${K}_alone.jsonl > $r/profile_alone.log 2>&1
  cp $p/emulated_soc_k${K}_alone.jsonl $r/
  touch $r/PROFILED
  # Evaluated on a held-out 30%, shipped fitted on everything (as soc_k.sh).
  data=($p/emulated_soc_k$K.jsonl $p/emulated_soc_k${K}_alone.jsonl)
  python3 -m codl_tvm.cli cost-model fit "${data[@]}" --kind gbdt -o /tmp/heldout_alone.json \
    > $r/fit_alone.log 2>&1
  python3 -m codl_tvm.cli cost-model eval /tmp/heldout_alone.json "${data[@]}" --json \
    > $r/cost_model_eval_k${K}_alone.json 2>> $r/fit_alone.log
  python3 -m codl_tvm.cli cost-model fit "${data[@]}" --kind gbdt --holdout 0 -o $model \
    >> $r/fit_alone.log 2>&1
  cp $model $r/
  touch $r/FITTED
  if [ "${SOC_ALONE_PROFILE_ONLY:-0}" = 1 ]; then touch $r/${SOC_ALONE_DONE_FLAG:-DONE}; exit 0; fi
fi
SOC_K=$K SOC_COST_MODEL=$model SOC_ORACLE=${SOC_ORACLE:-$p/oracle_emulated_soc_k$K.json} \
CPU_MODELS=${CPU_MODELS:-none} \
SOC_MODELS=${SOC_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet} \
  bash /tmp/code/soc.sh
touch $r/${SOC_ALONE_DONE_FLAG:-DONE}
