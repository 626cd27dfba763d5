// kernels/h/m/blank/w.cu
