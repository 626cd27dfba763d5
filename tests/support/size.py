"""Helpers the tests of size share (the in-process ones in ``tests/unit/gate/``, the ones
that start processes in ``tests/scenarios/gate/``; moved from ``tests/test_size.py``).
"""

from __future__ import annotations

TARGETS = ("h/m/q", "hc/m/q", "hf/m/q")
