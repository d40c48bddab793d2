#!/usr/bin/env bash
# Balance sweep and the contention-aware bound: for each k of BALANCE_K, PoCL on cores 0..k-1
# is the GPU and TVM's CPU kernels run on cores k..15. Per k: the single-processor builds and
# codl, planned with the shipped emulated-soc cost model and `--verify 3` at that k (compile's
# measured calibration scales each processor's predictions by its whole-model latency measured
# at that k, then keeps the fastest of codl's candidates and the processors alone); then every
# model is run round-robin with T*c measured in each round (--concurrent-s) and codl's timeline
# traced twice (as run, and serial: each kernel alone) for the gap breakdown.
# The single-processor builds do not depend on k: built once, copied into every k's folder.
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${BALANCE_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
cm=codl_tvm/data/cost_models/emulated-soc.json
r=/tmp/res
first=""
for k in ${BALANCE_K//,/ }; do
  b=/tmp/b/k$k
  export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
  if [ -n "$first" ]; then
    for m in ${models//,/ }; do
      mkdir -p $b/$m && cp -r /tmp/b/k$first/$m/cpu /tmp/b/k$first/$m/gpu $b/$m/ 2>/dev/null
    done
  fi
  python3 scripts/bench_planner.py compile --jobs 12 --preset emulated-soc --models "$models" \
    --modes codl --cost-model $cm --out $b --keep-build-cache > $r/k${k}_compile.log 2>&1
  POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
    > $r/k${k}_warm.log 2>&1
  python3 scripts/bench_planner.py compile --preset emulated-soc --models "$models" --modes codl \
    --cost-model $cm --out $b --verify 3 --verify-modes codl_no_chain,h_only,oc_only \
    --tvm-cpus $k-15 --keep-build-cache > $r/k${k}_verify.log 2>&1
  touch $r/K${k}_BUILT
  for m in ${models//,/ }; do
    python3 scripts/bench_planner.py run --dir $b --models "$m" --platform portable \
      --tvm-cpus $k-15 --rounds "${BALANCE_ROUNDS:-3}" --number 2 --concurrent-s 1 \
      --trace-dir $r/traces_k$k --append --out $r/balance_k$k.json >> $r/k${k}_run.log 2>&1
  done
  rm -rf $r/traces_k$k/*.png
  touch $r/K${k}_DONE
  first=${first:-$k}
done
touch $r/DONE
