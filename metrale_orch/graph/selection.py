"""What a driver of the build graph was asked to do (a value)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Selection"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """What a doit command was asked to do, as doit parsed its command line."""

    #: doit's command (``run`` for ``doit`` and ``doit run``, ``list``, ``clean`` ...).
    command: str
    #: Its positional words: task names and wildcards (empty: the default tasks).
    words: tuple[str, ...]
    #: The task creators of the dodo file's namespace, None when not known.
    creators: tuple[object, ...] | None = None
