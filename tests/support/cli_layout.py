"""Helpers the tests of cli layout share (the in-process ones in ``tests/unit/tree/``, the
ones that start processes in ``tests/scenarios/tree/``).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.tree import files, hw, kernel_toml, model


def tree(root: Path) -> None:
    """gb10 (base) and hopper (inherits gb10), one model, a use, both kinds of shadow."""
    hw(root, "gb10", arch="sm_121f")
    hw(root, "hopper", arch="sm_90a", inherits="gb10")
    for h in ("gb10", "hopper"):
        model(root, h, "qwen")
    files(
        root,
        "kernels/gb10/common/rms.cu",
        "kernels/gb10/common/util.cuh",
        "kernels/gb10/common/vendor/v.h",
        "kernels/gb10/qwen/bf16/rms.cu",
        "kernels/hopper/common/util.cuh",
        "kernels/shared/extra.cu",
    )
    kernel_toml(root, "kernels/gb10/qwen/bf16", use=["../shared/extra.cu"], shadow={"rms": "q"})
    kernel_toml(root, "kernels/hopper/common", shadow={"util": "wider loads"})
