"""A compile action and the executor interface (pure values and a protocol)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from metrale_orch.errors import MetraleError
from metrale_orch.proc import Completed

__all__ = ["Action", "ActionStopped", "Executor", "RemoteForm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteForm:
    """The same compile as a remote executor sends it (REAPI): an input root, a working
    directory in it, outputs at fixed places in it, and only what the compile needs.

    The local form's outputs are in a fresh temporary directory (its name differs every
    run); here they are at fixed paths under the root, so the same compile is the same
    remote action in every run and checkout (the action cache can answer it).
    """

    #: The local directory whose files make the input root.
    root: Path
    #: The input root: path relative to ``root`` (POSIX) -> xxh3-128 hex of its bytes
    #: (the stage's hashes: the executor finds each file's SHA-256 through them).
    files: Mapping[str, str]
    #: The working directory, relative to ``root``.
    cwd: str
    #: The argv as the worker runs it (the program by name, found on the env's PATH).
    argv: tuple[str, ...]
    #: The whole environment the worker gives the compile (sorted by the executor).
    env: Mapping[str, str]
    #: Output path relative to ``root`` -> the local path its bytes are written to.
    outputs: Mapping[str, Path]
    #: Platform properties a worker must offer (toolchain, OS, ISA, image).
    platform: Mapping[str, str]
    #: Why this compile cannot run remotely ("": it can): it names a file outside the
    #: input root and the toolchain's directories, or needs a step the form lacks.
    local_reason: str = ""


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
    #: Predicted peak memory in bytes (from the last build; 0 when unknown): the local
    #: executor starts it only while the running actions' predictions and it fit.
    memory: int = 0
    #: What the action is for, in logs ("hopper/qwen3-8b/bf16 gemv").
    label: str = ""
    #: The remote form, for an executor that can send it (None: local only).
    remote: RemoteForm | None = None
    #: Who asked (the target), for the counts of where actions ran.
    owner: str = ""
    #: The directory the action writes its outputs into, made (with its parents) by an
    #: executor that runs it here where it is not yet a directory (never through a link).
    #: A remote run brings its outputs back in memory instead
    #: (:attr:`~metrale_orch.proc.Completed.outputs`).
    scratch: Path | None = None


class ActionStopped(MetraleError):
    """The executor was stopped (Ctrl-C, SIGTERM) before or while the action ran."""

    exit_code = 130


class Executor(Protocol):
    """Runs compile actions. ``run`` is a coroutine of the build's event loop (one per
    process, :class:`~metrale_orch.executor.loop.ActionLoop`): an action waiting for a
    slot, a compiler or a remote engine holds no thread. At most ``jobs`` actions run at
    a time. Raises :class:`~metrale_orch.proc.ProcessError` for an action that failed
    (could not start, timed out, exited non-zero) and :class:`ActionStopped` after
    :meth:`stop`."""

    @property
    def jobs(self) -> int: ...

    @property
    def running(self) -> int:
        """How many actions run right now."""
        ...

    async def run(self, action: Action) -> Completed: ...

    def stop(self) -> None:
        """Stop every action in flight now and refuse every later one (from any thread)."""
        ...
