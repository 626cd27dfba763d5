"""The ``metrale-orch`` command (and ``python -m metrale_orch``): the CLI, with the kept
code of the package's dataclass methods (:mod:`metrale_orch.dataclass_code`) installed
before the CLI's modules make their classes: ~25 ms of each command's start-up.

Only this entry point and the doit entry module install it; :func:`metrale_orch.cli.main`
itself (what tests call) runs without it.
"""

from __future__ import annotations

import os

from metrale_orch.dataclass_code import install
from metrale_orch.paths import user_cache_home

__all__ = ["main"]


def main() -> int:
    """Run the CLI on this process's command line and environment; its exit code."""
    install(user_cache_home(os.environ))
    from metrale_orch.cli import main as run_cli  # after the install: see the docstring

    return run_cli()
