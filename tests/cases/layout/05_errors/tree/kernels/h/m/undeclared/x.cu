// kernels/h/m/undeclared/x.cu
