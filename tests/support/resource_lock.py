"""Helpers the tests of resource lock share (the in-process ones in
``tests/unit/resources/``, the ones that start processes in ``tests/scenarios/resources/``;
moved from ``tests/test_resource_lock.py``).
"""

from __future__ import annotations

A, B = "h/m/a", "h/m/b"
