#!/usr/bin/env bash
# The CPU alone on the device machine (issue 4): whole models as `codl-tvm compile --device cpu`
# builds them (tag cpualone), A/B against one CPUConfig change, then per-kernel times.
# AB_CONFIG: the CPUConfig override of the "ab" variant (default: Winograd on every tile count,
# the rule before winograd_min_tiles); the "packed" variant has no Winograd.
set -u
. /tmp/code/env.sh
cd /tmp/code
rm -rf /tmp/b/cpu_models
r=/tmp/res
models=${CPU_MODELS:-resnet50,inception_v1,squeezenet}
ab=${AB_CONFIG:-winograd_min_tiles=0}
export TVM_NUM_THREADS=8
# One process per variant (each compiles the models in turn): they share the directory's
# manifest, and nine processes finishing together lost each other's entries.
common=(--constant-weights --models "$models" --out /tmp/b/cpu_models)
python3 scripts/bench_cpu_models.py compile "${common[@]}" --tag cpualone --winograd --packed \
  > $r/compile_cpualone.log 2>&1 &
sleep 20
python3 scripts/bench_cpu_models.py compile "${common[@]}" --tag ab --winograd --packed \
  --cpu-config "$ab" > $r/compile_ab.log 2>&1 &
sleep 20
python3 scripts/bench_cpu_models.py compile "${common[@]}" --tag packed --packed \
  > $r/compile_packed.log 2>&1 &
wait
touch $r/BUILT
python3 scripts/bench_cpu_models.py run --dir /tmp/b/cpu_models --threads 8 --rounds 5 \
  --out $r/cpu_models_8threads_constant.json > $r/cpu_models_run.log 2>&1
python3 scripts/bench_cpu_models.py layers --dir /tmp/b/cpu_models --threads 8 --runs 10 \
  --models "${LAYER_MODELS:-resnet50-cpualone,resnet50-ab}" --out $r/cpu_layers.json \
  > $r/cpu_layers.log 2>&1
touch $r/DONE
