"""What a project's one-line ``dodo.py`` star-imports: doit's config and task creators.

    from metrale_orch.dodo import *  # noqa: F403

Tasks (generated on every doit invocation from the tree, see
:func:`metrale_orch.graph.generate.resolve_build_specs`):

- ``build:<hw>/<model>/<quant>`` per walked target (the group ``build`` is the
  default task): ``doit``, ``doit build``, ``doit 'build:hopper/*'``,
  ``doit -n 2 -P process build``, ``doit list --all --status``,
  ``doit clean``, ``doit forget`` behave as doit users expect.
- ``check``: will the build accept this tree? (``metrale-orch check``).
- ``coverage``: after every build, does the build hold every kernel the tree names?
  (``metrale-orch coverage``).
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
so the run is told what doit was asked: by the package's task loader
(:mod:`metrale_orch.tasks.loader`, doit's documented door: ``metrale-orch doit``, or a
``pyproject.toml`` naming it), else off doit's frame (plain ``doit`` with this file
alone; :func:`~metrale_orch.tasks.doit_api.loading_run`); callers driving doit through
its API without either get the broad behaviour.

Every view shows why: an error or skip sub-task's doc carries its reason (``doit
list --status`` prints it on the target's line), and a target named on the
command line that is not generated — the configuration or the walk of the tree
failed, or the name is no target — becomes a failing sub-task with the reason
(:func:`metrale_orch.graph.cached.named_failures`) instead of doit's ``Invalid parameter``.

No-op speed: generating the tasks (resolving every target, planning it) costs
several times doit's own up-to-date checks, so ``task_build`` goes through a
task cache (:mod:`metrale_orch.graph.cached`, ``metrale_orch.graph.taskcache``,
``<build_dir>/.state/build-tasks.*.cache``): while the tree's shape, its TOML
files, the configuration, the toolchains, the relevant environment and this
package are unchanged, the task dicts come from the cache, equal to what
generation would give. Deleting the files only costs one regeneration.
``task_build`` also keeps the cyclic garbage collector out of generation and
freezes what it loaded (``gc.freeze``) so doit's later collections skip it.

At import time two things run: unless the package's loader will tell the selection
later, the dry runs the last run's probes asked for start (the probes' one head start,
:mod:`metrale_orch.toolchain.earlyruns`, into the run's probe memo: a no-op then waits
for them less); and the run's configuration is read for ``jobs`` (doit takes its default
``num_process`` from ``DOIT_CONFIG`` before any task is made); the rest of the config
only names classes. The run (:class:`~metrale_orch.tasks.run.Run`) made then is the one
the tasks load into. The logic
lives in :mod:`metrale_orch.tasks`; this module only wires it to doit. Like the task
actions, it imports what only a run that generates or builds needs when that runs
(:func:`_generation`); where a deferred import may be is a rule that
``tests/test_layering.py`` checks.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Iterator
from pathlib import Path

from metrale_orch.graph.scope import selection_scope
from metrale_orch.tasks.doit_api import (
    current_run,
    guessed_selection,
    loader_present,
    loading_run,
)
from metrale_orch.tasks.earlystart import start_early_runs

# The probes' dry runs the last run asked for start before anything else loads: a run
# that selects some build sub-tasks, only those its targets asked for. With the package's
# task loader, doit tells what it was asked only after this import, so nothing starts
# here; a plain `doit` shows it in its frame (the task creators are read after this
# import: a guess).
if not loader_present():
    start_early_runs(current_run(), selection_scope(guessed_selection(), guess=True))

from metrale_orch.graph.cached import Generation, named_failures, start_order
from metrale_orch.graph.selection import explicit_targets
from metrale_orch.paths import BUILD_TASK, DB_NAME
from metrale_orch.tasks.actions import (
    check_action,
    coverage_action,
    default_target_threads,
    install_sigterm_handler,
)
from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec
from metrale_orch.tasks.creators import cached_tasks
from metrale_orch.tasks.database import BACKEND
from metrale_orch.tasks.dicts import TaskDict, task_dict
from metrale_orch.tasks.reporter import BuildReporter
from metrale_orch.tasks.run_end import end_interrupted
from metrale_orch.tasks.smoke import smoke_task_dicts

__all__ = ["DOIT_CONFIG", "task_build", "task_check", "task_coverage"]  # what `import *` takes

#: Allocations between two collections of the young objects once the tasks are made
#: (Python's default is 700; see task_build).
GC_YOUNG = 50_000

#: Not empty once this process froze what its first task generation loaded (task_build).
_FROZEN: list[bool] = []

DOIT_CONFIG: dict[str, object] = {
    "default_tasks": [BUILD_TASK],
    # doit's sqlite3, saved in one transaction; an unwritable database is one line.
    "backend": BACKEND,
    "dep_file": DB_NAME,
    "check_file_uptodate": ContentChecker,
    "codec_cls": TaskDataCodec,
    "reporter": BuildReporter,
    "verbosity": 0,
    # A failing target (tree or compile error) must not stop the others.
    "continue": True,
    "minversion": "0.37.0",
    # `doit list` shows every target (sub-task), so `doit list --status` answers
    # "which targets are up to date" without `--all`.
    "subtasks": True,
    # Targets run on threads, as many as compiles may run at once (`jobs`); each
    # target's module compiles go to the process's one executor, which runs at most
    # `jobs` of them at a time, so cores never idle while any target has work left.
    # `doit -n N -P process` still works: its workers share `jobs` machine slots.
    "par_type": "thread",
    "num_process": default_target_threads(current_run()),
}


def _generation() -> Generation:
    """The generation of the build graph (:mod:`metrale_orch.graph.generate`), imported on
    first need.

    Deferred for no-op start-up speed: generation imports the compile step's planning and
    the tree (~100 ms), which a run answered by the task cache never needs.
    """
    from metrale_orch.graph.generate import GENERATION

    return GENERATION


def task_build() -> Iterator[TaskDict]:
    """Build kernel targets: build:<hw>/<model>/<quant> (wildcards: 'build:hopper/*')."""
    install_sigterm_handler()
    run = loading_run()  # what doit was asked, from the package's loader or doit's frame
    root = run.root
    # Loading allocates much and frees little: no cyclic-GC passes until the tasks are
    # made (doit turns each yielded dict into a Task before asking for the next).
    enabled = gc.isenabled()
    gc.disable()
    try:
        words = run.selection.words if run.selection is not None else ()
        scope = selection_scope(run.selection)  # some build sub-tasks: only their targets
        config = run.loaded_config()  # None: broken, every target then fails saying why
        specs, smoke, _how = cached_tasks(
            root, run.environ, words, _generation, run.probes, scope, config
        )
        yield {"name": None, "doc": "build every target (skipping those without a toolchain)"}
        for spec in start_order(config, specs):  # longest first
            yield task_dict(spec, root)
        # A target named on the command line but not generated fails with the reason
        # (never doit's "Invalid parameter"); no smoke task depends on it.
        for spec in named_failures(root, specs, explicit_targets(words)):
            yield task_dict(spec, root)
        # HOOK(smoke): smoke:<hw> tasks (tasks.smoke.smoke_task_dicts), replayed from the
        # task cache on a hit (the same dicts: plain data and the same action functions).
        if smoke is None:
            smoke = smoke_task_dicts(root, run.environ, specs, config)
        yield from smoke
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while the tasks load: one line
        end_interrupted(exc, 0, sys.stderr)
    finally:
        if enabled:
            gc.enable()
    # The tasks (and this package) live until doit exits: moving them out of the
    # collector's sight keeps each later full collection from walking them all
    # again (a no-op run otherwise spends ~15 % of its time there). Once per process:
    # in one that goes on (the edit loop), each generation's tasks are garbage by the
    # next, and frozen their cycles were never collected (~700 objects a cycle of a small
    # tree, kept for good).
    if not _FROZEN:
        gc.freeze()
        _FROZEN.append(True)
    # A build keeps most of what it makes (plans, spans, trace events, the memo) until
    # it ends: collecting the young every 50,000 allocations instead of 700 (X2 simulated,
    # 256 workers at 1.1 s, alternating: 4.6-4.8 ms of client CPU per action against
    # 5.3-5.8; perf put a tenth of the client's CPU in the collector).
    gc.set_threshold(GC_YOUNG, 20, 100)
    # What the build made is freed with the process: frozen when the interpreter exits
    # (before its last collections, which would walk it all), the process ends 0.03-0.05 s
    # after doit returns instead of 0.42-0.55 s (X2 simulated, 256 workers at 1.1 s). Only
    # then: a process that goes on (the edit loop, tests) keeps collecting its garbage.
    atexit.unregister(gc.freeze)  # once, however many runs this process makes
    atexit.register(gc.freeze)


def task_check() -> TaskDict:
    """Will the build accept this tree? Every problem at once, by file (metrale-orch check)."""
    return {
        "actions": [(check_action, [str(Path.cwd())])],
        "uptodate": [False],
        "verbosity": 2,
    }


def task_coverage() -> TaskDict:
    """Build, then check the build exports every kernel the tree names (metrale-orch coverage)."""
    return {
        "actions": [(coverage_action, [str(Path.cwd())])],
        "task_dep": [BUILD_TASK],
        "uptodate": [False],
    }
