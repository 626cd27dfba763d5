"""Helpers the tests of doit api share (the in-process ones in ``tests/unit/tasks/``, the
ones that start processes in ``tests/scenarios/tasks/``).
"""

from __future__ import annotations

#: The package's task loader, as a project's pyproject.toml names it for plain doit.
LOADER_PYPROJECT = """\
[tool.doit]
loader = "metrale"

[tool.doit.plugins.loader]
metrale = "metrale_orch.tasks.loader:Loader"
"""
