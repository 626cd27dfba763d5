"""What a project's one-line ``dodo.py`` star-imports: doit's config and task creators.

    from metrale_orch.dodo import *  # noqa: F403

Tasks (generated on every doit invocation from the tree, see
:func:`load_build_tasks`):

- ``build:<hw>/<model>/<quant>`` per walked target (the group ``build`` is the
  default task): ``doit``, ``doit build``, ``doit 'build:hopper/*'``,
  ``doit -n 2 -P process build``, ``doit list --all --status``,
  ``doit clean``, ``doit forget`` behave as doit users expect.
- ``check``: validate the whole tree (``metrale-orch check``).
- ``smoke:<hw>``: after that hardware's builds (provided by
  :mod:`metrale_orch.smoke`; yielded by ``task_build`` so the tree resolves once).

The root is doit's working directory while tasks load: the directory of the
dodo file, or the one given with ``doit -d``. Configuration comes from
:func:`metrale_orch.config.load_config` (``pyproject.toml`` and
``METRALE_ORCH_*``).

Missing toolchains: a target whose compiler is not installed becomes a task
that *succeeds* reporting ``skipped`` (one summary line per reason) when it was
selected broadly — the group ``build``, a wildcard such as ``build:metal/*``,
the default tasks, or a dependency of ``smoke:<hw>`` — and *fails* with what to
install when its full name was given on the command line (``doit
build:metal/m/q``). doit expands wildcards before any task sees the selection,
so the task loader reads the command line (``sys.argv``) to tell the two
apart; callers driving doit through its API get the broad behaviour.

Nothing here runs at import time: the config below only names classes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale_orch._actions import install_sigterm_handler
from metrale_orch._checker import ContentChecker
from metrale_orch._reporter import BuildReporter
from metrale_orch._tasks import (
    BUILD,
    explicit_targets,
    plan_build_task,
    plan_error_task,
    plan_skip_task,
)

__all__ = ["DOIT_CONFIG", "task_build", "task_check"]  # what `import *` takes

#: Name of the sub-task carrying a failure of the whole tree (config or walk error).
TREE_TASK = "(tree)"

DOIT_CONFIG: dict[str, Any] = {
    "default_tasks": [BUILD],
    "backend": "sqlite3",
    "dep_file": ".doit.db",
    "check_file_uptodate": ContentChecker,
    "reporter": BuildReporter,
    "verbosity": 0,
    # A failing target (tree or compile error) must not stop the others.
    "continue": True,
    "minversion": "0.37.0",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildSpec:
    """One ``build`` sub-task with what it came from (for ``metrale-orch status/why/rdeps``)."""

    target: str
    #: "build", "skip" (toolchain missing) or "error" (tree, config or plan error).
    kind: str
    #: The skip reason or error message; "" for a build.
    message: str = ""
    #: The compile plan (``metrale_orch.compile.TargetPlan``) of a build, else None.
    plan: Any = None
    #: The resolved layout of a build, else None.
    layout: Any = None
    #: The doit task dict.
    task: Mapping[str, Any]
    #: What resolution gave: the Layout, the LayoutError, or None (tree-wide failure).
    resolved: Any = None


def resolve_build_specs(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> list[BuildSpec]:
    """Every ``build`` sub-task of the tree at ``root`` (reads the tree, probes compilers).

    Never raises for a tree, config or toolchain problem: those become failing
    (or, for a missing toolchain, skipping) sub-tasks.
    """
    from metrale_orch.compile import plan_target
    from metrale_orch.config import load_config
    from metrale_orch.errors import MetraleError
    from metrale_orch.layout import LayoutError, resolve_all
    from metrale_orch.toolchains import (
        ToolchainMissing,
        find_toolchain,
        load_toolchains,
        select_toolchain,
    )

    def error(name: str, message: str, resolved: Any = None) -> BuildSpec:
        task = plan_error_task(root=root, target=name, message=message)
        return BuildSpec(target=name, kind="error", message=message, task=task, resolved=resolved)

    try:
        config = load_config(root, environ)
        toolchains = load_toolchains(root)
        resolved = resolve_all(root)
    except MetraleError as exc:
        return [error(TREE_TASK, str(exc))]

    explicit = explicit_targets(argv)
    found: dict[str, Any] = {}
    specs: list[BuildSpec] = []
    for target, layout in resolved:
        name = str(target)
        if isinstance(layout, LayoutError):
            specs.append(error(name, str(layout), layout))
            continue
        try:
            toolchain = select_toolchain(layout.hardware, toolchains)
            if toolchain.name not in found:
                try:
                    found[toolchain.name] = find_toolchain(
                        toolchain, environ, state_dir=config.build_dir / ".state"
                    )
                except ToolchainMissing as missing:
                    found[toolchain.name] = missing
            tool = found[toolchain.name]
            if isinstance(tool, ToolchainMissing):
                reason = str(tool)
                task = plan_skip_task(
                    root=root, target=name, reason=reason, explicit=name in explicit
                )
                specs.append(
                    BuildSpec(target=name, kind="skip", message=reason, task=task, resolved=layout)
                )
                continue
            plan = plan_target(root, layout, toolchains, identity=tool.identity, environ=environ)
        except MetraleError as exc:
            specs.append(error(name, str(exc), layout))
            continue
        out_dir = config.build_dir / target.hardware / target.model / target.quant
        task = plan_build_task(
            root=root,
            target=name,
            file_deps=plan.file_deps,
            signature=plan.signature,
            manifest=out_dir / "manifest.json",
        )
        specs.append(
            BuildSpec(
                target=name, kind="build", plan=plan, layout=layout, task=task, resolved=layout
            )
        )
    return specs


def load_build_tasks(
    root: Path, environ: Mapping[str, str], argv: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The ``build`` sub-task dicts of :func:`resolve_build_specs`."""
    return [dict(spec.task) for spec in resolve_build_specs(root, environ, argv)]


def smoke_task_dicts(
    root: Path, environ: Mapping[str, str], specs: Sequence[BuildSpec]
) -> list[dict[str, Any]]:
    """``smoke:<hw>`` task dicts from :mod:`metrale_orch.smoke`, sharing the build's resolution.

    HOOK(smoke): the smoke module owns these tasks (``smoke_tasks(root, config,
    layouts_by_hw)``); each depends on its hardware's ``build:<hw>/...`` tasks.
    They are yielded by :func:`task_build` with ``basename = "smoke"`` so the tree
    is resolved once per doit invocation. Nothing when the module is absent.
    """
    try:
        from metrale_orch.smoke import smoke_tasks
    except ImportError:
        return []
    from metrale_orch.config import load_config
    from metrale_orch.errors import MetraleError
    from metrale_orch.layout import Target

    try:
        config = load_config(root, environ)
    except MetraleError:
        return []
    by_hw: dict[str, list[tuple[Any, Any]]] = {}
    for spec in specs:
        if spec.target == TREE_TASK:
            continue
        target = Target.parse(spec.target)
        by_hw.setdefault(target.hardware, []).append((target, spec.resolved))
    out: list[dict[str, Any]] = [
        {"basename": "smoke", "name": None, "doc": "smoke-test the built kernels of each hardware"}
    ]
    for task in smoke_tasks(root, config, by_hw):
        out.append({**task, "basename": "smoke"})
    return out if len(out) > 1 else []


def task_build() -> Iterator[dict[str, Any]]:
    """Build kernel targets: build:<hw>/<model>/<quant> (wildcards: 'build:hopper/*')."""
    install_sigterm_handler()
    root = Path.cwd()
    specs = resolve_build_specs(root, os.environ, sys.argv[1:])
    yield {"name": None, "doc": "build every target (skipping those without a toolchain)"}
    for spec in specs:
        yield dict(spec.task)
    # HOOK(smoke): smoke:<hw> tasks (see smoke_task_dicts).
    yield from smoke_task_dicts(root, os.environ, specs)


def task_check() -> dict[str, Any]:
    """Validate the whole kernel tree (every target resolves, no symlinks, no dead shadows)."""
    from metrale_orch._actions import check_action

    return {
        "actions": [(check_action, [str(Path.cwd())])],
        "uptodate": [False],
        "verbosity": 2,
    }
