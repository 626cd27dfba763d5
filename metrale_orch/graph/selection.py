"""What a driver of the build graph was asked to do (a value)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from metrale_orch.paths import BUILD_TASK

__all__ = ["Selection", "explicit_targets"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """What a doit command was asked to do, as doit parsed its command line."""

    #: doit's command (``run`` for ``doit`` and ``doit run``, ``list``, ``clean`` ...).
    command: str
    #: Its positional words: task names and wildcards (empty: the default tasks).
    words: tuple[str, ...]
    #: The task creators of the dodo file's namespace, None when not known.
    creators: tuple[object, ...] | None = None


def explicit_targets(argv: Sequence[str], base: str = BUILD_TASK) -> frozenset[str]:
    """Targets named exactly (``build:<target>``, no ``*``) among command-line words (pure).

    A group (``build``), a wildcard (``build:hopper/*``) or the default tasks
    select broadly; only a full sub-task name is an explicit selection.
    """
    prefix = base + ":"
    return frozenset(
        word[len(prefix) :]
        for word in argv
        if word.startswith(prefix) and "*" not in word and len(word) > len(prefix)
    )
