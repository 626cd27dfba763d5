// kernels/m3/common/common.h
