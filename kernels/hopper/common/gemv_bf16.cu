// Dense BF16 GEMV for decode, Hopper version: same entry point and launch shape as GB10's
// common/gemv_bf16.cu, but each lane reads 16 bytes (8 bf16) of W and x per step.
//   y[n] = sum_k W[n, k] * x[k], fp32 accumulation; W [N, K] row-major, x [K], y [N].
// K must be a multiple of 8 and W, x 16-byte aligned (every row then starts aligned).
// Launch: one warp per output row; grid = (ceil(N / warps_per_block)), block = (32 * warps).
#include <stdint.h>

#include "arch_tuning.cuh"
#include "bf16_util.cuh"

__device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b) {
    const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 fa = __bfloat1622float2(a2[i]);
        const float2 fb = __bfloat1622float2(b2[i]);
        acc += fa.x * fb.x + fa.y * fb.y;
    }
    return acc;
}

extern "C" __global__ void gemv_bf16(bf16_t* __restrict__ y, const bf16_t* __restrict__ w,
                                     const bf16_t* __restrict__ x, int n_rows, int k) {
    constexpr int kUnroll = METRALE_GEMV_UNROLL;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;
    const int vecs = k / 8;
    const uint4* wv = reinterpret_cast<const uint4*>(w + (size_t)row * k);
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    float acc = 0.0f;
#pragma unroll kUnroll
    for (int i = lane; i < vecs; i += 32) acc += dot8_bf16(wv[i], xv[i]);
    acc = warp_sum(acc);
    if (lane == 0) y[row] = to_bf16(acc);
}
