"""Helpers the tests of the executor area share, the in-process ones (``tests/unit/executor/``)
and the ones that start processes (``tests/scenarios/executor/``) alike.
"""

from __future__ import annotations

MIB = 1024 * 1024


GIB = 1 << 30
