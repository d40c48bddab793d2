#!/usr/bin/env bash
# Balance sweep and the contention-aware bound: for each k of BALANCE_K, PoCL on cores 0..k-1
# is the GPU and TVM's CPU kernels run on cores k..15. Per k: codl planned with the shipped
# k = 12 cost model (PoCL profiled on 12 cores, TVM on 4 threads) with each processor's
# predictions scaled by its core count, CPU x 4/(16-k) and GPU x 12/k (compile_artifact's
# processor_scale; no --verify, whose timing is serial per model and costs ~2 minutes a model
# and k); then every model is run round-robin with T*c measured in each round (--concurrent-s)
# and codl's timeline traced twice (as run, and serial: each kernel alone) for the gap breakdown.
# The single-processor builds do not depend on k: built once with the first k's codl, copied
# into the other k's folders, whose codl builds then run together.
# BALANCE_JOBS: parallel builds in all (15 on the 16-core machine; more on a larger host, where
# the timed runs still use cores 0..15 only).
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${BALANCE_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
ks=(${BALANCE_K//,/ })
jobs=${BALANCE_JOBS:-15}
cm=codl_tvm/data/cost_models/emulated-soc-k12.json
r=/tmp/res
scale() { python3 -c "print(f'{4 / (16 - $1):.6g},{12 / $1:.6g}')"; }
compile_k() {  # k, parallel jobs
  python3 scripts/bench_planner.py compile --jobs "$2" --preset emulated-soc --models "$models" \
    --modes codl --cost-model $cm --processor-scale "$(scale "$1")" --out /tmp/b/k$1 \
    > $r/k$1_compile.log 2>&1
}
first=${ks[0]}
compile_k "$first" "$jobs"
rest=$(( ${#ks[@]} > 1 ? ${#ks[@]} - 1 : 1 ))
for k in "${ks[@]:1}"; do
  for m in ${models//,/ }; do
    mkdir -p /tmp/b/k$k/$m && cp -r /tmp/b/k$first/$m/cpu /tmp/b/k$first/$m/gpu /tmp/b/k$k/$m/ 2>/dev/null
  done
  mkdir -p /tmp/b/k$k/models && cp /tmp/b/k$first/models/* /tmp/b/k$k/models/ 2>/dev/null
  compile_k "$k" $(( (jobs + rest - 1) / rest )) &
done
wait
touch $r/BUILT
# Each PoCL kernel's first compile, with the compute-unit count it will run with.
for k in "${ks[@]}"; do
  CODL_OPENCL_PLATFORM=portable POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=0 \
    python3 scripts/bench_planner.py warm \
    --dir /tmp/b/k$k --platform portable --jobs "$jobs" > $r/k${k}_warm.log 2>&1
done
touch $r/WARM
for k in "${ks[@]}"; do
  export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
  for m in ${models//,/ }; do
    python3 scripts/bench_planner.py run --dir /tmp/b/k$k --models "$m" --platform portable \
      --tvm-cpus $k-15 --rounds "${BALANCE_ROUNDS:-3}" --number 2 --concurrent-s 1 \
      --trace-dir $r/traces_k$k --append --out $r/balance_k$k.json >> $r/k${k}_run.log 2>&1
  done
  rm -rf $r/traces_k$k/*.png
  touch $r/K${k}_DONE
done
python3 scripts/bench_planner.py balance \
  --results "$(ls $r/balance_k*.json | paste -sd, -)" --out $r/balance.json --plot $r/balance.png \
  > $r/balance_table.log 2>&1
touch $r/DONE
