// kernels/hopper/common/rope.cu
