#!/usr/bin/env bash
# H100: NVIDIA OpenCL is the GPU, TVM's CPU kernels on 16 threads. Same phases as soc.sh.
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${H100_MODELS:-inception_v1,squeezenet,posenet,retinaface,fst,bvlc_alexnet,vgg16,yolov2,resnet50,vgg19}
cm=codl_tvm/data/cost_models
b=/tmp/b/h100 r=/tmp/res
export TVM_NUM_THREADS=16 CODL_OPENCL_PLATFORM=nvidia
# H100_MODES: the planner variants (H100_WEIGHT_GBPS=CPU,GPU for the *_streaming ones);
# H100_ORACLE=none skips the oracle build; H100_VERIFY=0 skips the measured re-plans (`--verify`).
oracle=${H100_ORACLE:-codl_tvm/data/cost_models/datasets/oracle_h100.json}
common=(--preset device-h100 --models "$models" --cost-model $cm/device-h100.json
        --modes "${H100_MODES:-codl,codl_no_chain,h_only,oc_only,ulayer_like}" --out $b
        ${H100_WEIGHT_GBPS:+--weight-gbps "$H100_WEIGHT_GBPS"})
if [ "$oracle" != none ]; then common+=(--oracle "$oracle"); fi
python3 scripts/bench_planner.py compile --jobs 15 "${common[@]}" --keep-build-cache \
  > $r/h100_compile.log 2>&1
touch $r/H100_BUILT
python3 scripts/bench_planner.py warm --dir $b --platform nvidia --jobs 8 > $r/h100_warm.log 2>&1
if [ "${H100_VERIFY:-1}" != 0 ]; then
  python3 scripts/bench_planner.py compile "${common[@]}" --verify 3 \
    --verify-modes codl_no_chain,h_only,oc_only > $r/h100_verify.log 2>&1
fi
touch $r/H100_VERIFIED
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform nvidia \
    --rounds 3 --number 5 --trace-dir $r/traces_h100 --append \
    --out $r/planner_h100.json >> $r/h100_run.log 2>&1
done
touch $r/DONE
