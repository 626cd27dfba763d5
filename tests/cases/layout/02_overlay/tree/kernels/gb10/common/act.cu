// kernels/gb10/common/act.cu
