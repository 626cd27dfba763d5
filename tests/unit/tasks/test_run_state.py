"""What a run was told lives on the run: a process that loads doit's tasks again gets a new
run, told by the package's loader before it loads, and nothing of the last one's."""

from __future__ import annotations

from pathlib import Path

from metrale_orch.tasks.doit_api import (
    current_run,
    loader_present,
    loading_run,
    new_run,
    tell_loader_present,
    tell_selection,
)


def test_a_second_load_is_told_to_a_new_run(tmp_path: Path) -> None:
    first = new_run(tmp_path, {})
    tell_loader_present()
    told = tell_selection("run", ["build:a/b/c"], {})
    assert loading_run() is first and first.selection == told
    # doit loads again in this process: the loader's setup and load_tasks come first.
    tell_loader_present()
    again = tell_selection("run", ["build"], {})
    second = current_run()
    assert second is not first
    assert not second.loading  # so the loader starts this run's early probes
    assert (second.selection, second.loader) == (again, True)
    assert loading_run() is second  # the dodo file's task_build gets the same run
    assert first.selection == told  # the first run's own, untouched


def test_a_plain_load_after_a_loader_load_guesses_for_itself(tmp_path: Path) -> None:
    new_run(tmp_path, {})
    tell_loader_present()
    tell_selection("run", ["build:a/b/c"], {})
    loading_run()
    plain = loading_run()  # another load, without the loader (doit's API, no frame here)
    assert not plain.loader and plain.selection is None
    assert not loader_present()
