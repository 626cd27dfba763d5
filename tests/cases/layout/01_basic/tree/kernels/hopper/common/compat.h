// kernels/hopper/common/compat.h
