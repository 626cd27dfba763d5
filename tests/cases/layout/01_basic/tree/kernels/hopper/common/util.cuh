// kernels/hopper/common/util.cuh
