// Residual add in place, bf16 storage, fp32 add: hidden[i] += residual[i].
// Launch: any 1-D grid and block (grid-stride loop over n).
#include "bf16_util.cuh"

extern "C" __global__ void residual_add_bf16(bf16_t* __restrict__ hidden,
                                             const bf16_t* __restrict__ residual, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        hidden[i] = to_bf16(to_f32(hidden[i]) + to_f32(residual[i]));
    }
}
