"""The ``smoke:<hw>`` tasks: their dicts and their doit action.

:func:`smoke_task_dicts` makes them from the build graph's specs, sharing the build's
resolution: :func:`smoke_tasks`, one task dict per hardware (pure), depending on every
``build:<target>`` of that hardware and always running (it is a test);
:func:`run_smoke_action` runs :func:`~metrale_orch.smoke.run.run_smoke`, writes
``<build_dir>/smoke-<hw>.xml`` and turns a failure into doit's ``TaskFailed``.

This module is loaded on every doit invocation (the task cache replays
``run_smoke_action`` by module and name), so it imports the smoke run itself only
when the action runs: the tree, the artefact readers and the references stay off
the no-op path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from doit.exceptions import TaskFailed

from metrale_orch.config import Config, load_config
from metrale_orch.errors import MetraleError
from metrale_orch.graph.specs import BuildSpec
from metrale_orch.paths import BUILD_TASK, SMOKE_TASK, TREE_TASK, root_relative
from metrale_orch.tasks.dicts import TaskDict
from metrale_orch.tasks.values import SummaryValues

if TYPE_CHECKING:
    from metrale_orch.tree import Layout, LayoutError, Target

__all__ = ["SmokeTaskDict", "run_smoke_action", "smoke_task_dicts", "smoke_tasks"]

#: Smoke's own logger name (the shared log shows it), wherever the code lives.
log = logging.getLogger("metrale_orch.smoke")


class SmokeTaskDict(TypedDict):
    """One ``smoke:<hw>`` sub-task, as doit reads it."""

    name: str
    doc: str
    actions: list[tuple[Callable[..., object], list[object]]]
    task_dep: list[str]
    uptodate: list[bool]
    verbosity: int


def run_smoke_action(
    root: str, hw: str, targets: list[str], build_dir: str
) -> dict[str, object] | TaskFailed:
    """doit python-action of ``smoke:<hw>``: run, write ``<build_dir>/smoke-<hw>.xml``.

    Returns a dict of values (``summary``: the console line, ``report``: the
    XML path, counts) on success, ``doit.exceptions.TaskFailed`` (message: the
    summary and each failure) when a check failed.
    """
    # Deferred: see the module's docstring (this is the no-op path's only smoke import).
    from metrale_orch.smoke import run_smoke, write_junit

    report = run_smoke(root, hw, build_dir=build_dir, targets=targets)
    xml = write_junit(report, Path(build_dir) / f"smoke-{hw}.xml")
    summary = report.summary_line()
    log.info("%s (report: %s)", summary, xml)
    if report.ok:
        return SummaryValues(
            summary=summary,
            report=root_relative(xml, Path(root)),
            passed=report.count("passed"),
            skipped=report.count("skipped"),
            failed=0,
        ).to_values()
    lines = [summary] + [
        f"  FAIL {r.target} {r.module}::{r.case}: {r.message}" for r in report.failures()
    ]
    return TaskFailed("\n".join(lines))


def smoke_tasks(
    root: Path,
    config: Config,
    layouts_by_hw: Mapping[str, Sequence[tuple[Target, Layout | LayoutError]]],
) -> Iterator[SmokeTaskDict]:
    """Sub-task dicts of ``smoke``: one ``smoke:<hw>`` per hardware, after its builds. Pure.

    Yield them from the ``task_smoke`` generator; each depends on every
    ``build:<target>`` of its hardware and always runs (it is a test).
    """
    for hw in sorted(layouts_by_hw):
        targets = sorted(str(t) for t, _ in layouts_by_hw[hw])
        yield {
            "name": hw,
            "doc": f"smoke-test {hw}'s artefacts (static checks; numbers on a CUDA device)",
            "actions": [(run_smoke_action, [str(root), hw, targets, str(config.build_dir)])],
            "task_dep": [f"{BUILD_TASK}:{t}" for t in targets],
            "uptodate": [False],
            "verbosity": 2,
        }


def smoke_task_dicts(
    root: Path,
    environ: Mapping[str, str],
    specs: Sequence[BuildSpec],
    config: Config | None = None,
) -> list[TaskDict]:
    """``smoke:<hw>`` task dicts from :mod:`metrale_orch.smoke`, sharing the build's resolution.

    HOOK(smoke): the smoke package owns these tasks (``smoke_tasks(root, config,
    layouts_by_hw)``); each depends on its hardware's ``build:<hw>/...`` tasks.
    They are yielded by ``task_build`` with ``basename = "smoke"`` so the tree
    is resolved once per doit invocation. Nothing when the configuration fails.
    ``config``: the run's (None: loaded here).
    """
    from metrale_orch.tree import Target  # see the module docstring: only on a miss

    if config is None:
        try:
            config = load_config(root, environ)
        except MetraleError:
            return []
    by_hw: dict[str, list[tuple[Target, Layout | LayoutError]]] = {}
    for spec in specs:
        if spec.target == TREE_TASK:
            continue
        try:
            target = Target.parse(spec.target)
        except ValueError:  # a name given on the command line that is no target
            continue
        resolved = spec.resolved
        by_hw.setdefault(target.hardware, []).append((target, resolved))  # type: ignore[arg-type]
    out: list[TaskDict] = [
        {
            "basename": SMOKE_TASK,
            "name": None,
            "doc": "smoke-test the built kernels of each hardware",
        }
    ]
    for task in smoke_tasks(root, config, by_hw):
        out.append({**task, "basename": SMOKE_TASK})
    return out if len(out) > 1 else []
