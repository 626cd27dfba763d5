// kernels/h/common/y.cu
