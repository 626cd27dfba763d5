"""Helpers the tests of readiness share (the in-process ones in ``tests/unit/tasks/``, the
ones that start processes in ``tests/scenarios/tasks/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.support.project import (
    FILES,
    make_project,
    project_env,
    use_fake_compiler,
)

NVIDIA = ["gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w4", "hopper/qwen/w8"]
HOPPER_HW = FILES["kernels/hopper/HARDWARE.toml"]


def project(tmp: Path, files: Mapping[str, str] | None = None) -> tuple[Path, dict[str, str]]:
    """The doit project with the fake compiler, ``files`` written over it."""
    root = make_project(tmp / "proj")
    use_fake_compiler(root, tmp / "bin")
    for rel, text in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root, project_env(tmp, fake_bin=tmp / "bin")
