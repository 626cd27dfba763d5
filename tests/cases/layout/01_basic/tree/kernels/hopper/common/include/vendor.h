// kernels/hopper/common/include/vendor.h
