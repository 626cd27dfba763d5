// kernels/hopper/alias/w4a16/ignored.cu
