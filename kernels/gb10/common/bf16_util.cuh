// bf16 storage type and the warp/block reductions the common kernels share.
//
// Everything here is __forceinline__: no out-of-line device function is emitted, so the
// PTX holds only the extern "C" entry points and is byte-identical wherever it is staged.
// The HIP branch lets the Strix Halo tree compile the same files with hipcc.
#pragma once

#if defined(__HIP_PLATFORM_AMD__)
#include <hip/hip_bf16.h>
typedef __hip_bfloat16 bf16_t;
#define METRALE_SHFL_XOR(v, m) __shfl_xor((v), (m))
#else
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16_t;
#define METRALE_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#endif

__device__ __forceinline__ float to_f32(bf16_t v) { return __bfloat162float(v); }

// Round to nearest even, as the NumPy references do.
__device__ __forceinline__ bf16_t to_bf16(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += METRALE_SHFL_XOR(v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, METRALE_SHFL_XOR(v, offset));
    return v;
}

// Sum over the whole block; blockDim.x must be a multiple of 32 (at most 1024).
// `scratch` is 32 floats of shared memory. Every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// Maximum over the whole block; same contract as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}
