// GeGLU activation of Gemma's FFN (GELU, tanh approximation, times up), bf16 in and out:
//   out[r, i] = gelu_tanh(gate_up[r, i]) * gate_up[r, d + i]
//   gelu_tanh(g) = 0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g^3)))
// gate_up is [rows, 2 * d]; out is [rows, d].
// Launch: any 1-D grid and block (grid-stride loop over rows * d).
#include "../../common/bf16_util.cuh"

extern "C" __global__ void gelu_tanh_mul_bf16(bf16_t* __restrict__ out,
                                              const bf16_t* __restrict__ gate_up, int rows,
                                              int d) {
    const float k_sqrt_2_over_pi = 0.7978845608028654f;
    const long long total = (long long)rows * d;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / d;
        const long long i = idx - r * d;
        const float g = to_f32(gate_up[r * 2 * d + i]);
        const float u = to_f32(gate_up[r * 2 * d + d + i]);
        const float inner = k_sqrt_2_over_pi * (g + 0.044715f * g * g * g);
        out[idx] = to_bf16(0.5f * g * (1.0f + tanhf(inner)) * u);
    }
}
