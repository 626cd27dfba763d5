"""The first thing a doit run does (I/O: starts programs): the dry runs the last run's
probes asked for, from the plan in the default build directory (or
``METRALE_ORCH_BUILD_DIR``'s; a ``build_dir`` set only in ``pyproject.toml`` is not
known yet, and its runs start nothing early). See
:mod:`metrale_orch.toolchain.earlyruns`; kept apart so that the dodo file starts them
before the rest of the package loads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from metrale_orch.paths import STATE_DIR
from metrale_orch.tasks.run import Run

__all__ = ["start_early_runs"]


def start_early_runs(run: Run, scope: Sequence[str] | None = None) -> int:
    """Start the plan's dry runs for the run's project into its probe memo's early runs
    (the plan of this run's kind: the whole tree's, or that of the targets ``scope``
    names, :mod:`~metrale_orch.graph.scope`); how many started."""
    environ = run.environ
    build_dir = Path(os.path.expanduser(environ.get("METRALE_ORCH_BUILD_DIR") or "build"))
    return run.probes.early.start_plan(run.root / build_dir / STATE_DIR, environ, scope)
