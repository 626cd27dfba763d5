"""Files under ``build/.state`` that another user planted decide nothing (issue 43, B10).

A compilation-database part names the compiler an editor runs (CLion, clangd
``--query-driver``): another user's part is never merged into
``build/compile_commands.json``. A job-slot file is opened without following a link
(a planted one made a root build create a file wherever it pointed) and used only when
it is the user's own regular file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from metrale_orch.executor.slots import MachineSlots
from metrale_orch.paths import STATE_DIR
from tests.support.core import NOBODY, as_root, plant
from tests.support.project import doit

EVIL = "/tmp/planted-compiler"


@as_root
def test_another_users_compdb_part_is_not_merged(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    assert doit(root, ["-n", "1", "build"], env).returncode == 0
    part = root / "build" / STATE_DIR / "compdb" / "gb10" / "qwen" / "w4.json"
    doc = json.loads(part.read_text())
    for command in doc["commands"]:
        command["arguments"][0] = EVIL
    part.unlink()
    plant(part, json.dumps(doc).encode(), 0o666, uid=NOBODY)
    # Another target builds again: the run merges every target's part, gb10/qwen/w4's (up
    # to date, so its part is not rewritten; first in order, so its commands are taken).
    assert doit(root, ["forget", "build:hopper/qwen/w4"], env).returncode == 0
    again = doit(root, ["-n", "1", "build"], env)
    assert again.returncode == 0, again.text
    database = (root / "build" / "compile_commands.json").read_text()
    assert EVIL not in database
    assert json.loads(database)  # the other targets' entries are there


def test_a_planted_link_in_place_of_a_slot_file_is_not_followed(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, env = fake_project
    jobs = root / "build" / STATE_DIR / "jobs"
    jobs.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for index in range(2):
        (jobs / f"slot-{index}").symlink_to(elsewhere / f"created-{index}")
    run = doit(root, ["-n", "2", "build"], env)
    assert run.returncode == 0, run.text
    assert list(elsewhere.iterdir()) == []  # nothing created where the links point


@as_root
def test_another_users_slot_file_is_not_used(tmp_path: Path) -> None:
    plant(tmp_path / "slot-0", b"", 0o666, uid=NOBODY)
    slots = MachineSlots(tmp_path, 1)
    assert slots._try(0) == (-1, -1)  # the in-process bound is all there is
    os.unlink(tmp_path / "slot-0")
    index, fd = slots._try(0) or (None, None)
    assert index == 0 and fd is not None
    os.close(fd)
