// MoE router for Qwen3-MoE: softmax over the experts, pick the top k, optionally renormalise
// the k picked probabilities to sum to one (Qwen3's norm_topk_prob).
//   logits: [tokens, experts] fp32;  weights: [tokens, k] fp32;  ids: [tokens, k] int32
// Experts are picked by descending logit, the lower index first on ties.
// experts <= MOE_MAX_EXPERTS (a compile-time bound, raised by this directory's
// KERNEL.toml [build] flags for the 128-expert model) and k <= experts.
// Launch: one warp per token; grid = (ceil(tokens / warps_per_block)), block = (32 * warps).
#include <math.h>

#ifndef MOE_MAX_EXPERTS
#define MOE_MAX_EXPERTS 64
#endif
#define MOE_PER_LANE ((MOE_MAX_EXPERTS + 31) / 32)

extern "C" __global__ void moe_topk_softmax(float* __restrict__ weights, int* __restrict__ ids,
                                            const float* __restrict__ logits, int tokens,
                                            int experts, int k, int renormalize) {
    const int lane = threadIdx.x & 31;
    const int token = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (token >= tokens) return;  // whole warps leave together
    const float* lt = logits + (size_t)token * experts;

    // Lane l holds experts l, l + 32, l + 64, ...
    float vals[MOE_PER_LANE];
    float max_logit = -INFINITY;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) {
        const int e = lane + 32 * j;
        vals[j] = e < experts ? lt[e] : -INFINITY;
        max_logit = fmaxf(max_logit, vals[j]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
    float denom = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_PER_LANE; ++j) denom += expf(vals[j] - max_logit);  // exp(-inf) = 0
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
        denom += __shfl_xor_sync(0xffffffffu, denom, offset);

    float picked_sum = 0.0f;
    for (int slot = 0; slot < k; ++slot) {
        // Warp arg-max over (value desc, index asc).
        float best = -INFINITY;
        int best_e = experts;
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j) {
            const int e = lane + 32 * j;
            if (e < experts && (vals[j] > best || (vals[j] == best && e < best_e))) {
                best = vals[j];
                best_e = e;
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, best, offset);
            const int other_e = __shfl_xor_sync(0xffffffffu, best_e, offset);
            if (other > best || (other == best && other_e < best_e)) {
                best = other;
                best_e = other_e;
            }
        }
        const float p = expf(best - max_logit) / denom;
        picked_sum += p;
        if (lane == 0) {
            weights[(size_t)token * k + slot] = p;
            ids[(size_t)token * k + slot] = best_e;
        }
        // Take the picked expert out of the running.
#pragma unroll
        for (int j = 0; j < MOE_PER_LANE; ++j)
            if (lane + 32 * j == best_e) vals[j] = -INFINITY;
    }
    if (renormalize && lane == 0) {
        for (int slot = 0; slot < k; ++slot) weights[(size_t)token * k + slot] /= picked_sum;
    }
}
