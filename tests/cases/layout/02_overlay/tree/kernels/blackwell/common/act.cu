// kernels/blackwell/common/act.cu
