#!/usr/bin/env bash
# `compile --verify --refine` on the emulated SoC of split k (SOC_K, default 12): build cpu, gpu
# and codl (the committed k-alone cost model) in parallel, then codl_verify one model at a time
# (--verify VERIFY_ROUNDS, --refine REFINE_ROUNDS from timelines taken here, TVM pinned to its
# cores as `run` pins it), warm, and time every variant round-robin.
#   there: SOC_K=12 SOC_MODELS=fst,vgg16,vgg19,yolov2 bash /tmp/code/verify_refine.sh
#          (started by stage2.sh verify_refine.sh)
. /tmp/code/split_env.sh  # K, r, p, cm and the split's environment
models=${SOC_MODELS:-fst,vgg16,vgg19,yolov2}
b=/tmp/b/soc tvm_cpus=$K-15
python3 scripts/bench_planner.py compile --jobs 12 --preset emulated-soc --models "$models" \
  --modes "${SOC_MODES:-codl}" --cost-model "$cm/emulated-soc-k$K-alone.json" --out $b \
  --keep-build-cache > $r/soc_compile.log 2>&1
touch $r/BUILT
POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
  > $r/soc_warm.log 2>&1
touch $r/WARM
# codl_verify reuses the parallel builds from the build cache and times itself, one model at
# a time
python3 scripts/bench_planner.py compile --jobs 1 --preset emulated-soc --models "$models" \
  --modes "${SOC_MODES:-codl}" --cost-model "$cm/emulated-soc-k$K-alone.json" --out $b \
  --verify "${VERIFY_ROUNDS:-5}" --verify-refine "${REFINE_ROUNDS:-1}" --tvm-cpus $tvm_cpus \
  >> $r/soc_compile.log 2>&1
touch $r/VERIFIED
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform portable \
    --tvm-cpus $tvm_cpus --rounds "${SOC_ROUNDS:-9}" --number 2 --trace-dir $r/traces_soc \
    --append --out $r/planner_verify_refine_soc_k$K.json >> $r/soc_run.log 2>&1
done
touch $r/DONE
