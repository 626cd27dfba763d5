// kernels/gb10/common/bw.cuh
