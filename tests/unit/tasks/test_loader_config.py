"""The package's task loader works doit's default of target threads out for each run: a
process that runs doit again (a watch loop, ``metrale-orch doit`` in-process) imports the
dodo module once, and must not keep its first run's ``jobs``."""

from __future__ import annotations

from pathlib import Path

from metrale_orch.tasks.checker import ContentChecker
from metrale_orch.tasks.doit_api import new_run
from metrale_orch.tasks.loader import Loader


def _loader(config: dict[str, object]) -> Loader:
    loader = Loader()
    loader.namespace = {"DOIT_CONFIG": config}
    return loader


def test_each_run_gets_the_threads_of_its_own_configuration(tmp_path: Path) -> None:
    package = {"check_file_uptodate": ContentChecker, "num_process": 1, "verbosity": 0}
    (tmp_path / "pyproject.toml").write_text("[tool.metrale-orch]\njobs = 3\n")
    new_run(tmp_path, {})
    assert _loader(package).load_doit_config() == {**package, "num_process": 3}
    (tmp_path / "pyproject.toml").write_text("[tool.metrale-orch]\njobs = 5\n")
    new_run(tmp_path, {})  # the next run of the same process
    assert _loader(package).load_doit_config()["num_process"] == 5
    assert package["num_process"] == 1  # the dodo module's own dict is left alone


def test_a_project_config_of_its_own_is_doits() -> None:
    own = {"num_process": 4, "default_tasks": ["x"]}
    assert _loader(own).load_doit_config() == own
