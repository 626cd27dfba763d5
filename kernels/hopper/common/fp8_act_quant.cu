// Per-token FP8 (E4M3) activation quantiser for Hopper's W8A8 GEMMs:
//   scales[r] = max(amax(x[r, :]), 1e-12) / 448
//   q[r, i]   = e4m3_rn_satfinite(x[r, i] * (448 / max(amax(x[r, :]), 1e-12)))
// x is [rows, cols] bf16; q is [rows, cols] E4M3 bytes; scales is [rows] fp32.
// Launch: grid = (rows), block = (a multiple of 32, e.g. 256).
//
// Hopper only: the conversion uses the hardware cvt.rn.satfinite.e4m3x2.f32 (sm_89+), and
// this file lives in kernels/hopper/common, which only sm_90a targets reach. The guard turns
// a misplaced copy into a compile error instead of a slow software fallback.
#include <cuda_fp8.h>
#include <stdint.h>

#include "bf16_util.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "fp8_act_quant.cu is a Hopper (sm_90+) kernel"
#endif

extern "C" __global__ void fp8_act_quant_e4m3(uint8_t* __restrict__ q,
                                              float* __restrict__ scales,
                                              const bf16_t* __restrict__ x, int rows,
                                              int cols) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    if (row >= rows) return;  // uniform across the block
    const bf16_t* xr = x + (size_t)row * cols;
    uint8_t* qr = q + (size_t)row * cols;

    float amax = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(xr[i])));
    amax = fmaxf(block_max(amax, scratch), 1e-12f);
    const float inv_scale = 448.0f / amax;
    if (threadIdx.x == 0) scales[row] = amax / 448.0f;

    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        qr[i] = (uint8_t)__nv_cvt_float_to_fp8(to_f32(xr[i]) * inv_scale, __NV_SATFINITE,
                                               __NV_E4M3);
    }
}
