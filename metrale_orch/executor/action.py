"""A compile action and the executor interface (pure values and a protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from metrale_orch.errors import MetraleError
from metrale_orch.proc import Completed

__all__ = ["Action", "ActionStopped", "Executor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One compiler invocation, as an executor sees it."""

    argv: tuple[str, ...]
    #: The working directory; every path in ``argv`` that can be is relative to it.
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)
    #: Seconds before the action is killed and reported as timed out.
    timeout: float = 900.0
    #: Expected seconds (from the last build's profile; 0 when unknown): among waiting
    #: actions the longest expected starts first, so a build does not end on one long one.
    expected: float = 0.0
    #: What the action is for, in logs ("hopper/qwen3-8b/bf16 gemv").
    label: str = ""


class ActionStopped(MetraleError):
    """The executor was stopped (Ctrl-C, SIGTERM) before or while the action ran."""

    exit_code = 130


class Executor(Protocol):
    """Runs compile actions. ``run`` blocks the calling thread until the action ends; it
    may be called from many threads at once, and runs at most ``jobs`` actions at a
    time. Raises :class:`~metrale_orch.proc.ProcessError` for an action that failed
    (could not start, timed out, exited non-zero) and :class:`ActionStopped` after
    :meth:`stop`."""

    @property
    def jobs(self) -> int: ...

    @property
    def running(self) -> int:
        """How many actions run right now."""
        ...

    def run(self, action: Action) -> Completed: ...

    def stop(self) -> None:
        """Stop every action in flight now and refuse every later one."""
        ...
