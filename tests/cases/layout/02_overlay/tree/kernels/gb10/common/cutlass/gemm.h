// kernels/gb10/common/cutlass/gemm.h
