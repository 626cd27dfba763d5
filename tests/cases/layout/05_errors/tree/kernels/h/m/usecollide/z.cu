// kernels/h/m/usecollide/z.cu
