// kernels/hopper/common/norm.cu
