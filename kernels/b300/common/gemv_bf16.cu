// Dense BF16 GEMV for decode, B300 version: one block per output row with every thread of
// the block striding over K, then a block reduction. With 148 SMs and few rows per layer at
// small batch, spreading one row over a whole block keeps more loads in flight than GB10's
// warp-per-row kernel.
//   y[n] = sum_k W[n, k] * x[k], fp32 accumulation; W [N, K] row-major, x [K], y [N].
// Launch: grid = (N), block = (a multiple of 32, e.g. 256).
#include "bf16_util.cuh"

extern "C" __global__ void gemv_bf16(bf16_t* __restrict__ y, const bf16_t* __restrict__ w,
                                     const bf16_t* __restrict__ x, int n_rows, int k) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform across the block
    const bf16_t* wr = w + (size_t)row * k;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) acc += to_f32(wr[i]) * to_f32(x[i]);
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) y[row] = to_bf16(acc);
}
