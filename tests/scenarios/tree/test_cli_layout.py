"""``metrale-orch layout`` and ``metrale-orch check`` as a user runs them.

These are the tests of this topic that start processes; the others are in
``tests/unit/tree/test_cli_layout.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.tree import tree


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    tree(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "metrale_orch", "check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("check: ok")


def test_check_starts_without_doit_or_the_cache_tiers() -> None:
    """``check`` is what pre-commit hooks run: its start-up imports neither doit nor the
    task generation nor the cache's tiers (about half of a check of the real-shaped tree
    went there); the commands that need them import them when they run."""
    probe = (
        "import sys, metrale_orch.cli\n"
        "heavy = ('doit', 'metrale_orch.views.status', 'metrale_orch.tasks.specs', "
        "'metrale_orch.graph.generate', "
        "'metrale_orch.cache', 'metrale_orch.steps.target')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout
