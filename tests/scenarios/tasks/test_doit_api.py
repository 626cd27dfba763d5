"""The doit private API ``metrale_orch.tasks.doit_api`` relies on is still there.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/tasks/test_doit_api.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from metrale_orch.tasks import doit_api
from tests.support.tasks import LOADER_PYPROJECT

_SELECTION_DODO = """\
import json
from metrale_orch.tasks.doit_api import guessed_selection, loading_run


def seen(selection):
    return None if selection is None else [selection.command, list(selection.words)]


SEEN = [seen(guessed_selection())]  # while doit imports the dodo file


def task_build():
    SEEN.append(seen(loading_run().selection))  # while doit calls the task creators
    with open("seen.json", "w") as fh:
        json.dump(SEEN, fh)
    for name in ("a", "b", "c/d"):
        yield {"name": name, "actions": None}


def task_other():
    return {"actions": None}
"""


@pytest.mark.parametrize("door", ["frame", "loader"])
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["build:a"], ["run", ["build:a"]]),
        (
            ["run", "-n", "2", "-P", "thread", "build:a", "build:c/*"],
            ["run", ["build:a", "build:c/*"]],
        ),
        ([], ["run", []]),
        (["build", "other"], ["run", ["build", "other"]]),
        (["list", "build:a"], ["list", ["build:a"]]),
        (["clean", "build:a"], ["clean", ["build:a"]]),
        (["forget", "build:a"], ["forget", ["build:a"]]),
    ],
)
def test_the_selection_is_what_doit_parsed(
    tmp_path: Path, door: str, args: list[str], expected: list[object]
) -> None:
    """What the command was asked (its name; its words, options removed, wildcards
    unexpanded) reaches the run: through the package's task loader, doit's documented
    door (nothing is guessed while the dodo file is imported then), or for a plain
    ``doit`` without it, off DoitCmdBase.execute's frame."""
    (tmp_path / "dodo.py").write_text(_SELECTION_DODO)
    if door == "loader":
        (tmp_path / "pyproject.toml").write_text(LOADER_PYPROJECT)
    done = subprocess.run(
        [sys.executable, "-m", "doit", *args], cwd=tmp_path, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == [None if door == "loader" else expected, expected]
    assert doit_api.guessed_selection() is None  # no doit command on this stack
