"""Helpers the tests of smoke share (the in-process ones in ``tests/unit/smoke/``, the ones
that start processes in ``tests/scenarios/smoke/``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import xxhash

from metrale_orch import smoke
from metrale_orch.proc import run_process
from metrale_orch.smoke import (
    DeviceStatus,
)
from tests.support import REPO

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


# ------------------------------------------------------------------ a small tree

KERNEL_CU = r"""
extern "C" __global__ void scale_add(unsigned short* out, const unsigned short* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __uint_as_float(((unsigned)x[i]) << 16) * a + 1.0f;
        unsigned u = __float_as_uint(v);
        out[i] = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
"""

REFS = """
import numpy as np

def scale_add(args):
    return {"out": (args["x"] * np.float32(args["a"]) + np.float32(1)).astype(np.float32)}
"""

SMOKE_TOML = """
[[case]]
name = "scale_128"
module = "scale"
entry = "scale_add"
grid = [2, 1, 1]
block = [64, 1, 1]
reference = "scale_add"
seed = 3
atol = 2e-2
rtol = 2e-2
args = [
  { name = "out", kind = "out", dtype = "bf16", shape = [128] },
  { name = "x", kind = "in", dtype = "bf16", shape = [128], init = "normal" },
  { name = "a", kind = "scalar", dtype = "f32", value = 0.5 },
  { name = "n", kind = "scalar", dtype = "i32", value = 128 },
]
"""


def make_tree(root: Path, arch: str = "sm_90a", *, leaf_case: str = "") -> None:
    """kernels/hw1 (common: scale.cu + SMOKE.toml, other.cu) with model m, quant q."""
    k = root / "kernels"
    (k / "hw1" / "common").mkdir(parents=True)
    (k / "hw1" / "m" / "q").mkdir(parents=True)
    (k / "hw1" / "HARDWARE.toml").write_text(f'[hardware]\nvendor = "nvidia"\narch = "{arch}"\n')
    (k / "hw1" / "m" / "MODEL.toml").write_text("[model]\n")
    (k / "hw1" / "common" / "scale.cu").write_text(KERNEL_CU)
    (k / "hw1" / "common" / "other.cu").write_text('extern "C" __global__ void other() {}\n')
    (k / "hw1" / "common" / "SMOKE.toml").write_text(SMOKE_TOML)
    (k / "hw1" / "m" / "q" / "SMOKE.toml").write_text(leaf_case)
    (k / "smoke_refs.py").write_text(REFS)


def compile_target(
    root: Path, arch: str, kind: str = "ptx", manifest_arch: str | None = None
) -> Path:
    """Compile every module of hw1/m/q with nvcc and write manifest.json like the build does."""
    out = root / "build" / "hw1" / "m" / "q"
    out.mkdir(parents=True, exist_ok=True)
    modules = []
    for stem in ("other", "scale"):
        artefact = out / f"{stem}.{kind}"
        src = root / "kernels" / "hw1" / "common" / f"{stem}.cu"
        run_process(["nvcc", f"--{kind}", f"-arch={arch}", "-O3", str(src), "-o", str(artefact)])
        modules.append(
            {
                "name": stem,
                "stem": stem,
                "source": f"kernels/hw1/common/{stem}.cu",
                "artefact": artefact.name,
                "xxh3": xxhash.xxh3_128_hexdigest(artefact.read_bytes()),
                "key": "0" * 32,
                "outcome": "compiled",
            }
        )
    manifest = {
        "schema": 1,
        "target": "hw1/m/q",
        "arch": manifest_arch or arch,
        "toolchain": {"name": "nvcc", "identity": "test"},
        "flags": [],
        "modules": modules,
        "shadows": [],
        "defaults": {},
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def no_device() -> DeviceStatus:
    return DeviceStatus(reason="no CUDA device: test probe")


def by_name(report: smoke.SmokeReport) -> dict[str, smoke.CaseResult]:
    return {f"{r.module}::{r.case}": r for r in report.results}


# ------------------------------------------------------------------ the sample tree


def _sample_layouts() -> list[Any]:
    from metrale_orch.tree import Layout, resolve_all

    assert (REPO / "kernels" / smoke.REFS_FILE).is_file(), "the sample tree has smoke_refs.py"
    return [lay for _, lay in resolve_all(REPO) if isinstance(lay, Layout)]
