"""Helpers the tests of toolchains share (the in-process ones in ``tests/unit/toolchain/``,
the ones that start processes in ``tests/scenarios/toolchain/``).
"""

from __future__ import annotations

from pathlib import Path


def _exe(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake\n")
    path.chmod(0o755)
    return path
