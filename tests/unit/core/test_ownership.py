"""Files that decide what is served are trusted only if they are the user's own (issue 35).

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/core/test_ownership.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from metrale_orch.fsutil import read_json_object, write_own
from metrale_orch.ownership import not_own, read_own
from tests.support.core import NOBODY, as_root, give_away, mine, plant

# ------------------------------------------------------------------------------ the check


@as_root
def test_the_check_is_ssh_strict_modes(tmp_path: Path) -> None:
    own = plant(tmp_path / "own", b"{}", 0o600, uid=os.getuid())
    assert not_own(own.stat()) == "" and not_own(own.stat(), secret=True) == ""
    own.chmod(0o644)
    assert not_own(own.stat()) == ""
    assert not_own(own.stat(), secret=True) == "readable by group or others"
    own.chmod(0o620)
    assert not_own(own.stat()) == "writable by group or others"
    other = plant(tmp_path / "other", b"{}", 0o600)
    assert not_own(other.stat()).startswith(f"owned by uid {NOBODY}")
    assert not_own(tmp_path.stat(), directory=True) == ""
    os.mkfifo(tmp_path / "fifo", 0o600)
    with pytest.raises(OSError):  # not waited on
        read_own(tmp_path / "fifo")
    with pytest.raises(PermissionError, match="owned by uid"):
        read_own(other)


@as_root
def test_a_memo_is_rebuilt_as_the_users_own(tmp_path: Path) -> None:
    memo = plant(tmp_path / "d" / "memo.json", b'{"planted": 1}')
    assert read_json_object(memo) == {}
    write_own(memo, b'{"mine": 1}')  # replaced: the directory is the user's
    assert mine(memo) and read_json_object(memo) == {"mine": 1}
    # a directory another user owns is not written into
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, NOBODY, -1)
    with pytest.raises(PermissionError):
        write_own(theirs / "memo.json", b"{}")
    assert not (theirs / "memo.json").exists()
    # a missing directory is made the user's own, private
    write_own(tmp_path / "new" / "memo.json", b"{}")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700


@as_root
def test_a_task_cache_file_of_another_user_is_a_miss(tmp_path: Path) -> None:
    from metrale_orch.graph import taskcache

    path = tmp_path / "build-tasks.0123456789abcdef.cache"
    taskcache.store(path, "k" * 32, taskcache.Scan(started_ns=0, watches=()), [])
    assert mine(path)
    assert taskcache.lookup(path, "k" * 32).specs == ()
    give_away(path)
    got = taskcache.lookup(path, "k" * 32)
    assert got.specs is None and "not this user's own" in got.reason


@as_root
def test_the_kept_ptxas_answers_of_another_user_are_not_taken(tmp_path: Path) -> None:
    """The register report's and the coverage check's kept ptxas answers
    (``.state/resources.json``, ``coverage.json``): another user's file is an empty memo, and
    the next save writes this user's own."""
    from metrale_orch.resources.answers import Answers

    path = tmp_path / "state" / "coverage.json"
    memo = Answers.load(path, 1, "the coverage cache")
    memo.put("k", "")
    memo.save(prune=False)
    assert mine(path) and Answers.load(path, 1, "x").entries == {"k": ""}
    give_away(path)
    assert Answers.load(path, 1, "x").entries == {}
    again = Answers.load(path, 1, "x")
    again.put("k", "planted answers are gone")
    again.save(prune=False)
    assert mine(path) and Answers.load(path, 1, "x").entries == {"k": "planted answers are gone"}
