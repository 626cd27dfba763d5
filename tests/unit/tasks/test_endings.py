"""How runs end: interrupts, exit statuses, broken names and files, as a user meets them.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/tasks/test_endings.py``.
"""

from __future__ import annotations

import io
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from metrale_orch import dodo
from metrale_orch.cli import main
from metrale_orch.errors import Interrupted, interrupt_exit_code, printable
from metrale_orch.tasks.outcomes import BuildFailed
from metrale_orch.tasks.report_lines import format_interrupted, format_summary
from metrale_orch.tasks.run_end import exit_status
from metrale_orch.tasks.values import BuildValues
from tests.support.tasks import BAD_NAME


def test_interrupt_while_tasks_load_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:

    def stopped(*args: object) -> None:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(dodo, "cached_tasks", stopped)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    sigint = signal.getsignal(signal.SIGINT)  # the ending ignores a second Ctrl-C
    try:
        with pytest.raises(SystemExit) as info:
            list(dodo.task_build())
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert info.value.code == 143
    assert err.getvalue() == "interrupted; 0 targets finished and kept\n"


class _InterruptingEnviron(Mapping[str, str]):
    """An environment whose every read raises ``raised``: the command it is given is
    interrupted while it works (``check`` reads its environment first thing)."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def __getitem__(self, key: str) -> str:
        raise self.raised

    def __iter__(self) -> Iterator[str]:
        raise self.raised

    def __len__(self) -> int:
        raise self.raised


@pytest.mark.parametrize(
    ("raised", "status"),
    [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM), 143)],
)
def test_cli_commands_end_interrupted_with_one_line(
    tmp_path: Path, raised: BaseException, status: int
) -> None:
    (tmp_path / "kernels").mkdir()
    out, err = io.StringIO(), io.StringIO()
    environ = _InterruptingEnviron(raised)
    code = main(["--root", str(tmp_path), "check"], environ=environ, out=out, err=err)
    assert (code, out.getvalue(), err.getvalue()) == (status, "", "interrupted\n")


def test_interrupted_names_its_signal() -> None:
    assert interrupt_exit_code(KeyboardInterrupt()) == 130
    assert interrupt_exit_code(Interrupted(signal.SIGTERM)) == 143
    # doit's process pool re-raises a worker's interrupt from its text.
    assert Interrupted(str(Interrupted(signal.SIGTERM))).signum == signal.SIGTERM
    assert format_interrupted(1) == "interrupted; 1 target finished and kept"


def test_exit_status_rules() -> None:
    from doit.exceptions import TaskError, TaskFailed, UnmetDependency

    assert exit_status([]) is None
    assert exit_status([("build", TaskFailed("x")), ("other", UnmetDependency("b"))]) == 1
    assert exit_status([("error", TaskFailed("tree")), ("build", TaskFailed("x"))]) == 2
    assert exit_status([("build", TaskError("doit"))]) == 2
    assert exit_status([("build", BuildFailed("x", BuildValues(exit_code=2)))]) == 2


def test_the_summary_counts_ignored_targets_only_when_there_are_some() -> None:
    common = "build: 1 built, 0 from cache, 0 up to date, 0 skipped, 0 failed"
    assert format_summary({"built": 1}, 0.04) == f"{common} in 0.0 s"
    assert format_summary({"built": 1, "ignored": 2}, 0.04) == f"{common}, 2 ignored in 0.0 s"


def test_printable_shows_the_bytes() -> None:
    assert printable(f"kernels/{BAD_NAME}") == "kernels/k\\xff.cu"
    assert printable("kernels/é.cu") == "kernels/é.cu"


def test_defaults_of_a_hardware_whose_manifest_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "kernels/h/HARDWARE.toml").mkdir(parents=True)
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(tmp_path), "defaults", "h"], environ={}, out=out, err=err)
    assert (code, out.getvalue()) == (2, "")
    assert err.getvalue() == (
        "error: kernels/h/HARDWARE.toml: is a directory, not a TOML file: make it a file "
        "(or remove it)\n"
    )
