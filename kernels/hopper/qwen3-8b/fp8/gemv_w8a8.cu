// W8A8 FP8 GEMV for decode on Hopper: FP8 E4M3 weights with a per-row scale, an activation
// quantised by common/fp8_act_quant.cu (E4M3 with one fp32 scale), fp32 accumulation:
//   y[n] = (sum_k e4m3(W[n, k]) * e4m3(xq[k])) * w_scales[n] * x_scale[0]
// W is [N, K] E4M3 bytes, w_scales [N] fp32, xq [K] E4M3 bytes, x_scale [1] fp32, y [N] bf16.
// Launch: one warp per output row; grid = (ceil(N / warps_per_block)), block = (32 * warps).
#include <cuda_fp8.h>
#include <stdint.h>

#include "../../common/arch_tuning.cuh"
#include "../../common/bf16_util.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "gemv_w8a8.cu is a Hopper (sm_90+) kernel"
#endif

__device__ __forceinline__ float e4m3_to_f32(uint8_t byte) {
    __nv_fp8_e4m3 v;
    v.__x = byte;
    return (float)v;
}

extern "C" __global__ void gemv_w8a8_fp8(bf16_t* __restrict__ y, const uint8_t* __restrict__ w,
                                         const float* __restrict__ w_scales,
                                         const uint8_t* __restrict__ xq,
                                         const float* __restrict__ x_scale, int n_rows, int k) {
    constexpr int kUnroll = METRALE_GEMV_UNROLL;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const uint8_t* wr = w + (size_t)row * k;
    float acc = 0.0f;
#pragma unroll kUnroll
    for (int i = lane; i < k; i += 32) acc += e4m3_to_f32(wr[i]) * e4m3_to_f32(xq[i]);
    acc = warp_sum(acc);
    if (lane == 0) y[row] = to_bf16(acc * w_scales[row] * x_scale[0]);
}
