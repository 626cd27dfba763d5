// kernels/m3/common/util.cuh
