"""``metrale-orch doit ARGS``: doit as ``doit ARGS`` runs it, except that a configuration
file doit cannot read is one line naming it, never doit's traceback.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/tasks/test_launch.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.project import DoitRun, started_targets

#: A string left open: tomllib reports line 3, column 14.
BROKEN = '[tool.metrale-orch]\njobs = 2\ncache = "oops\n'


def orch_doit(root: Path, args: list[str], env: Mapping[str, str]) -> DoitRun:
    """``python -m metrale_orch doit ARGS`` in ``root``."""
    proc = subprocess.run(
        [sys.executable, "-m", "metrale_orch", "doit", *args],
        cwd=root,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    return DoitRun(proc.returncode, proc.stdout, proc.stderr)


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the project but the kernels (the database, the build's outputs)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith("kernels/")
    }


@pytest.mark.parametrize("command", [["build"], ["list", "--status"], ["-n", "2", "build"]])
def test_a_malformed_pyproject_is_one_line_and_loses_nothing(
    fake_project: tuple[Path, dict[str, str]], command: list[str]
) -> None:
    root, env = fake_project
    (root / "pyproject.toml").write_text("[tool.metrale-orch]\njobs = 2\n")
    first = orch_doit(root, ["build"], env)
    assert first.returncode == 0, first.text
    assert started_targets(first) == [
        "gb10/qwen/w4",
        "gb10/qwen/w8",
        "hopper/qwen/w4",
        "hopper/qwen/w8",
    ]
    (root / "pyproject.toml").write_text(BROKEN)
    before = _snapshot(root)
    run = orch_doit(root, command, env)
    assert run.returncode == 2, run.text
    assert "Traceback" not in run.text
    assert run.out == ""
    assert run.err.splitlines() == [
        "error: pyproject.toml: (file): cannot be read: Illegal character '\\n' "
        "(at line 3, column 14)"
    ]
    assert _snapshot(root) == before  # no database write, no output touched, file as it was


def test_otherwise_it_is_doit(fake_project: tuple[Path, dict[str, str]]) -> None:
    """Same tasks, options and exit status as ``doit``; doit's messages name the command."""
    root, env = fake_project
    run = orch_doit(root, ["-n", "2", "build:hopper/*"], env)
    assert run.returncode == 0, run.text
    assert started_targets(run) == ["hopper/qwen/w4", "hopper/qwen/w8"]
    listed = orch_doit(root, ["list", "--status"], env)
    assert listed.returncode == 0, listed.text
    assert "U build:hopper/qwen/w4" in listed.out and "R build:gb10/qwen/w4" in listed.out
    wrong = orch_doit(root, ["nosuch"], env)
    assert wrong.returncode == 3, wrong.text  # doit's status for a task it does not know
    assert 'Type "metrale-orch doit list" to see available tasks.' in wrong.err
