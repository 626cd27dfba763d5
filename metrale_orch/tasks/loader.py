"""The package's doit task loader: doit's documented door (``TaskLoader2``).

doit's default loader imports ``dodo.py`` and calls its task creators, but tells them
nothing of what the command was asked. This one is the same loader, and hands the
command and its words (``load_tasks(cmd, pos_args)``) to the run before the creators are
called, so that a run naming build targets generates, caches and probes those targets
alone, and a target named in full whose toolchain is missing fails instead of being
skipped; and it starts the probes' head start then
(:mod:`~metrale_orch.toolchain.earlyruns`), which plain ``doit`` starts while the dodo
file is imported, on a guess. ``metrale-orch doit`` always uses it; plain ``doit`` uses
it when the project's ``pyproject.toml`` names it::

    [tool.doit]
    loader = "metrale"

    [tool.doit.plugins.loader]
    metrale = "metrale_orch.tasks.loader:Loader"
"""

from __future__ import annotations

from typing import Any

from doit.cmd_base import DodoTaskLoader

from metrale_orch.graph.scope import selection_scope
from metrale_orch.tasks.actions import default_target_threads
from metrale_orch.tasks.checker import ContentChecker
from metrale_orch.tasks.doit_api import current_run, tell_loader_present, tell_selection
from metrale_orch.tasks.earlystart import start_early_runs

__all__ = ["Loader"]


class Loader(DodoTaskLoader):  # type: ignore[misc]
    """doit's dodo-file loader that tells the run what the command was asked."""

    def setup(self, opt_values: dict[str, Any]) -> None:
        tell_loader_present()  # before the dodo file is imported: nothing is guessed then
        super().setup(opt_values)

    def load_doit_config(self) -> dict[str, Any]:
        """The dodo file's ``DOIT_CONFIG``; the package's (it names the package's file
        checker) with its default of target threads worked out for this run: Python
        imports the dodo module once per process, so a process that runs doit again
        (``jobs`` changed meanwhile) would otherwise keep its first run's."""
        config = dict(super().load_doit_config())
        if config.get("check_file_uptodate") is ContentChecker:
            config["num_process"] = default_target_threads(current_run())
        return config

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
        command = getattr(cmd, "name", "") or type(cmd).__name__.lower()
        selection = tell_selection(str(command), list(pos_args), self.namespace)
        # The probes' head start: the dry runs the last run of this kind asked for run
        # while the task creators read the task cache's entry.
        run = current_run()
        if not run.loading:
            start_early_runs(run, selection_scope(selection))
        return list(super().load_tasks(cmd, pos_args))
