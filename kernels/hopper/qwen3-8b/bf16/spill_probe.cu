// Register-pressure probe: the sample tree's one kernel written to spill, so that
// `metrale-orch resources` has a spill to show and CI a spill to catch.
//   out[t] = sum_j s_j * s_{(7j + 3) mod 40}, where s_j = fold over in[] of fmaf(s_j, x, j + 1)
// Forty running sums stay live across the loop; __maxnreg__(32) caps this kernel (and only
// this kernel: [build] flags such as -maxrregcount would apply to every module of the
// target) at 32 registers per thread, so ptxas spills the rest to local memory.
// Launch: any grid; block = (threads, 1, 1); out holds gridDim.x * blockDim.x floats.

#define SPILL_SUMS 40

extern "C" __global__ void __maxnreg__(32) spill_probe(float* __restrict__ out,
                                                        const float* __restrict__ in, int n) {
    float sums[SPILL_SUMS];
#pragma unroll
    for (int j = 0; j < SPILL_SUMS; ++j) sums[j] = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float x = in[i];
#pragma unroll
        for (int j = 0; j < SPILL_SUMS; ++j) sums[j] = fmaf(sums[j], x, (float)(j + 1));
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < SPILL_SUMS; ++j) acc += sums[j] * sums[(j * 7 + 3) % SPILL_SUMS];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
