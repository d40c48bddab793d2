#!/usr/bin/env bash
# What NVIDIA's OpenCL compiler makes of every GPU kernel of the H100 dataset
# (scripts/nv_kernel_info.py measure): per kernel, ptxas's registers, stack, spill stores and
# loads, shared and constant memory (the build log under -cl-nv-verbose) and
# clGetKernelWorkGroupInfo, for the cost model's wave-tir-nv recipe. Needs no TVM, so no
# stage1/stage2: one call from the repository root, carrying .whl (pyopencl and what it
# imports) and .device/nvinfo (`python scripts/nv_kernel_info.py export` here):
#   bash scripts/device/nvinfo.sh        -> $OUT/nvinfo.json, $OUT/nvinfo.log
# Also a stage2 pipeline (pyopencl from stage1; NVINFO_DIR=<the call's root>/.device/nvinfo).
# About 2241 kernels at tens of ms each over NVINFO_JOBS processes: ~1 minute with 16.
set -euo pipefail
root=$PWD
dir=${NVINFO_DIR:-$root/.device/nvinfo}
script=$root/scripts/nv_kernel_info.py
[ -f "$script" ] || script=/tmp/code/scripts/nv_kernel_info.py
r=/tmp/res
mkdir -p $r /tmp/site /tmp/icd
if ! PYTHONPATH=/tmp/site python3 -c "import pyopencl" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    "$root"/.whl/pyopencl-*.whl "$root"/.whl/pytools-*.whl "$root"/.whl/platformdirs-*.whl \
    "$root"/.whl/siphash24-*.whl "$root"/.whl/typing_extensions-*.whl
fi
# no ICD file is installed there; a build ptxas has seen is answered from a cache (NVIDIA's,
# pyopencl's) without its log lines
echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 CUDA_CACHE_DISABLE=1 \
  PYOPENCL_NO_CACHE=1
status=0
python3 "$script" measure --dir "$dir" --out $r/nvinfo.json --jobs "${NVINFO_JOBS:-16}" \
  2>&1 | tee $r/nvinfo.log || status=$?
touch $r/DONE
if [ -n "${OUT:-}" ]; then cp $r/nvinfo.json $r/nvinfo.log "$OUT/" 2>/dev/null || true; fi
exit $status
