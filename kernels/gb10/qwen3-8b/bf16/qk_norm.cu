// Qwen3 QK-norm: RMSNorm of every query/key head over head_dim, in place, before RoPE:
//   x[r, i] = x[r, i] / sqrt(mean(x[r, :]^2) + eps) * w[i]
// x is [rows, head_dim] (rows = tokens * heads), w is [head_dim]; bf16, fp32 accumulation.
// Launch: one warp per head row; grid = (ceil(rows / warps_per_block)), block = (32 * warps).
#include "../../common/bf16_util.cuh"

extern "C" __global__ void qk_norm_bf16(bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                        int rows, int head_dim, float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps leave together
    bf16_t* xr = x + (size_t)row * head_dim;
    float sum_sq = 0.0f;
    for (int i = lane; i < head_dim; i += 32) {
        const float v = to_f32(xr[i]);
        sum_sq += v * v;
    }
    const float inv_rms = rsqrtf(warp_sum(sum_sq) / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32) xr[i] = to_bf16(to_f32(xr[i]) * inv_rms * to_f32(w[i]));
}
