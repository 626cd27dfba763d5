// kernels/h/m/dead/z.cu
