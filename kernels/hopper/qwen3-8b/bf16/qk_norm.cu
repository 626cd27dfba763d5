// Qwen3 QK-norm, Hopper version: same entry point, contract and launch shape as GB10's
// qwen3-8b/bf16/qk_norm.cu, but each lane moves bf16 pairs (one 32-bit load or store per
// two values). It replaces GB10's file of the same name for hopper/qwen3-8b/bf16 (own leaf
// over parent leaf, declared in this directory's KERNEL.toml).
//   x[r, i] = x[r, i] / sqrt(mean(x[r, :]^2) + eps) * w[i]
// x is [rows, head_dim] (rows = tokens * heads), w is [head_dim]; head_dim must be even.
// Launch: one warp per head row; grid = (ceil(rows / warps_per_block)), block = (32 * warps).
#include "../../common/bf16_util.cuh"

extern "C" __global__ void qk_norm_bf16(bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
                                        int rows, int head_dim, float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps leave together
    __nv_bfloat162* xr = reinterpret_cast<__nv_bfloat162*>(x + (size_t)row * head_dim);
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(w);
    const int pairs = head_dim / 2;
    float sum_sq = 0.0f;
    for (int i = lane; i < pairs; i += 32) {
        const float2 v = __bfloat1622float2(xr[i]);
        sum_sq += v.x * v.x + v.y * v.y;
    }
    const float inv_rms = rsqrtf(warp_sum(sum_sq) / (float)head_dim + eps);
    for (int i = lane; i < pairs; i += 32) {
        const float2 v = __bfloat1622float2(xr[i]);
        const float2 s = __bfloat1622float2(w2[i]);
        xr[i] = __floats2bfloat162_rn(v.x * inv_rms * s.x, v.y * inv_rms * s.y);
    }
}
