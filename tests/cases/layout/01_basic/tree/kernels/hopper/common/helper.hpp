// kernels/hopper/common/helper.hpp
