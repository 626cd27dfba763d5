// Dense BF16 GEMV for decode: y[n] = sum_k W[n, k] * x[k], fp32 accumulation.
// W is [N, K] row-major, x is [K], y is [N].
// Launch: one warp per output row; grid = (ceil(N / warps_per_block)), block = (32 * warps).
#include "arch_tuning.cuh"
#include "bf16_util.cuh"

extern "C" __global__ void gemv_bf16(bf16_t* __restrict__ y, const bf16_t* __restrict__ w,
                                     const bf16_t* __restrict__ x, int n_rows, int k) {
    constexpr int kUnroll = METRALE_GEMV_UNROLL;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n_rows) return;  // whole warps leave together
    const bf16_t* wr = w + (size_t)row * k;
    float acc = 0.0f;
#pragma unroll kUnroll
    for (int i = lane; i < k; i += 32) acc += to_f32(wr[i]) * to_f32(x[i]);
    acc = warp_sum(acc);
    if (lane == 0) y[row] = to_bf16(acc);
}
