# Sourced by the pipelines: the installed packages, both OpenCL platforms (no ICD file is
# installed there), the prebuilt runtime plugin, on-disk program caches, the commit measured.
export PYTHONPATH=/tmp/site:/tmp/code PYTHONUNBUFFERED=1
mkdir -p /tmp/icd
echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
cp /etc/OpenCL/vendors/pocl.icd /tmp/icd/ 2>/dev/null || true
export OCL_ICD_VENDORS=/tmp/icd
export CODL_TVM_PLUGIN_LIB=/tmp/code/codl_tvm_opencl.so
export CODL_TVM_CACHE_DIR=/tmp/codl-cache POCL_CACHE_DIR=/tmp/pocl-cache
CODL_TVM_COMMIT=$(cat /tmp/code/COMMIT)
export CODL_TVM_COMMIT
