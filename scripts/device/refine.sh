#!/usr/bin/env bash
# Plans refined from timelines (`codl-tvm refine`, bench_planner.py refine) on the emulated SoC
# of split k (SOC_K, default 12): build cpu, gpu and codl (the committed k-alone cost model),
# warm them, refine codl into codl_refined from timelines taken here, warm, refine again into
# codl_refined2 (REFINE_ROUNDS=1 stops after one), warm, then time every variant round-robin.
#   there: SOC_K=12 SOC_MODELS=vgg19,vgg16,yolov2,fst bash /tmp/code/refine.sh
#          (started by stage2.sh refine.sh)
. /tmp/code/split_env.sh  # K, r, p, cm and the split's environment
models=${SOC_MODELS:-vgg19,vgg16,yolov2,fst}
b=/tmp/b/soc tvm_cpus=$K-15
python3 scripts/bench_planner.py compile --jobs 12 --preset emulated-soc --models "$models" \
  --modes "${SOC_MODES:-codl}" --cost-model "$cm/emulated-soc-k$K-alone.json" --out $b \
  > $r/soc_compile.log 2>&1
touch $r/BUILT
POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
  > $r/soc_warm.log 2>&1
touch $r/WARM
src=codl
for round in $(seq "${REFINE_ROUNDS:-2}"); do
  tag=codl_refined; [ "$round" = 1 ] || tag=codl_refined$round
  python3 scripts/bench_planner.py refine --dir $b --from $src --tag $tag --platform portable \
    --tvm-cpus $tvm_cpus --traces "${REFINE_TRACES:-5}" --jobs 12 >> $r/refine.log 2>&1
  POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
    --models "$models" >> $r/soc_warm.log 2>&1
  touch $r/REFINED$round
  src=$tag
done
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform portable \
    --tvm-cpus $tvm_cpus --rounds "${SOC_ROUNDS:-7}" --number 2 --trace-dir $r/traces_soc \
    --append --sync-mode "${SOC_SYNC_MODE:-auto}" --out $r/planner_refined_soc_k$K.json \
    >> $r/soc_run.log 2>&1
done
touch $r/DONE
