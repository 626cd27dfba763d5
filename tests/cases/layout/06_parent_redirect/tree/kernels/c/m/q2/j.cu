// kernels/c/m/q2/j.cu
