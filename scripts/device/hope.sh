#!/usr/bin/env bash
# Branch placement (HOPE) on the emulated SoC at k = HOPE_K (default 12): PoCL on cores 0..k-1
# is the GPU, TVM's CPU kernels on k..15. Per model: the single-processor builds (cpu_only,
# gpu_only: tags cpu and gpu), ulayer_like and codl, the placement baselines (starpu, mosaic)
# and modes (hope, hope_greedy, codl_hope), all planned with k's shipped cost model
# (HOPE_COST_MODEL: another) and built in parallel; codl_hope also with `--verify 3` on the
# models with parallel branches (tag codl_hope_verify: compile's measured calibration, keeping
# the fastest of codl_hope and each processor alone); then every model timed round-robin with
# T*c and onnxruntime on the CPU stand-in's cores (what a user runs instead), and the timelines
# of codl, hope and codl_hope traced. The run JSON gives per model and build the plan's
# predicted makespan (predicted_ms), the measured median (median_ms) and their ratio
# (measured_over_predicted).
#
# Duration on the 16-core machine (after stage 2): builds 6-8 min (10 models x 9 builds),
# warming 3-4, --verify about 1.5 min per verified model, the run 4-5 min (3 rounds): about 16
# minutes with the defaults. Trim with HOPE_MODELS, HOPE_VERIFY_MODELS (none: no --verify),
# HOPE_ROUNDS, HOPE_MODES; or split over two leases: HOPE_VERIFY_MODELS=none on the first,
# HOPE_MODELS=<the verified models> on the second.
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${HOPE_MODELS:-vgg19,vgg16,yolov2,fst,retinaface,posenet,inception_v1,resnet50,squeezenet,bvlc_alexnet}
verify_models=${HOPE_VERIFY_MODELS:-inception_v1,retinaface,squeezenet}
modes=${HOPE_MODES:-ulayer_like,codl,starpu,mosaic,hope,hope_greedy,codl_hope}
# hope and codl_hope need OR-Tools' CP-SAT (`.whl2`, scripts/device/README.md): without it, say
# so once and stop before minutes of builds that cannot give the placement modes.
if [[ ",$modes," =~ ,(hope|codl_hope), ]] \
  && ! python3 -c "import ortools.sat.python.cp_model" 2> /dev/null; then
  echo "hope.sh: OR-Tools is not installed (install .whl2 first); not building $modes" \
    | tee /tmp/res/hope_NO_ORTOOLS
  exit 1
fi
k=${HOPE_K:-12}
cm=${HOPE_COST_MODEL:-codl_tvm/data/cost_models/emulated-soc-k$k.json}
b=/tmp/b/hope r=/tmp/res
export POCL_CPU_MAX_CU_COUNT=$k POCL_AFFINITY=1 TVM_NUM_THREADS=$((16 - k)) CODL_OPENCL_PLATFORM=portable
tvm_cpus=$k-15
python3 scripts/bench_planner.py compile --jobs 12 --preset emulated-soc --models "$models" \
  --modes "$modes" --cost-model $cm --out $b --keep-build-cache > $r/hope_compile.log 2>&1
touch $r/HOPE_BUILT
POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
  > $r/hope_warm.log 2>&1
touch $r/HOPE_WARM
# --verify times its candidates as `run` would: one model at a time, after the parallel builds
# (whose libraries it reuses from the build cache).
if [ "$verify_models" != none ]; then
  python3 scripts/bench_planner.py compile --preset emulated-soc --models "$verify_models" \
    --modes "$modes" --cost-model $cm --out $b --verify 3 --verify-mode codl_hope \
    --tvm-cpus $tvm_cpus --keep-build-cache > $r/hope_verify.log 2>&1
  POCL_AFFINITY=0 python3 scripts/bench_planner.py warm --dir $b --platform portable --jobs 15 \
    --models "$verify_models" >> $r/hope_warm.log 2>&1
fi
touch $r/HOPE_VERIFIED
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform portable \
    --tvm-cpus $tvm_cpus --rounds "${HOPE_ROUNDS:-3}" --number 2 --concurrent-s 1 \
    --plan-repeat 1 --onnxruntime --trace-dir $r/traces_hope --trace-also hope,hope_greedy,starpu,codl_hope --append \
    --out $r/hope_emulated_soc_k$k.json >> $r/hope_run.log 2>&1
done
rm -rf $r/traces_hope/*.png
touch $r/DONE
