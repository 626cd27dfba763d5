"""``metrale-orch compdb [PATTERN]``: the compilation database of chosen targets, without
compiling.

The targets and what doit would do with each come from the task specs ``doit`` itself
uses (through its task cache). Each chosen target that builds is planned and staged
exactly as its build does (:func:`~metrale_orch.steps.target.stage_target`, which also
refreshes its part) under the project's build lock, and
``<build_dir>/compile_commands.json`` is written from the
chosen targets' commands alone (:mod:`metrale_orch.steps.compdb`): with a pattern the
entries are those of the targets it selects, the first in sorted order for a file
several of them compile. Skipped targets (no compiler here) and failing ones contribute
nothing and are returned with their reason; so are the includes an editor of an entry's
file resolves otherwise than its target's compile.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.config import Config
from metrale_orch.errors import EXIT_USAGE, MetraleError
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.steps.compdb import (
    Difference,
    TargetCommands,
    Written,
    entry_targets,
    write_database,
)
from metrale_orch.steps.errors import ToolchainMissing
from metrale_orch.steps.target import stage_target
from metrale_orch.tasks.runlock import BuildLock
from metrale_orch.tasks.specs import cached_build_specs
from metrale_orch.tree import Target
from metrale_orch.views.status import choose_specs

__all__ = ["CompdbRun", "Unstaged", "write_compdb"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Unstaged:
    """A chosen target that contributes no commands, and why."""

    target: str
    reason: str
    #: The exit status it stands for: 0 for a skip, else the error's.
    exit_code: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CompdbRun:
    """What :func:`write_compdb` did."""

    written: Written
    #: Chosen targets whose toolchain is not installed here.
    skipped: tuple[Unstaged, ...]
    #: Chosen targets that do not resolve, or could not be planned or staged.
    failed: tuple[Unstaged, ...]
    #: Includes an editor of an entry's file resolves otherwise than that entry's
    #: target's compile (:func:`~metrale_orch.steps.compdb.editor_differences`), sorted.
    differences: tuple[Difference, ...] = ()


def write_compdb(
    root: Path,
    environ: Mapping[str, str],
    pattern: str | None,
    *,
    config: Config,
    say: Callable[[str], None],
) -> CompdbRun:
    """Stage the targets ``pattern`` selects (fnmatch over ``hw/model/quant``, all when
    None) and write the database of their commands; nothing is compiled. Staging writes
    the build directory, so this holds the project's build lock (a build running waits,
    or this waits for it, saying so through ``say``). Raises
    :class:`~metrale_orch.views.status.NoSuchTarget` when the pattern selects no target,
    OSError when the lock or the database cannot be written."""
    root = Path(root).resolve()
    specs, _how = cached_build_specs(root, environ, config=config)
    chosen = choose_specs(root, specs, pattern)
    lock = BuildLock(Path(config.build_dir))
    lock.acquire(say)
    try:
        return _stage_all(root, environ, chosen, config)
    finally:
        lock.release()


def _stage_all(
    root: Path, environ: Mapping[str, str], chosen: list[BuildSpec], config: Config
) -> CompdbRun:
    parts: list[TargetCommands] = []
    found: dict[Target, tuple[Difference, ...]] = {}
    skipped: list[Unstaged] = []
    failed: list[Unstaged] = []
    for spec in chosen:
        if spec.kind == "skip":
            skipped.append(Unstaged(target=spec.target, reason=spec.message))
            continue
        if spec.kind == "error":
            failed.append(Unstaged(target=spec.target, reason=spec.message, exit_code=EXIT_USAGE))
            continue
        target = Target.parse(spec.target)
        try:
            part, found[target] = stage_target(root, target, config=config, environ=environ)
        except ToolchainMissing as exc:
            skipped.append(Unstaged(target=spec.target, reason=str(exc)))
        except MetraleError as exc:
            failed.append(Unstaged(target=spec.target, reason=str(exc), exit_code=exc.exit_code))
        else:
            parts.append(part)
    written = write_database(root, Path(config.build_dir), parts)
    owners = entry_targets(parts)
    differences = sorted(
        (d for target, ds in found.items() for d in ds if owners.get(d.file) == target),
        key=lambda d: (d.file, d.includer, d.name),
    )
    return CompdbRun(
        written=written,
        skipped=tuple(skipped),
        failed=tuple(failed),
        differences=tuple(differences),
    )
