// RMSNorm over the last dimension, bf16 (as ushort) in and out, fp32 accumulation:
//   out[r, i] = x[r, i] / sqrt(mean(x[r, :]^2) + eps) * w[i]
// Dispatch: one threadgroup per row, 256 threads per threadgroup.
#include "metal_common.h"

kernel void rmsnorm_bf16(device ushort* out [[buffer(0)]],
                         device const ushort* x [[buffer(1)]],
                         device const ushort* w [[buffer(2)]],
                         constant int& cols [[buffer(3)]],
                         constant float& eps [[buffer(4)]],
                         uint row [[threadgroup_position_in_grid]],
                         uint tid [[thread_position_in_threadgroup]],
                         uint simd_lane [[thread_index_in_simdgroup]],
                         uint simd_id [[simdgroup_index_in_threadgroup]]) {
    threadgroup float partial[8];  // 256 threads = 8 SIMD groups of 32
    device const ushort* xr = x + row * cols;
    float sum_sq = 0.0f;
    for (int i = tid; i < cols; i += 256) {
        float v = bf16_to_float(xr[i]);
        sum_sq += v * v;
    }
    sum_sq = simd_sum(sum_sq);
    if (simd_lane == 0) partial[simd_id] = sum_sq;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = simd_lane < 8 ? partial[simd_lane] : 0.0f;
    total = simd_sum(total);
    float inv_rms = rsqrt(total / float(cols) + eps);
    for (int i = tid; i < cols; i += 256) {
        out[row * cols + i] = float_to_bf16(bf16_to_float(xr[i]) * inv_rms * bf16_to_float(w[i]));
    }
}
