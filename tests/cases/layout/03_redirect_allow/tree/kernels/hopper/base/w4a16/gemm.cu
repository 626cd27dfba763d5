// kernels/hopper/base/w4a16/gemm.cu
