// Launch-independent tuning constants for GB10 (sm_121f).
//
// Hopper replaces this header by file name (kernels/hopper/common/arch_tuning.cuh);
// the common kernels that include it then compile with Hopper's values.
#pragma once

// Unroll factor of the GEMV inner loops (a compile-time constant for #pragma unroll).
#define METRALE_GEMV_UNROLL 4

// Largest head dimension the decode attention kernel keeps in shared memory.
#define METRALE_ATTN_MAX_HEAD_DIM 256
