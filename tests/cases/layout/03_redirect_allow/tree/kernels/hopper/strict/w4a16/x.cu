// kernels/hopper/strict/w4a16/x.cu
