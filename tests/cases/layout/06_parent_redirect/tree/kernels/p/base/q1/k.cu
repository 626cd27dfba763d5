// kernels/p/base/q1/k.cu
