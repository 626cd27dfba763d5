// kernels/hopper/alias/own/ignored.cu
