"""Helpers the tests of workflow share (the in-process ones in ``tests/unit/matrix/``, the
ones that start processes in ``tests/scenarios/matrix/``).
"""

from __future__ import annotations

from tests.support import REPO

WORKFLOW = REPO / "ci" / "github" / "kernels.yml"
