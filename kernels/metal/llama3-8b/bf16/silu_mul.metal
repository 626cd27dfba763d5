// SiLU-and-multiply, bf16 (as ushort) in and out:
//   out[r, i] = silu(gate_up[r, i]) * gate_up[r, d + i]; gate_up is [rows, 2 * d].
// Dispatch: one thread per output element (rows * d threads).
#include "../../common/metal_common.h"

kernel void silu_mul_bf16(device ushort* out [[buffer(0)]],
                          device const ushort* gate_up [[buffer(1)]],
                          constant int& d [[buffer(2)]],
                          uint idx [[thread_position_in_grid]]) {
    uint r = idx / uint(d);
    uint i = idx - r * uint(d);
    float g = bf16_to_float(gate_up[r * 2 * d + i]);
    float u = bf16_to_float(gate_up[r * 2 * d + d + i]);
    out[idx] = float_to_bf16(g / (1.0f + exp(-g)) * u);
}
