// SiLU-and-multiply (the SwiGLU activation of the FFN), bf16 in and out:
//   out[r, i] = silu(gate_up[r, i]) * gate_up[r, d + i],   silu(g) = g / (1 + exp(-g))
// gate_up holds the fused gate and up projections: [rows, 2 * d]; out is [rows, d].
// Launch: any 1-D grid and block (grid-stride loop over rows * d).
#include "bf16_util.cuh"

extern "C" __global__ void silu_mul_bf16(bf16_t* __restrict__ out,
                                         const bf16_t* __restrict__ gate_up, int rows, int d) {
    const long long total = (long long)rows * d;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / d;
        const long long i = idx - r * d;
        const float g = to_f32(gate_up[r * 2 * d + i]);
        const float u = to_f32(gate_up[r * 2 * d + d + i]);
        out[idx] = to_bf16(g / (1.0f + expf(-g)) * u);
    }
}
