// kernels/hopper/base/int4/gemm.cu
