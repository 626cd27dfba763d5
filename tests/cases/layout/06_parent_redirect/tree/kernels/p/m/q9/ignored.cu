// kernels/p/m/q9/ignored.cu
