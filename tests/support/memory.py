"""Helpers the tests of memory share (the in-process ones in ``tests/unit/executor/``, the
ones that start processes in ``tests/scenarios/executor/``).
"""

from __future__ import annotations

MIB = 1024 * 1024
