"""The I/O floor of resolving a tree: what any resolver must at least do.

List every directory under ``<root>/kernels`` with ``os.scandir`` and parse every
TOML file with ``tomllib``, on plain ``str`` paths. ``bench_layout.py`` times
:func:`floor` in process; ``bench_real.py`` runs this file as a script
(``python floor.py ROOT``), so its floor includes a bare interpreter's start-up.
Imports nothing of the package.
"""

from __future__ import annotations

import os
import sys
import tomllib


def floor(root: str | os.PathLike[str]) -> int:
    """scandir every directory under kernels/ and parse every .toml; returns files seen."""
    seen = 0
    stack = [os.path.join(root, "kernels")]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for de in it:
                seen += 1
                if de.is_dir(follow_symlinks=False):
                    stack.append(de.path)
                elif de.name.endswith(".toml"):
                    with open(de.path, "rb") as fh:
                        tomllib.load(fh)
    return seen


if __name__ == "__main__":
    print(floor(sys.argv[1]))
