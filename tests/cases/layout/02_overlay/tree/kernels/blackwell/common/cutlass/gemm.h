// kernels/blackwell/common/cutlass/gemm.h
