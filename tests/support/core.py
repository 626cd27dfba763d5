"""Helpers the tests of the core area share, the in-process ones (``tests/unit/core/``) and the
ones that start processes (``tests/scenarios/core/``) alike.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

NOBODY = pwd.getpwnam("nobody").pw_uid


as_root = pytest.mark.skipif(
    os.geteuid() != 0 or os.geteuid() == NOBODY,
    reason="planting another user's file needs root (os.chown to nobody)",
)


def plant(path: Path, data: bytes, mode: int = 0o666, uid: int = NOBODY) -> Path:
    """``data`` at ``path`` as another user's file (``uid``) with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chown(path, uid, -1)
    path.chmod(mode)
    return path


def give_away(path: Path) -> None:
    """Make the file at ``path`` (written by this user) another user's, content unchanged."""
    os.chown(path, NOBODY, -1)


def mine(path: Path) -> bool:
    st = path.stat()
    return st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600
