"""A small tree written from a mapping, really built with nvcc, and the CLI run on it.

For tests of commands that read finished builds (``sass-diff``, ``resources``): the tree
is built without a cache into its ``build/``, one :func:`build_target` per target.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from metrale_orch.cli import main
from metrale_orch.steps.target import build_target
from metrale_orch.tree import Target
from tests.support.build import make_config, write


def built_tree(root: Path, files: Mapping[str, str], targets: Iterable[str]) -> Path:
    """``files`` (root-relative path -> text) written under ``root``, then ``targets`` built."""
    for rel, text in files.items():
        write(root, rel, text)
    config = make_config(root, root / "cache", cache_mode="off", build_dir=str(root / "build"))
    for name in targets:
        result = build_target(
            root, Target.parse(name), config=config, cache=None, environ=dict(os.environ)
        )
        assert not result.failed, result.failure_text()
    return root


def run_cli(root: Path, argv: list[str], environ: Mapping[str, str]) -> tuple[int, str, str]:
    """``metrale-orch --root ROOT ARGV...``: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ=environ, out=out, err=err)
    return code, out.getvalue(), err.getvalue()
