// kernels/shared/fast.cuh
