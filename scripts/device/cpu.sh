#!/usr/bin/env bash
# The CPU alone on the device machine: whole models as `codl-tvm compile --device cpu`
# builds them (tag cpualone), A/B against CPUConfig changes, then per-kernel times.
# VARIANTS: space-separated TAG=KEY:VALUE,KEY:VALUE CPUConfig overrides, each one more build of
# every model as the CPU-alone build plus the overrides (default: the settings before
# CPU_ALONE_SETTINGS, 1x1 convs packed up to 400 pixels from 256 channels, unchunked). Before
# CPU_ALONE_SETTINGS existed the variants were chunk=packed_chunk_bytes:262144 and
# chunkall=packed_chunk_bytes:262144,packed_max_gemm_pixels:1000000,packed_min_gemm_channels:48.
set -u
. /tmp/code/env.sh
cd /tmp/code
rm -rf /tmp/b/cpu_models
r=/tmp/res
models=${CPU_MODELS:-resnet50,posenet,inception_v1,squeezenet}
variants=${VARIANTS:-before=packed_chunk_bytes:0,packed_max_gemm_pixels:400,packed_min_gemm_channels:256}
export TVM_NUM_THREADS=8
# One process per variant (each compiles the models in turn): they share the directory's
# manifest, merged under a lock.
common=(--constant-weights --models "$models" --out /tmp/b/cpu_models)
python3 scripts/bench_cpu_models.py compile "${common[@]}" --tag cpualone --winograd --packed \
  --cpu-alone > $r/compile_cpualone.log 2>&1 &
for v in $variants; do
  tag=${v%%=*} cfg=()
  IFS=, read -ra pairs <<< "${v#*=}"
  for kv in "${pairs[@]}"; do cfg+=(--cpu-config "${kv/:/=}"); done
  python3 scripts/bench_cpu_models.py compile "${common[@]}" --tag "$tag" --winograd --packed \
    --cpu-alone "${cfg[@]}" > "$r/compile_$tag.log" 2>&1 &
done
wait
touch $r/BUILT
python3 scripts/bench_cpu_models.py run --dir /tmp/b/cpu_models --threads 8 --rounds "${ROUNDS:-15}" \
  --out $r/cpu_models_8threads_constant.json > $r/cpu_models_run.log 2>&1
touch $r/RUN
python3 scripts/bench_cpu_models.py layers --dir /tmp/b/cpu_models --threads 8 --runs 10 \
  --models "${LAYER_MODELS:-resnet50-cpualone,resnet50-before,posenet-cpualone,posenet-before}" \
  --out $r/cpu_layers.json > $r/cpu_layers.log 2>&1
touch $r/DONE
