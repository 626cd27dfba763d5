// kernels/h/lib/z.cu
