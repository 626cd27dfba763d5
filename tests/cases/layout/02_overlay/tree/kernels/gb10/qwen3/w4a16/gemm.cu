// kernels/gb10/qwen3/w4a16/gemm.cu
