// kernels/hopper/common/rmsnorm.cu
