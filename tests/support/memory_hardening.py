"""Helpers the tests of memory hardening share (the in-process ones in
``tests/unit/executor/``, the ones that start processes in ``tests/scenarios/executor/``).
"""

from __future__ import annotations

GIB = 1 << 30
