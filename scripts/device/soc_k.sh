#!/usr/bin/env bash
# The emulated SoC at another split (to choose k): measure the campaigns compiled here for
# that split, fit its cost model and measured oracle, then soc.sh with them.
# SOC_K_PROFILE_ONLY=1 stops after the fit (then soc.sh on another machine, with the dataset and
# model committed); PROFILE_LIMIT (seconds, default 840) bounds each campaign's profiling, which
# resumes where a cut one stopped (PROFILE_LIMIT_ALGOS: the algorithms' campaign's own bound).
# Trim the campaigns to the benchmarked models (scripts/device/subset_campaign.py) to fit one
# machine.
#   here: python scripts/profile_campaign.py --preset emulated-soc --threads $((16-K)) ... \
#           --out .device/prof_kK (direct, GPU and CPU parts), --codl/--pow2 without --models
#           --out .device/prof_kK_sampled (optional) and --algorithms winograd,packed
#           --out .device/prof_kK_algos; carry the .tar.xz in call 2 (stage2 copies them)
#   there: SOC_K=K bash /tmp/code/soc_k.sh (started by stage2.sh soc_k.sh with SOC_K exported)
. /tmp/code/split_env.sh  # K, r, p, cm and the split's environment
mkdir -p /tmp/prof
# the sampled shapes (prof_kK_sampled, when carried) go into the direct dataset
for t in prof_k$K prof_k${K}_sampled prof_k${K}_algos; do
  [ -f /tmp/code/$t.tar.xz ] || continue
  tar -xJf /tmp/code/$t.tar.xz -C /tmp/prof
  sfx=${t#prof_k$K}
  out=$p/emulated_soc_k$K${sfx/_sampled/}.jsonl
  # A dataset measured before its header recorded the timing protocol resumes only with the
  # protocol of then (codl-tvm profile refuses another); new datasets take the defaults.
  timing=$(python3 -c "import json,sys; h=json.loads(open(sys.argv[1]).readline()); \
print('' if 'timing' in h.get('meta', {}) else '--repeats 5 --number 3 --min-repeat-ms 0')" \
    "$out" 2>/dev/null || true)
  limit=${PROFILE_LIMIT:-840}
  if [ "$sfx" = _algos ]; then limit=${PROFILE_LIMIT_ALGOS:-$limit}; fi
  # shellcheck disable=SC2086
  timeout "$limit" python3 -m codl_tvm.cli -v profile --run-dir /tmp/prof/$t --tvm-cpus $K-15 \
    $timing -o "$out" > $r/profile_$t.log 2>&1
  cp "$out" $r/  # each campaign's records as soon as it ends (a lease may end first)
done
touch $r/PROFILED
# SOC_K_FIT=0: a campaign cut by PROFILE_LIMIT stops here (fitted here once it is complete)
if [ "${SOC_K_FIT:-1}" = 0 ]; then touch $r/DONE; exit 0; fi
# Evaluated on a held-out 30% (a model fitted without it), shipped fitted on everything: the
# campaign holds the benchmarked models' own parts, and a model that never saw 30% of them
# planned VGG16's fc layers from guesses (k = 12: 187 ms against 84 on the CPU).
python3 -m codl_tvm.cli cost-model fit $p/emulated_soc_k$K.jsonl $p/emulated_soc_k${K}_algos.jsonl \
  --kind gbdt -o /tmp/heldout_k$K.json > $r/fit.log 2>&1
python3 -m codl_tvm.cli cost-model eval /tmp/heldout_k$K.json $p/emulated_soc_k$K.jsonl \
  $p/emulated_soc_k${K}_algos.jsonl --json > $r/cost_model_eval_k$K.json 2>> $r/fit.log
python3 -m codl_tvm.cli cost-model fit $p/emulated_soc_k$K.jsonl $p/emulated_soc_k${K}_algos.jsonl \
  --kind gbdt --holdout 0 -o $cm/emulated-soc-k$K.json >> $r/fit.log 2>&1
python3 -m codl_tvm.cli cost-model fit $p/emulated_soc_k$K.jsonl --kind measured --holdout 0 \
  -o $p/oracle_emulated_soc_k$K.json >> $r/fit.log 2>&1
cp $cm/emulated-soc-k$K.json $p/oracle_emulated_soc_k$K.json $r/
touch $r/FITTED
if [ "${SOC_K_PROFILE_ONLY:-0}" = 1 ]; then touch $r/DONE; exit 0; fi
SOC_K=$K SOC_COST_MODEL=$cm/emulated-soc-k$K.json SOC_ORACLE=$p/oracle_emulated_soc_k$K.json \
CPU_MODELS=${CPU_MODELS:-squeezenet} \
SOC_MODELS=${SOC_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet} \
  bash /tmp/code/soc.sh
