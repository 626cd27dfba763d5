"""Helpers the tests of the gate area share, the in-process ones (``tests/unit/gate/``) and the
ones that start processes (``tests/scenarios/gate/``) alike.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from metrale_orch.cli import main

FAMILIES = "kernels/hw/common/KERNEL_FAMILIES.toml"


FUSIONS = "kernels/hw/common/FUSIONS.toml"


#: The tree every test starts from: it passes the gate.
TREE = {
    "kernels/hw/HARDWARE.toml": '[hardware]\nvendor = "nvidia"\narch = "sm_90a"\n',
    "kernels/hw/m/MODEL.toml": "[model]\n",
    "kernels/hw/m/q/.gitkeep": "",
    "kernels/hw/common/attn.cu": (
        'extern "C" __global__ void attn_decode(float* x) { x[threadIdx.x] *= 2.0f; }\n'
        'extern "C" __global__ void attn_prefill(float* x) { x[threadIdx.x] += 1.0f; }\n'
    ),
    "kernels/hw/common/norm.cu": (
        'extern "C" __global__ void rmsnorm(float* x) { x[threadIdx.x] *= 0.5f; }\n'
    ),
    "kernels/hw/common/rope.cu": (
        'extern "C" __global__ void rope(float* x) { x[threadIdx.x] -= 1.0f; }\n'
    ),
    "kernels/hw/common/KERNEL.toml": '[modules]\nrope = "rope_kernel"\n',
    FAMILIES: (
        '[[family]]\nname = "attention"\nkernels = ["attn::attn_decode", "attn::attn_prefill"]\n'
    ),
    FUSIONS: (
        '[[rule]]\nname = "norm_rope"\nkernels = [{ module = "norm", func = "rmsnorm" }]\n'
        '[[rule.run]]\nlaunches = [{ module = "rope_kernel", func = "rope" }]\n'
    ),
}


def _cli(root: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "coverage", *args], environ=os.environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


TARGETS = ("h/m/q", "hc/m/q", "hf/m/q")
