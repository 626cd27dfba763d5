"""Helpers the tests of docs share (the in-process ones in ``tests/unit/project/``, the ones
that start processes in ``tests/scenarios/project/``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO

PAGES = sorted([REPO / "README.md", REPO / "BENCHMARKS.md", *(REPO / "docs").glob("*.md")])


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _blocks(path: Path) -> Iterator[list[str]]:
    """The lines of each fenced ``text`` or ``sh`` block of ``path``."""
    block: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if block is None and re.fullmatch(r"```(text|sh|console)\s*", line):
            block = []
        elif block is not None and line.startswith("```"):
            yield block
            block = None
        elif block is not None:
            block.append(line)


def _shown() -> Iterator[tuple[str, str, list[str]]]:
    """(page, command line, the output shown under it) of every ``$ `` line."""
    for page in PAGES:
        for block in _blocks(page):
            for i, line in enumerate(block):
                if not line.startswith("$ "):
                    continue
                out = []
                for after in block[i + 1 :]:
                    if after.startswith("$ "):
                        break
                    out.append(after)
                yield _rel(page), line[2:], out


VIEWS = [
    (page, line, out)
    for page, line, out in _shown()
    if re.match(r"metrale-orch (layout|rdeps) ", line) and out
]
