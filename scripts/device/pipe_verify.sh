#!/usr/bin/env bash
# compile --objective throughput --verify on the emulated big/little clusters (pipeline.sh's
# groups without the GPU): per model in PIPE_MODELS, the candidates (the plans on the loaded
# and the alone matrix, the whole model as one stage) built and streamed PIPE_VERIFY frames in
# three rotated rounds; the kept artifact's manifest (its "verify" record) and the log go to
# /tmp/res.
set -u
. /tmp/code/env.sh
cd /tmp/code
r=/tmp/res
mkdir -p /tmp/b/verify
for m in ${PIPE_MODELS//,/ }; do
  python3 -c "import sys, onnx; from codl_tvm.frontend.models import benchmark_model; onnx.save(benchmark_model(sys.argv[1]), sys.argv[2])" "$m" "/tmp/b/verify/$m.onnx"
  python3 -m codl_tvm.cli compile "/tmp/b/verify/$m.onnx" -o "/tmp/b/verify/$m" --objective throughput \
    --groups big:1-8,little:9-15 --isa little=x86-64-v3-nofma --verify "${PIPE_VERIFY:-48}" \
    > "$r/verify_$m.log" 2>&1
  cp "/tmp/b/verify/$m/pipeline.json" "$r/verify_$m.json" 2>/dev/null
done
touch $r/DONE
