// kernels/hopper/strict/bf16/x.cu
