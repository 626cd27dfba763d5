"""Helpers the tests of hip share (the in-process ones in ``tests/unit/toolchain/``, the
ones that start processes in ``tests/scenarios/toolchain/``).
"""

from __future__ import annotations

from tests.support.project import DODO

# ------------------------------------------------------------------------------ the tree

_SCALE = (
    '#include "../../common/warp.cuh"\n'
    'extern "C" __global__ void scale_k(float* x) {\n'
    "    x[threadIdx.x] = x[threadIdx.x] * SCALE + lanes();\n"
    "}\n"
)
_WARP = (
    "#pragma once\n"
    "#if HIP_VERSION_MAJOR < 6  // ROCm 5.2 has no __activemask() yet\n"
    "#define __activemask() __ballot(1)\n"
    "#endif\n"
    "__device__ inline float lanes() {\n"
    "    unsigned int m = __activemask();\n"  # the mirror widens this to 64 bits
    "    return (float)__popcll(m);\n"
    "}\n"
)
_SMOKE = (
    '[[case]]\nname = "scale_64"\nmodule = "scale"\nentry = "scale_k"\n'
    'grid = [1, 1, 1]\nblock = [64, 1, 1]\nreference = "scale"\n'
    'args = [{ name = "x", kind = "inout", dtype = "f32", shape = [64], init = "normal" }]\n'
)
FILES = {
    "dodo.py": DODO,
    # gfx90a (MI200): clang 15 builds it. extra_hip_flags is read by nothing (a warning).
    "kernels/mi200/HARDWARE.toml": (
        '[hardware]\nvendor = "hip"\narch = "gfx90a"\n'
        '[build]\nextra_nvcc_flags = ["--fmad=false"]\nextra_hip_flags = ["-DNOT_READ"]\n'
    ),
    "kernels/mi200/common/warp.cuh": _WARP,
    "kernels/mi200/m/MODEL.toml": "[model]\n",
    "kernels/mi200/m/q/KERNEL.toml": (
        '[build]\nextra_nvcc_flags = ["-ffp-contract=off", "-DSCALE=2.0f"]\n'
    ),
    "kernels/mi200/m/q/scale.cu": _SCALE,
    "kernels/mi200/m/q/SMOKE.toml": _SMOKE,
    # gfx1151 (Strix Halo): clang 15 does not know it.
    "kernels/strix/HARDWARE.toml": '[hardware]\nvendor = "hip"\narch = "gfx1151"\n',
    "kernels/strix/m/MODEL.toml": "[model]\n",
    "kernels/strix/m/q/k.cu": 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n',
}
