"""Helpers the tests of taskcache share (the in-process ones in ``tests/unit/tasks/``, the
ones that start processes in ``tests/scenarios/tasks/``; moved from
``tests/test_taskcache.py``).
"""

from __future__ import annotations

from metrale_orch.tasks import taskcache


def _one_spec() -> list[taskcache.CachedSpec]:
    return [taskcache.CachedSpec(target="h/m/q", kind="error", message="x")]
