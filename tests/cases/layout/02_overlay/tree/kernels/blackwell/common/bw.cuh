// kernels/blackwell/common/bw.cuh
