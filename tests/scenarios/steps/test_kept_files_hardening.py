"""The kept times files decide no byte (issue 43, B2, B5, B6): a poisoned one is ignored.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/steps/test_kept_files_hardening.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metrale_orch.steps.times import TARGET_TIMES, TIMES, read_target_seconds
from tests.support.project import doit, started_targets
from tests.support.steps import POISON, STATE


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (TARGET_TIMES, POISON["deep"]),
        (TIMES, '{"schema": 1, "modules": ' + "{" * 100_000 + "}" * 100_000 + "}"),
        (TIMES, '{"schema": 1, "modules": {"gb10/qwen/w4": {"a": ["k", NaN]}}}'),
        (TARGET_TIMES, "fifo"),
        (TIMES, "fifo"),
    ],
)
def test_doit_build_with_a_poisoned_times_file_builds_and_warns_once(
    fake_project: tuple[Path, dict[str, str]], name: str, text: str
) -> None:
    root, env = fake_project
    path = root / STATE / name
    path.parent.mkdir(parents=True)
    if text == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(text)
    run = doit(root, ["-n", "2", "build"], env, timeout=120)
    assert run.returncode == 0, run.text
    assert "Traceback" not in run.text and "RecursionError" not in run.text
    assert len(started_targets(run)) == 4
    warnings = [line for line in run.text.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: {path}: {warnings[0].split(': ', 2)[2]}"], run.text
    # The build rewrote the file as times: the next build reads it and warns no more.
    assert path.is_file() and read_target_seconds(root / STATE)
    run = doit(root, ["forget", "build"], env)
    again = doit(root, ["-n", "2", "build"], env, timeout=120)
    assert again.returncode == 0 and "warning: " not in again.text, again.text
