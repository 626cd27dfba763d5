"""Helpers the tests of the config area share, the in-process ones (``tests/unit/config/``) and
the ones that start processes (``tests/scenarios/config/``) alike.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

from metrale_orch.cli import main


def cli(root: Path, env: Mapping[str, str], *argv: str) -> tuple[int, str, str]:
    """``metrale-orch --root ROOT ARGV`` as a user runs it: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ=dict(env), out=out, err=err)
    return code, out.getvalue(), err.getvalue()
