// kernels/h/m/ok/w.cu
