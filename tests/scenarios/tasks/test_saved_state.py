"""The saved state is what was built, outputs are checked, one build per project.

These are the tests of this topic that start processes; the others are in
``tests/unit/tasks/test_saved_state.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from metrale_orch.tasks.runlock import BuildLock


def test_build_lock_second_holder_waits_and_names_the_first(tmp_path: Path) -> None:
    build = tmp_path / "build"
    first = BuildLock(build)
    said: list[str] = []
    first.acquire(said.append)
    assert first.held and said == []
    holder = (build / ".lock.holder").read_text()
    assert f"pid {os.getpid()}" in holder
    code = (
        "import sys; from pathlib import Path; from metrale_orch.tasks.runlock import BuildLock\n"
        f"lock = BuildLock(Path({str(build)!r}))\n"
        "lock.acquire(lambda line: print(line, flush=True))\n"
        "print('acquired', flush=True)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "waiting for the build lock" in line and f"pid {os.getpid()}" in line
        first.release()
        assert proc.stdout.readline().strip() == "acquired"
        assert proc.wait(timeout=30) == 0
    first.release()  # idempotent


_RESULT_DEP_DODO = """
from pathlib import Path
from doit.tools import result_dep

from metrale_orch.tasks.checker import TaskDataCodec
from metrale_orch.tasks.database import BACKEND

DOIT_CONFIG = {"backend": BACKEND, "dep_file": ".doit.db", "codec_cls": TaskDataCodec,
               "verbosity": 0}


def produce():
    return {"value": Path("value.txt").read_text().strip()}


def consume():
    with open("consumed.log", "a") as fh:
        fh.write("ran\\n")


def task_produce():
    return {"actions": [produce], "file_dep": ["value.txt"]}


def task_consume():
    return {"actions": [consume], "uptodate": [result_dep("produce")]}
"""


def test_result_dep_on_a_dict_result_runs_again_exactly_when_the_result_changes(
    tmp_path: Path,
) -> None:
    """doit's ``result_dep`` compares a task's result with the one the dependent task
    saved: with the digest kept, the dependent task runs again when, and only when,
    that result changes, whether the task it depends on ran (its result from this run)
    or was up to date (its result as saved)."""
    (tmp_path / "dodo.py").write_text(_RESULT_DEP_DODO)
    log = tmp_path / "consumed.log"

    def run(value: str) -> int:
        if not (tmp_path / "value.txt").exists() or (tmp_path / "value.txt").read_text() != value:
            (tmp_path / "value.txt").write_text(value)
        proc = subprocess.run(
            [sys.executable, "-m", "doit"], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return len(log.read_text().splitlines()) if log.exists() else 0

    assert run("one") == 1  # never ran
    assert run("one") == 1  # produce up to date: its saved result, unchanged
    assert run("two") == 2  # produce ran: another result
    assert run("two\n") == 2  # produce ran: the same result
    assert run("two\n") == 2
    assert run("one") == 3
