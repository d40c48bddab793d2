#!/usr/bin/env bash
# The GPU's data type on the H100 (NVIDIA OpenCL): each model on the GPU alone with buffers
# (`gpu`), images (`gpu_image`), half-precision buffers (`gpu_fp16`), images in half precision
# (`gpu_image_fp16`) and what `--gpu-data-type auto` keeps after timing buffers against images
# here (`gpu_auto`), and codl's plan co-executed with the GPU parts on buffers (`codl`) and on
# images (`codl_image`), timed round-robin beside the CPU alone on 16 threads (bench_planner.py).
set -u
. /tmp/code/env.sh
cd /tmp/code
models=${IMG_MODELS:-inception_v1,squeezenet,posenet,retinaface,fst,bvlc_alexnet,vgg16,yolov2,resnet50,vgg19}
b=/tmp/b/images_h100 r=/tmp/res
export TVM_NUM_THREADS=16 CODL_OPENCL_PLATFORM=nvidia
common=(--preset device-h100 --models "$models" --modes "${IMG_MODES:-codl,codl_image}" --out $b
        --cost-model codl_tvm/data/cost_models/device-h100.json
        --gpu-variants "${IMG_VARIANTS:-image,fp16,image_fp16,auto}")
python3 scripts/bench_planner.py compile --jobs 15 "${common[@]}" > $r/images_compile.log 2>&1
touch $r/IMAGES_BUILT
python3 scripts/bench_planner.py warm --dir $b --platform nvidia --jobs 8 > $r/images_warm.log 2>&1
for m in ${models//,/ }; do
  python3 scripts/bench_planner.py run --dir $b --models "$m" --platform nvidia \
    --rounds "${IMG_ROUNDS:-5}" --number 5 --plan-repeat 0 --concurrent-s 0 --append \
    --out $r/images_h100.json >> $r/images_run.log 2>&1
done
touch $r/DONE
