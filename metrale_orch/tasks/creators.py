"""What ``task_build`` yields, through the task cache (:mod:`metrale_orch.graph.cached`):
the build graph's specs, and the ``smoke:<hw>`` task dicts stored with them.

The specs are the graph's; the ``smoke:<hw>`` dicts are this adapter's, recorded with
the specs as the cache entry's ``extra`` (plain data and module-level functions) and
replayed on a hit, equal to what :func:`~metrale_orch.tasks.smoke.smoke_task_dicts`
would give. This module imports no generation (a no-op runs without it).
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from metrale_orch.config import Config
from metrale_orch.graph.cached import Generation, cached_specs
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.tasks.dicts import TaskDict
from metrale_orch.tasks.doit_api import doit_version
from metrale_orch.tasks.smoke import smoke_task_dicts
from metrale_orch.toolchain.probe import ProbeMemo

__all__ = ["cached_tasks", "record_task_dicts", "replay_task_dicts"]


def cached_tasks(
    root: Path,
    environ: Mapping[str, str],
    argv: Sequence[str],
    generation: Callable[[], Generation],
    probes: ProbeMemo | None = None,
    scope: Sequence[str] | None = None,
    config: Config | None = None,
) -> tuple[list[BuildSpec], list[TaskDict] | None, str]:
    """The specs (:func:`~metrale_orch.graph.cached.cached_specs`), the ``smoke`` task
    dicts when known (None: ask :func:`~metrale_orch.tasks.smoke.smoke_task_dicts`), and
    how the specs were obtained. A run scoped to some ``build`` sub-tasks has no smoke
    task."""
    made: list[list[TaskDict]] = []

    def smoke(specs: Sequence[BuildSpec], config: Config) -> object:
        dicts: list[TaskDict] = []
        if scope is None:  # a scoped run has no smoke task
            dicts = smoke_task_dicts(root, environ, specs, config)
        made.append(dicts)
        recorded = record_task_dicts(dicts)
        return None if recorded is None else [recorded]

    specs, stored, how = cached_specs(
        root,
        environ,
        argv,
        generation,
        driver=doit_version(),
        probes=probes,
        scope=scope,
        config=config,
        extra=smoke,
    )
    if made:
        return specs, made[0], how
    replayed = replay_task_dicts(stored)
    return specs, [] if replayed is None and scope is not None else replayed, how


#: Marks a module-level function in a recorded task dict: (_FUNCTION, module, name).
_FUNCTION = "\0function"


class _Unrecordable(Exception):
    pass


def _record_value(v: object) -> object:
    if v is None or isinstance(v, str | int | float | bool):
        return v
    if isinstance(v, list):
        return [_record_value(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_record_value(x) for x in v)
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {k: _record_value(x) for k, x in v.items()}
    if isinstance(v, types.FunctionType):
        name, where = str(v.__qualname__), str(v.__module__)
        if "." not in name and getattr(importlib.import_module(where), name, None) is v:
            return (_FUNCTION, where, name)
    raise _Unrecordable


def record_task_dicts(value: object) -> object:
    """``value`` (task dicts) as data the task cache can store, or None when it holds
    anything but plain data and module-level functions (then it is not cached)."""
    try:
        return _record_value(value)
    except _Unrecordable:
        return None


def _replay_value(v: object) -> object:
    if isinstance(v, list):
        return [_replay_value(x) for x in v]
    if isinstance(v, tuple):
        if len(v) == 3 and v[0] == _FUNCTION:
            return getattr(importlib.import_module(v[1]), v[2])
        return tuple(_replay_value(x) for x in v)
    if isinstance(v, dict):
        return {k: _replay_value(x) for k, x in v.items()}
    return v


def replay_task_dicts(extra: object) -> list[TaskDict] | None:
    """The task dicts :func:`record_task_dicts` recorded (in ``[recorded]``), else None."""
    if not isinstance(extra, list) or len(extra) != 1 or not isinstance(extra[0], list):
        return None
    try:
        return [task for task in map(_replay_value, extra[0]) if isinstance(task, dict)]
    except (ImportError, AttributeError):
        return None
