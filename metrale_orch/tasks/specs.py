"""The doit side of generation: the build graph's specs as doit's task dicts.

:func:`load_build_tasks` and :func:`cached_build_specs` are generation
(:mod:`metrale_orch.graph.generate`) and the task cache as doit sees them (what the
``metrale-orch`` views and the benchmarks run). Imports the generation: a doit run never
imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale_orch.config import Config
from metrale_orch.graph.cached import named_failures
from metrale_orch.graph.generate import GENERATION, resolve_build_specs
from metrale_orch.graph.selection import explicit_targets
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.tasks.creators import cached_tasks
from metrale_orch.tasks.dicts import TaskDict, task_dict

__all__ = ["cached_build_specs", "load_build_tasks"]


def load_build_tasks(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> list[TaskDict]:
    """The ``build`` sub-task dicts of :func:`~metrale_orch.graph.generate.resolve_build_specs`."""
    return [task_dict(spec, root) for spec in resolve_build_specs(root, environ, argv)]


def cached_build_specs(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str] = (),
    *,
    config: Config | None = None,
) -> tuple[list[BuildSpec], str]:
    """:func:`~metrale_orch.graph.generate.resolve_build_specs` through the task cache
    (:mod:`metrale_orch.tasks.creators`).

    Returns the specs and how they were obtained: ``"hit"`` (the specs carry no
    ``plan``/``layout``/``resolved``), or the reason of a miss (generated, and
    cached when possible). The task dicts are the same either way. ``config``: the
    caller's (None: loaded from ``environ``).
    """
    specs, _smoke, how = cached_tasks(root, environ, argv, lambda: GENERATION, config=config)
    return specs + named_failures(root, specs, explicit_targets(argv)), how
