// kernels/m3/llama/q4/gemm.metal
