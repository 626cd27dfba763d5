// kernels/gb10/common/norm.cu
