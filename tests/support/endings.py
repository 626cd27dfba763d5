"""Helpers the tests of endings share (the in-process ones in ``tests/unit/tasks/``, the
ones that start processes in ``tests/scenarios/tasks/``).
"""

from __future__ import annotations

import os

#: A file name that is not UTF-8 (what a Latin-1 tool or a corrupted unpack leaves).
BAD_NAME = os.fsdecode(b"k\xff.cu")
