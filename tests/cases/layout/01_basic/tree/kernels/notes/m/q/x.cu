// kernels/notes/m/q/x.cu
