"""``metrale-orch doit ARGS``: doit as ``doit ARGS`` runs it, except that a configuration
file doit cannot read is one line naming it, never doit's traceback.

doit parses ``pyproject.toml`` before anything of the package runs
(:mod:`metrale_orch.tasks.launch`), so these run the documented entry point, for real, in
a temporary project with the recording fake compiler.

The tests of this topic that start processes are in
``tests/scenarios/tasks/test_launch.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.config import ConfigError
from metrale_orch.tasks.launch import read_doit_config


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (
            "pyproject.toml",
            "[tool.doit.plugins]\nbogus = 1\n",
            "pyproject.toml: [tool.doit]: doit cannot read it (AssertionError)",
        ),
        (
            "pyproject.toml",
            "tool = 1\n",
            "pyproject.toml: [tool.doit]: doit cannot read it "
            "(AttributeError: 'int' object has no attribute 'get')",
        ),
        (
            "doit.cfg",
            "garbage\n",
            "doit.cfg: (file): doit cannot read it (MissingSectionHeaderError: File contains "
            "no section headers. file: 'doit.cfg', line: 1 'garbage\\n')",
        ),
    ],
)
def test_what_doits_reader_refuses_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_doit_config()
    assert str(caught.value) == expected


def test_no_files_and_good_files_are_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    read_doit_config()
    (tmp_path / "pyproject.toml").write_text("[tool.doit]\nverbosity = 2\n[tool.metrale-orch]\n")
    (tmp_path / "doit.cfg").write_text("[GLOBAL]\nverbosity = 2\n")
    read_doit_config()


def test_the_process_gets_its_streams_back_after_doit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doit's thread runner can leave a task's capture as ``sys.stdout`` (two targets
    finishing at once restore each other's); a process that goes on must print again."""
    import io
    import sys

    from metrale_orch.tasks import launch

    def leaves_a_capture(self: object, args: list[str]) -> int:
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        return 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launch._Main, "run", leaves_a_capture)
    before = sys.stdout, sys.stderr
    assert launch.run_doit(["build"]) == 0
    assert (sys.stdout, sys.stderr) == before
