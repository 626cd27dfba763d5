// kernels/m3/common/legacy.cu
