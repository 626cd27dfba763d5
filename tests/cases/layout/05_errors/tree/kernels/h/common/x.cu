// kernels/h/common/x.cu
