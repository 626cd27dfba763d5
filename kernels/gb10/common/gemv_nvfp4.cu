// NVFP4 weight-only GEMV for decode (4-bit weights, bf16 activations, fp32 accumulation):
//   y[n] = global_scale * sum_k e2m1(W[n, k]) * e4m3(scales[n, k / 16]) * x[k]
// w_packed is [N, K / 2] bytes (two E2M1 weights per byte, the even index in the low nibble),
// scales is [N, K / 16] FP8 E4M3 (one per 16 weights), x is [K] bf16, y is [N] bf16.
// K must be a multiple of 16.
// Launch: one warp per output row; grid = (ceil(N / warps_per_block)), block = (32 * warps).
#include <cuda_fp8.h>
#include <stdint.h>

#include "arch_tuning.cuh"
#include "bf16_util.cuh"
#include "vendor/ocp_mx/mx_types.cuh"

extern "C" __global__ void gemv_nvfp4_bf16(bf16_t* __restrict__ y,
                                           const uint8_t* __restrict__ w_packed,
                                           const uint8_t* __restrict__ scales,
                                           float global_scale, const bf16_t* __restrict__ x,
                                           int n_rows, int k) {
    constexpr int kUnroll = METRALE_GEMV_UNROLL;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const int groups = k / 16;
    const uint8_t* wr = w_packed + (size_t)row * (k / 2);
    const uint8_t* sr = scales + (size_t)row * groups;

    float acc = 0.0f;
#pragma unroll kUnroll
    for (int g = lane; g < groups; g += 32) {
        __nv_fp8_e4m3 scale_fp8;
        scale_fp8.__x = sr[g];
        const float scale = (float)scale_fp8;
        float partial = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t byte = wr[g * 8 + j];
            partial += mx_e2m1_to_float(byte & 0xFu) * to_f32(x[g * 16 + 2 * j]);
            partial += mx_e2m1_to_float(byte >> 4) * to_f32(x[g * 16 + 2 * j + 1]);
        }
        acc += partial * scale;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = to_bf16(acc * global_scale);
}
