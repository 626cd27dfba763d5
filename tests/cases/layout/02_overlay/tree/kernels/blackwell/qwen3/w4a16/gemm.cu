// kernels/blackwell/qwen3/w4a16/gemm.cu
