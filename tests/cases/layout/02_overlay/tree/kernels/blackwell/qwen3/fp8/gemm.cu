// kernels/blackwell/qwen3/fp8/gemm.cu
