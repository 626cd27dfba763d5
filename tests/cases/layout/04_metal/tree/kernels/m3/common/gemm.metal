// kernels/m3/common/gemm.metal
