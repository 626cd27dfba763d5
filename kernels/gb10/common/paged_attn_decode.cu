// Paged decode attention (one query token per sequence), bf16 in and out, fp32 math:
//   out[s, h, :] = softmax_t(scale * q[s, h, :] . K[s, t, kv(h), :]) @ V[s, t, kv(h), :]
// over the seq_lens[s] cached tokens of sequence s, where token t lives in page
// block_tables[s, t / page_size] at slot t % page_size, and kv(h) = h / (heads / kv_heads)
// (grouped-query attention).
//   q, out:           [seqs, heads, head_dim]
//   k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim]
//   block_tables:     [seqs, max_pages] int32;  seq_lens: [seqs] int32
// head_dim <= METRALE_ATTN_MAX_HEAD_DIM.
// Launch: grid = (heads, seqs), block = (a multiple of 32, e.g. 128),
//         dynamic shared memory = 4 * max(seq_lens) bytes (the scores).
#include "arch_tuning.cuh"
#include "bf16_util.cuh"

extern "C" __global__ void paged_attn_decode_bf16(
    bf16_t* __restrict__ out, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, int heads, int kv_heads, int head_dim, int page_size,
    int max_pages, float scale) {
    extern __shared__ float scores[];
    __shared__ float q_s[METRALE_ATTN_MAX_HEAD_DIM];
    __shared__ float scratch[32];

    const int h = blockIdx.x;
    const int s = blockIdx.y;
    const int kv_h = h / (heads / kv_heads);
    const int seq_len = seq_lens[s];
    const int* pages = block_tables + (size_t)s * max_pages;
    const size_t token_stride = (size_t)kv_heads * head_dim;  // between slots of a page

    const bf16_t* qh = q + ((size_t)s * heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = to_f32(qh[d]);
    __syncthreads();

    // Scores, one token per thread at a time.
    float local_max = -INFINITY;
    for (int t = threadIdx.x; t < seq_len; t += blockDim.x) {
        const size_t slot = (size_t)pages[t / page_size] * page_size + t % page_size;
        const bf16_t* kt = k_cache + slot * token_stride + (size_t)kv_h * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_s[d] * to_f32(kt[d]);
        scores[t] = dot * scale;
        local_max = fmaxf(local_max, dot * scale);
    }
    const float max_score = block_max(local_max, scratch);

    float local_sum = 0.0f;
    for (int t = threadIdx.x; t < seq_len; t += blockDim.x) {
        const float p = expf(scores[t] - max_score);
        scores[t] = p;
        local_sum += p;
    }
    const float inv_sum = 1.0f / block_sum(local_sum, scratch);  // also orders the scores

    // Weighted sum of values, one output dimension per thread at a time.
    bf16_t* oh = out + ((size_t)s * heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < seq_len; ++t) {
            const size_t slot = (size_t)pages[t / page_size] * page_size + t % page_size;
            acc += scores[t] * to_f32(v_cache[slot * token_stride + (size_t)kv_h * head_dim + d]);
        }
        oh[d] = to_bf16(acc * inv_sum);
    }
}
