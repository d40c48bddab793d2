"""dlight-style schedule rules for CPU (llvm) and OpenCL targets."""
