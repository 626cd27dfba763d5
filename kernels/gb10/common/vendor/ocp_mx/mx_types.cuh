// Decoders for the OCP Microscaling formats (OCP MX specification v1.0):
//   E2M1 (FP4): 1 sign, 2 exponent (bias 1), 1 mantissa bit; values 0, 0.5, 1, 1.5, 2, 3, 4, 6.
//   E8M0 (scale): an unsigned biased exponent, value 2^(e - 127); 0xFF is NaN.
// Two E2M1 values share a byte: the low nibble is the element with the even index.
#pragma once

#include <stdint.h>

__device__ __forceinline__ float mx_e2m1_to_float(uint32_t nibble) {
    const uint32_t exponent = (nibble >> 1) & 3u;
    const float mantissa = (float)(nibble & 1u) * 0.5f;
    const float magnitude =
        exponent == 0u ? mantissa : ldexpf(1.0f + mantissa, (int)exponent - 1);
    return (nibble & 8u) ? -magnitude : magnitude;
}

__device__ __forceinline__ float mx_e8m0_to_float(uint32_t biased) {
    return biased == 0xFFu ? __int_as_float(0x7FC00000) : ldexpf(1.0f, (int)biased - 127);
}
