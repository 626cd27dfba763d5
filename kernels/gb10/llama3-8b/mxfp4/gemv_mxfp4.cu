// MXFP4 weight-only GEMV for decode (OCP MX: E2M1 weights, one E8M0 scale per 32):
//   y[n] = sum_k e2m1(W[n, k]) * 2^(scales[n, k / 32] - 127) * x[k]
// w_packed is [N, K / 2] bytes (the even index in the low nibble), scales is [N, K / 32]
// E8M0 bytes, x is [K] bf16, y is [N] bf16; fp32 accumulation. K must be a multiple of 32.
// Launch: one warp per output row; grid = (ceil(N / warps_per_block)), block = (32 * warps).
#include <stdint.h>

#include "../../common/arch_tuning.cuh"
#include "../../common/bf16_util.cuh"
#include "../../common/vendor/ocp_mx/mx_types.cuh"

extern "C" __global__ void gemv_mxfp4_bf16(bf16_t* __restrict__ y,
                                           const uint8_t* __restrict__ w_packed,
                                           const uint8_t* __restrict__ scales,
                                           const bf16_t* __restrict__ x, int n_rows, int k) {
    constexpr int kUnroll = METRALE_GEMV_UNROLL;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const int blocks = k / 32;
    const uint8_t* wr = w_packed + (size_t)row * (k / 2);
    const uint8_t* sr = scales + (size_t)row * blocks;

    // Lane l decodes bytes l, l + 32, ... of each 16-byte block: one weight pair at a time.
    float acc = 0.0f;
#pragma unroll kUnroll
    for (int p = lane; p < k / 2; p += 32) {
        const uint32_t byte = wr[p];
        const float scale = mx_e8m0_to_float(sr[p / 16]);
        const float pair = mx_e2m1_to_float(byte & 0xFu) * to_f32(x[2 * p]) +
                           mx_e2m1_to_float(byte >> 4) * to_f32(x[2 * p + 1]);
        acc += pair * scale;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = to_bf16(acc);
}
