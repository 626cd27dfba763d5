// Rotary position embedding, NeoX ("rotate half") layout, in place on bf16:
//   for i < head_dim / 2, with f = theta^(-2i / head_dim) and a = positions[t] * f,
//   x1 = x[t, h, i], x2 = x[t, h, i + head_dim / 2]
//   x[t, h, i]                = x1 * cos(a) - x2 * sin(a)
//   x[t, h, i + head_dim / 2] = x2 * cos(a) + x1 * sin(a)
// x is [tokens, heads, head_dim]; positions is [tokens] (int32).
// Launch: grid = (tokens, heads), block = (any, e.g. head_dim / 2).
#include "bf16_util.cuh"

extern "C" __global__ void rope_neox_bf16(bf16_t* __restrict__ x,
                                          const int* __restrict__ positions, int tokens,
                                          int heads, int head_dim, float theta) {
    const int t = blockIdx.x;
    const int h = blockIdx.y;
    if (t >= tokens || h >= heads) return;
    const int half = head_dim / 2;
    bf16_t* xh = x + ((size_t)t * heads + h) * head_dim;
    const float pos = (float)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float freq = powf(theta, -2.0f * (float)i / (float)head_dim);
        float s, c;
        sincosf(pos * freq, &s, &c);
        const float x1 = to_f32(xh[i]);
        const float x2 = to_f32(xh[i + half]);
        xh[i] = to_bf16(x1 * c - x2 * s);
        xh[i + half] = to_bf16(x2 * c + x1 * s);
    }
}
