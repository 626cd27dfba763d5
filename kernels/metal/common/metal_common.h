// Shared helpers of the Metal kernels: bf16 loads and stores through float.
#pragma once

#include <metal_stdlib>
using namespace metal;

inline float bf16_to_float(ushort v) { return as_type<float>(uint(v) << 16); }

// Round to nearest even (finite inputs).
inline ushort float_to_bf16(float f) {
    uint u = as_type<uint>(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return ushort(u >> 16);
}
