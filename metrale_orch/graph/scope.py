"""Which ``build`` sub-tasks a doit run needs: its scope (pure).

``doit build:hopper/m/q`` (the edit-build loop of one target) or ``doit 'build:hopper/*'``
needs those sub-tasks and no other task, so the task generation, the task cache and
the toolchain probes need only their targets (:func:`~metrale_orch.graph.cached.cached_specs`):
a HIP compiler is not probed for an NVIDIA target. Any other run (the default tasks,
``doit build``, ``smoke:<hw>``, ``doit list``, ``doit clean``) may ask for every task.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from metrale_orch.graph.selection import Selection
from metrale_orch.paths import BUILD_TASK

__all__ = ["build_scope", "in_scope", "selection_scope"]


#: The package's dodo module and its task creators (what ``from metrale_orch.dodo import *``
#: takes): a dodo file with any other may depend on any build sub-task.
_DODO = "metrale_orch.dodo"
_OURS = frozenset({"task_build", "task_check", "task_coverage"})


def selection_scope(selection: Selection | None, *, guess: bool = False) -> tuple[str, ...] | None:
    """The scope of a run asked ``selection`` (pure): :func:`build_scope` of a ``run``
    command's words, when the dodo file's task creators are the package's alone. Another
    creator's task may depend on any build sub-task (doit checks every loaded task's
    dependencies), so the whole tree is generated then, and when the creators are not
    known; ``guess``: assume them the package's (while the dodo file is imported: only the
    probes' head start rides on it)."""
    if selection is None or selection.command != "run":
        return None
    scope = build_scope(selection.words)
    if scope is None:
        return None
    if selection.creators is None:
        return scope if guess else None
    for creator in selection.creators:
        module, name = getattr(creator, "__module__", None), getattr(creator, "__name__", None)
        if module != _DODO or name not in _OURS:
            return None
    return scope


def build_scope(selection: Sequence[str] | None) -> tuple[str, ...] | None:
    """The words of a doit ``run`` selection (:class:`~metrale_orch.graph.selection.Selection`)
    when it selects ``build``
    sub-tasks only, sorted and unique: each a sub-task's full
    name (``build:<target>``) or a wildcard of them (``build:hopper/*``). None when it
    may select anything else (pure): no words (the default tasks), the group ``build``,
    a ``smoke`` task, anything another command or no command asked for.

    A run so scoped needs the sub-tasks :func:`in_scope` matches and no other task: it
    generates, caches and probes for those targets alone.
    """
    if not selection:
        return None
    prefix = BUILD_TASK + ":"
    if not all(word.startswith(prefix) and len(word) > len(prefix) for word in selection):
        return None
    return tuple(sorted(set(selection)))


def in_scope(target: str, scope: Sequence[str] | None) -> bool:
    """Whether doit selects the sub-task of ``target`` by one of ``scope``'s words (pure),
    as doit reads them: a word with ``*`` as a ``fnmatch`` pattern of task names, any
    other as a task name. Every target is in the scope None."""
    if scope is None:
        return True
    name = f"{BUILD_TASK}:{target}"
    return any(name == w if "*" not in w else fnmatch.fnmatch(name, w) for w in scope)
