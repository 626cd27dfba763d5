"""Helpers the tests of beyond share (the in-process ones in ``tests/unit/tree/``, the ones
that start processes in ``tests/scenarios/tree/``).
"""

from __future__ import annotations

from pathlib import Path

HW = '[hardware]\nvendor = "nvidia"\narch = "sm_121f"\n'
KQUANT = (
    '#include "../../../gb10/qwen/nvfp4/q4k_vendor/mma.cuh"\n'
    '#include <cuda_bf16.h>\n#if 0\n#include "not_anywhere.cuh"\n#endif\n'
    'extern "C" __global__ void kquant(int* o) { o[0] = MMA; }\n'
)


def _tree(root: Path, extra: dict[str, str] | None = None) -> Path:
    files = {
        "kernels/gb10/HARDWARE.toml": HW,
        "kernels/gb10/dsv4/MODEL.toml": "[model]\n",
        "kernels/gb10/dsv4/nvfp4/kquant.cu": KQUANT,
        "kernels/gb10/qwen/MODEL.toml": "[model]\n",
        "kernels/gb10/qwen/nvfp4/gemv.cu": 'extern "C" __global__ void gemv() {}\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/mma.cuh": '#pragma once\n#include "sib.cuh"\n',
        "kernels/gb10/qwen/nvfp4/q4k_vendor/sib.cuh": "#define MMA 7\n",
        **(extra or {}),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
