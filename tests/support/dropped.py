"""Helpers the tests of dropped share (the in-process ones in ``tests/unit/steps/``, the
ones that start processes in ``tests/scenarios/steps/``).
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.tree import Target
from tests.support.build import (
    small_tree,
)

T = Target(hardware="hw1", model="m1", quant="q1")
COMMON_SCALE = (
    '#define SCALE_FAST scale_fast\n#include "scale_impl.cuh"\n'
    'extern "C" __global__ void scale() {}\n'
)
LEAF_TOML = (
    '[build]\nextra_nvcc_flags = ["-DC=1", "-DB=1"]\n[modules]\nscale = "scale_q1"\n'
    '[shadow]\nscale = "a leaf scale"\n'
)


def _fork_tree(root: Path, leaf_toml: str = LEAF_TOML, extra: dict[str, str] | None = None) -> Path:
    """small_tree with a leaf scale.cu that drops scale_fast from its common namesake."""
    return small_tree(
        root,
        {
            "kernels/hw1/common/scale.cu": COMMON_SCALE,
            "kernels/hw1/common/scale_impl.cuh": (
                'extern "C" __global__ void SCALE_FAST(float* x) {}\n'
            ),
            "kernels/hw1/m1/q1/scale.cu": 'extern "C" __global__ void scale() {}\n',
            "kernels/hw1/m1/q1/KERNEL.toml": leaf_toml,
            **(extra or {}),
        },
    )
