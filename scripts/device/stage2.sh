#!/usr/bin/env bash
# Device call 2: assemble the compiler library, lay out the package as pip would install it
# (passes/ and schedules/ inside codl_tvm/), check it imports and loads both cost models, then
# start pipeline $1 detached (it outlives this call; wait.sh collects its results).
set -euo pipefail
pipeline=${1:?usage: stage2.sh PIPELINE.sh}
test -f /tmp/tvmc.part.aa || { echo "stage1.sh has not run on this machine" >&2; exit 3; }
pkill -f "bash /tmp/code/(soc|h100|all|soc_algos|soc_k|soc_alone|soc_ab_h100|ksweep|cpu|cpu_soc|kernels|kernels_cpu|kernels_cpu_h100|soc_noise|noise_ab|refine|dense_pocl|dense_refit|verify_refine|balance|cold|hope|pipeline|never_slower|images_h100|dtype_h100|seq).sh" || true
pkill -f "scripts/bench_" || true
rm -rf /tmp/res /tmp/b /tmp/code
mkdir -p /tmp/res /tmp/code
cat /tmp/tvmc.part.aa .device/tvmc2/tvmc.part.a[b-z] | xz -d -T4 > /tmp/site/tvm/lib/libtvm_compiler.so
cp -r codl_tvm scripts /tmp/code/
# Plain copies of the shipped datasets: the pipelines read them by these names and append to them.
gunzip -kf /tmp/code/codl_tvm/data/cost_models/datasets/*.jsonl.gz
# A dataset a cut profiling run left (carried in .device/datasets/): the run resumes it.
for f in .device/datasets/*.jsonl; do if [ -f "$f" ]; then cp "$f" /tmp/code/codl_tvm/data/cost_models/datasets/; fi; done
rm -rf /tmp/code/codl_tvm/passes /tmp/code/codl_tvm/schedules
cp -r passes /tmp/code/codl_tvm/passes
cp -r schedules /tmp/code/codl_tvm/schedules
cp scripts/device/*.sh /tmp/code/
cp .device/plugin/codl_tvm_opencl.so .device/plugin/COMMIT /tmp/code/
# Profiling campaigns compiled here (soc_algos.sh, soc_k.sh), when carried.
for f in .device/*.tar.xz; do if [ -f "$f" ]; then cp "$f" /tmp/code/; fi; done
. /tmp/code/env.sh
cd /tmp/code
python3 - <<'PY'
import tvm
from tvm import relax  # noqa: F401  (needs the compiler library)

import codl_tvm.passes  # noqa: F401
import codl_tvm.schedules  # noqa: F401
from codl_tvm.cost_model import load_model

for name in ("emulated-soc", "device-h100"):
    print(name, type(load_model(f"codl_tvm/data/cost_models/{name}.json")).__name__)
print("tvm", tvm.__version__, "ok")
PY
setsid nohup bash "/tmp/code/$pipeline" > /tmp/res/pipeline.log 2>&1 < /dev/null &
echo "started $pipeline"
