// Launch-independent tuning constants for Hopper (sm_90a). Replaces GB10's header of the
// same name for every Hopper target (own over parent, declared in KERNEL.toml [shadow]).
#pragma once

#define METRALE_GEMV_UNROLL 8
#define METRALE_ATTN_MAX_HEAD_DIM 256
