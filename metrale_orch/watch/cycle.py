"""One cycle of the edit loop as values (pure): which targets a change reaches, the doit
words that build them, and what the build's report says each target did.

A change is either *local* (the bytes of files that are some targets' file dependencies)
or it changes the *graph* (a file added or removed under a watched root, a manifest or
another TOML file under ``kernels/``, a toolchain definition, ``pyproject.toml``): task
generation must then run again, as the task cache's key says. A local change builds
exactly the targets whose file dependencies hold a changed file (``build:<target>``
each); a graph change builds the whole selection, and doit's own up-to-date check skips
what it does not reach. A change to the toolchain definitions or the settings also
begins a new run (:func:`needs_fresh_run`): the probes and the configuration were made
from them.

:func:`read_report` reads what the build reporter printed
(:mod:`~metrale_orch.tasks.report_lines`' lines: ``done build:<t>: <outcome> in …``,
``FAILED build:<t>: …`` with the compiler's output after it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from metrale_orch.paths import BUILD_TASK
from metrale_orch.watch.changes import PYPROJECT, Changes

__all__ = [
    "TargetOutcome",
    "affected_targets",
    "cycle_words",
    "is_graph_change",
    "needs_fresh_run",
    "pattern_words",
    "read_report",
]

_BASE = BUILD_TASK + ":"
#: How many lines of a failure's compiler output a cycle keeps.
ERROR_LINES = 3


def pattern_words(patterns: Sequence[str]) -> tuple[str, ...]:
    """The doit words of ``metrale-orch watch PATTERN...`` (pure): ``build:<pattern>`` each
    (a pattern may carry the ``build:`` prefix already), or the group ``build`` for none."""
    if not patterns:
        return (BUILD_TASK,)
    return tuple(sorted({p if p.startswith(_BASE) else _BASE + p for p in patterns}))


def needs_fresh_run(changes: Changes) -> bool:
    """Whether ``changes`` touch what the run's configuration and probes were made from."""
    return any(p == PYPROJECT or p.startswith("toolchains/") for p in changes.paths())


def is_graph_change(changes: Changes) -> bool:
    """Whether ``changes`` can change the generated tasks (see the module docstring)."""
    if changes.added or changes.removed or needs_fresh_run(changes):
        return True
    return any(p.startswith("kernels/") and p.lower().endswith(".toml") for p in changes.changed)


def affected_targets(paths: Iterable[str], deps: Mapping[str, frozenset[str]]) -> tuple[str, ...]:
    """The targets whose file dependencies (``deps``: target -> its files) hold one of
    ``paths``, sorted."""
    wanted = set(paths)
    return tuple(sorted(t for t, files in deps.items() if not wanted.isdisjoint(files)))


def cycle_words(
    changes: Changes, deps: Mapping[str, frozenset[str]], selection: Sequence[str]
) -> tuple[str, ...]:
    """The doit words of the cycle ``changes`` call for: the whole ``selection`` for a graph
    change, else ``build:<target>`` for each target reached (none: nothing to build)."""
    if is_graph_change(changes):
        return tuple(selection)
    return tuple(_BASE + t for t in affected_targets(changes.changed, deps))


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetOutcome:
    """What one target did in a cycle, as the build reported it."""

    target: str
    #: The summary's word: "built", "from cache" or "failed".
    outcome: str
    #: Its modules in the ``cache:`` line's words ("1 compiled, 1 shared"), or "".
    modules: str = ""
    #: A failure's first lines of compiler output (else its message).
    errors: tuple[str, ...] = ()


_DONE = re.compile(
    r"done build:(?P<target>\S+): (?P<outcome>.+?) in [\d.]+ s(?: \((?P<mods>.*)\))?$"
)
_FAILED = "FAILED " + _BASE
#: Lines the reporter writes that end a failure's block of compiler output.
_OTHER = ("done ", "FAILED ", "[", "build: ", "cache: ", "warning: ", "skipped ", "interrupted")


def read_report(text: str) -> tuple[TargetOutcome, ...]:
    """Each target the report ``text`` shows as finished or failed, by target."""
    found: dict[str, TargetOutcome] = {}
    errors: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(_FAILED):
            target, _, message = line[len(_FAILED) :].partition(": ")
            message = message.removeprefix(f"{target}: ")  # a build error names it again
            current = errors.setdefault(target, [message.strip()])
            continue
        if line.startswith(_OTHER):
            current = None
        elif current is not None:
            current.append(line.rstrip())
        match = _DONE.match(line)
        if match:
            target, modules = match["target"], match["mods"] or ""
            found[target] = TargetOutcome(
                target=target, outcome=match["outcome"], modules=modules.partition(": ")[2]
            )
    for target, lines in errors.items():
        done = found.get(target)
        found[target] = TargetOutcome(
            target=target,
            outcome="failed",
            modules=done.modules if done is not None else "",
            errors=_first_errors(lines),
        )
    return tuple(found[t] for t in sorted(found))


def _first_errors(lines: Sequence[str]) -> tuple[str, ...]:
    """A failure's first compiler lines (the command line left out), else its message."""
    output = [ln.strip() for ln in lines[1:] if ln.strip() and not ln.lstrip().startswith("$ ")]
    return tuple(output[:ERROR_LINES] or lines[:1])
