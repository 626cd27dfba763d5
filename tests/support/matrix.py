"""Helpers the tests of the matrix area share, the in-process ones (``tests/unit/matrix/``) and
the ones that start processes (``tests/scenarios/matrix/``) alike.
"""

from __future__ import annotations

import io
import tomllib
from collections.abc import Mapping
from pathlib import Path

from metrale_orch import matrix as mx
from metrale_orch.cli import main
from tests.support import REPO

RUNNERS_TOML = """\
[runners.h100]
labels = ["self-hosted", "gpu-h100"]
toolchains = ["nvcc"]

[runners.linux]
labels = ["ubuntu-latest"]
toolchains = ["nvcc", "hip"]

[runners.mac]
labels = ["macos-14"]
toolchains = ["metal"]

[hardware]
hopper = "h100"
apple = "mac"
"""


# --------------------------------------------------------------------------- fixtures


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def make_tree(root: Path, spec: Mapping[str, tuple[str, Mapping[str, int]]]) -> Path:
    """``{hw: (hardware toml body, {"model/quant": module count})}`` -> a tree under root."""
    for hw, (hw_toml, leaves) in spec.items():
        _write(root / "kernels" / hw / "HARDWARE.toml", hw_toml)
        ext = "metal" if 'vendor = "apple"' in hw_toml else "cu"
        for leaf, count in leaves.items():
            model, quant = leaf.split("/")
            _write(root / "kernels" / hw / model / "MODEL.toml", "[model]\n")
            qdir = root / "kernels" / hw / model / quant
            qdir.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                _write(qdir / f"k{i}.{ext}", f"// {hw} {leaf} {i}\n")
            _write(qdir / "shared.cuh", "// a header is never a module\n")
    return root


def sample_tree(tmp_path: Path) -> Path:
    """hopper (3 targets of 3, 2 and 1 modules) on h100, apple (1) on mac, strix (1)
    with no runner, and ``ci/runners.toml``."""
    root = make_tree(
        tmp_path,
        {
            "hopper": (
                '[hardware]\narch = "sm_90a"\n',
                {"qwen3/bf16": 3, "qwen3/nvfp4": 2, "llama/bf16": 1},
            ),
            "apple": ('[hardware]\nvendor = "apple"\narch = "metal3.1"\n', {"qwen3/f16": 2}),
            "strix": ('[hardware]\nvendor = "hip"\narch = "gfx1151"\n', {"qwen3/bf16": 1}),
        },
    )
    _write(root / "ci" / "runners.toml", RUNNERS_TOML)
    return root


def runners(text: str = RUNNERS_TOML) -> mx.Runners:
    return mx.parse_runners(tomllib.loads(text), "ci/runners.toml")


def hw(name: str, weights: Mapping[str, int], toolchain: str = "nvcc") -> mx.HardwareInfo:
    return mx.HardwareInfo(
        name=name,
        toolchain=toolchain,
        targets=tuple(
            mx.TargetLoad(name=f"{name}/{t}", modules=m) for t, m in sorted(weights.items())
        ),
    )


def cli(root: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), "matrix", *args], environ={}, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


WORKFLOW = REPO / "ci" / "github" / "kernels.yml"
