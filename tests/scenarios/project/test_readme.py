"""README's examples run as written, in order, in a new shell (issue 43).

The newcomer has run the README's first line (a venv in ``.venv`` with the package) and
opens a shell: no venv on ``PATH``. Every ``$ `` line the README shows after its first two
commands runs, in order, in one ``bash`` on a copy of the project (with ``.venv`` the venv
running this test, and a sibling copy as ``../other-checkout``), with real nvcc: each exits
as documented. Only the README's own ``source .venv/bin/activate`` puts the tools on
``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

VENV = Path(sys.prefix)

#: What a project needs to build: the rest of the checkout plays no part.
PROJECT = ("kernels", "toolchains", "dodo.py", "pyproject.toml", "kernels.lock")

#: The examples documented to exit non-zero, and their status.
NONZERO = {"metrale-orch status --exit-code": 1}

#: Marks each example's end in the shell's output: ``<marker> <status>``.
MARK = "::readme-example-exit::"


def readme_examples() -> list[str]:
    """The ``$ `` lines of README's ``text``/``sh``/``console`` blocks, in order, after the
    first block (the two first commands: the install, which the test stands in for)."""
    examples: list[str] = []
    blocks = 0
    inside = False
    for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines():
        if not inside and re.fullmatch(r"```(text|sh|console)\s*", line):
            inside, blocks = True, blocks + 1
        elif inside and line.startswith("```"):
            inside = False
        elif inside and blocks > 1 and line.startswith("$ "):
            examples.append(line[2:])
    return examples


def _expected(example: str) -> int:
    command = re.sub(r"\s{2,}#.*$", "", example).strip()
    return NONZERO.get(command, 0)


def _copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in PROJECT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(VENV, target_is_directory=True)
    return dest


def _new_shell_env(tmp: Path) -> dict[str, str]:
    """A newcomer's environment: no venv on PATH, a private cache, nothing of ours set."""
    path = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "activate").is_file() and Path(d) != VENV / "bin"
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("METRALE_", "VIRTUAL_ENV", "PYTHON", "NVCC_", "FAKECC_"))
    }
    env.update(PATH=os.pathsep.join(path), HOME=str(tmp / "home"))
    env["METRALE_ORCH_LOCAL_CACHE"] = str(tmp / "local-cache")
    return env


def _script(examples: list[str]) -> str:
    lines = ['command -v doit metrale-orch; echo "' + MARK + ' $?"']
    for example in examples:
        lines += [example, f'echo "{MARK} $?"']
    return "\n".join(lines) + "\n"


def test_the_readme_shows_the_activate_line_before_any_bare_command() -> None:
    examples = readme_examples()
    assert (
        examples[0]
        == "source .venv/bin/activate   # the first line's venv: the commands below run in it"
    )
    assert any(e.startswith("doit ") for e in examples)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.skipif(
    not (VENV / "bin" / "activate").is_file(), reason="the tests do not run in a venv"
)
def test_readme_examples_run_as_written_in_a_new_shell(tmp_path: Path) -> None:
    project = _copy_project(tmp_path / "checkout")
    _copy_project(tmp_path / "other-checkout")
    examples = readme_examples()
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", _script(examples)],
        cwd=project,
        env=_new_shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    statuses = [int(s) for s in re.findall(rf"^{re.escape(MARK)} (\d+)$", done.stdout, re.M)]
    log = done.stdout + done.stderr
    assert statuses[0] != 0, f"doit or metrale-orch on PATH before the activate line:\n{log}"
    assert len(statuses) == len(examples) + 1, log
    wrong = [
        f"{example!r}: exit {got}, documented {_expected(example)}"
        for example, got in zip(examples, statuses[1:], strict=True)
        if got != _expected(example)
    ]
    assert not wrong, "\n".join(wrong) + "\n" + log
