"""Helpers the tests of the tasks area share, the in-process ones (``tests/unit/tasks/``) and
the ones that start processes (``tests/scenarios/tasks/``) alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from metrale_orch.graph.specs import BuildSpec
from tests.support.project import FILES, make_project, project_env, use_fake_compiler

#: The package's task loader, as a project's pyproject.toml names it for plain doit.
LOADER_PYPROJECT = """\
[tool.doit]
loader = "metrale"

[tool.doit.plugins.loader]
metrale = "metrale_orch.tasks.loader:Loader"
"""


#: A file name that is not UTF-8 (what a Latin-1 tool or a corrupted unpack leaves).
BAD_NAME = os.fsdecode(b"k\xff.cu")


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


def _one_spec() -> list[BuildSpec]:
    return [BuildSpec(target="h/m/q", kind="error", message="x")]
