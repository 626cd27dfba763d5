"""The frame walk is only the adapter's guarded fallback: a plain ``doit`` (no package
loader) whose frames are not doit 0.37's gets a correct run, unscoped.

Without the loader lines in ``pyproject.toml``, what doit was asked is read off
``DoitCmdBase.execute``'s frame (:func:`~metrale_orch.tasks.doit_api.loading_run`). A doit
that runs its commands through another frame tells nothing that way: the run then knows
no selection, so it generates the whole tree (no scoped task-cache entry), skips a named
target whose toolchain is missing as a broad selection would, and builds exactly what doit
selected, recorded so that the next run builds only the rest.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.project import DoitRun, doit, python_code, started_targets

#: doit, with its commands run through a frame of another shape than 0.37's (as a doit
#: release that moved the method, or a wrapper around it, would).
OTHER_FRAMES_DOIT = """
import sys
from doit.cmd_base import DoitCmdBase
from doit.doit_cmd import DoitMain

_execute = DoitCmdBase.execute


def execute(self, params, positional):
    return _execute(self, params, positional)


DoitCmdBase.execute = execute
sys.exit(DoitMain().run(sys.argv[1:]))
"""


def _other_doit(root: Path, args: list[str], env: dict[str, str]) -> DoitRun:
    return python_code(root, OTHER_FRAMES_DOIT, args, env)


def test_a_doit_whose_frames_differ_gets_a_correct_unscoped_run(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    run = _other_doit(root, ["build:hopper/qwen/w4"], env)
    assert run.returncode == 0, run.text
    assert started_targets(run) == ["hopper/qwen/w4"]
    assert "Traceback" not in run.text
    state = root / "build" / ".state"
    assert list(state.glob("build-tasks.scope-*.cache")) == []  # the whole tree's entry
    assert list(state.glob("build-tasks.*.cache")) != []
    # A named target without its toolchain: skipped, as a broad selection is (the run
    # cannot tell it was named), never a traceback.
    apple = _other_doit(root, ["build:apple/llama/f16"], env)
    assert apple.returncode == 0, apple.text
    assert "skipped 1 target(s): toolchain 'metal' is not installed" in apple.out
    # What it built is recorded: plain doit (frames as 0.37's) builds only the rest.
    rest = doit(root, ["build"], env)
    assert rest.returncode == 0, rest.text
    assert started_targets(rest) == ["gb10/qwen/w4", "gb10/qwen/w8", "hopper/qwen/w8"]
    named = doit(root, ["build:apple/llama/f16"], env)  # the frame read: named, so it fails
    assert named.returncode == 1, named.text
