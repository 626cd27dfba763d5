// kernels/hopper/common/helper.cpp
