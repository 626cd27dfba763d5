"""A doit run on a terminal (a pseudo-terminal), as a user's shell runs it: what the live
progress line draws is in its output."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["doit_on_terminal"]


def doit_on_terminal(
    root: Path, args: Sequence[str], env: Mapping[str, str], *, columns: int = 200
) -> tuple[int, str]:
    """``python -m doit ARGS`` in ``root`` on a terminal ``columns`` wide: its exit status
    and everything it wrote (escape sequences included). ``CI`` is unset and ``TERM`` is
    ``xterm`` unless ``env`` names another: the live line is drawn only then."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {"TERM": "xterm", **{k: v for k, v in env.items() if k != "CI"}}
    proc = subprocess.Popen(
        [sys.executable, "-m", "doit", *args],
        cwd=root,
        env=environ,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks: list[bytes] = []
    try:
        while select.select([primary], [], [], 60)[0]:
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the run closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        proc.wait(60)
        os.close(primary)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")
