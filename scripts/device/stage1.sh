#!/usr/bin/env bash
# Device call 1: TVM (runtime part), tvm-ffi, pyopencl and xgboost into /tmp/site; keep the
# first part of the compressed compiler library for call 2.
set -euo pipefail
mkdir -p /tmp/site
tar -xJf .whl/tvm-runtime.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
cp .device/tvmc/tvmc.part.aa /tmp/
PYTHONPATH=/tmp/site python3 -c "import xgboost, onnxruntime; print('xgboost', xgboost.__version__)"
nproc; nvidia-smi -L || true
