// kernels/hopper/base/fp8/gemm.cu
