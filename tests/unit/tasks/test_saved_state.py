"""The saved state is what was built, outputs are checked, one build per project.

The tests of this topic that start processes are in
``tests/scenarios/tasks/test_saved_state.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from metrale_orch import fsutil
from metrale_orch.fsutil import file_digest, file_hash
from metrale_orch.tasks.checker import (
    ContentChecker,
    TaskDataCodec,
    check_external,
    check_outputs,
    encode_outputs,
    result_digest,
    stale_outputs,
)
from metrale_orch.tasks.database import Database


def test_state_saved_is_the_content_built(tmp_path: Path) -> None:
    src = tmp_path / "k.cu"
    src.write_text("v1")
    built = file_digest(str(src))
    checker = ContentChecker()
    checker.expect({str(src): built})
    state = checker.get_state(str(src), None)
    assert state is not None and state[2] == built
    assert not checker.check_modified(str(src), os.stat(src), state)
    # Edited while the build ran: the saved state can never pass as up to date.
    src.write_text("v2")
    state = checker.get_state(str(src), None)
    assert state is not None and state[2] == built
    assert checker.check_modified(str(src), os.stat(src), state)
    # Even reverted to what was built it rebuilds once: which bytes the build read
    # while the file was changing cannot be known.
    src.write_text("v1")
    assert ContentChecker().check_modified(str(src), os.stat(src), state)
    # A file reported as changed during the build ("") is stale whatever it holds.
    checker.expect({str(src): ""})
    state = checker.get_state(str(src), None)
    assert state is not None and ContentChecker().check_modified(str(src), os.stat(src), state)
    # No expectation: the current content, as before.
    checker.expect({})
    state = checker.get_state(str(src), None)
    assert state is not None and state[2] == built


def test_stale_outputs_missing_altered_and_touched(tmp_path: Path) -> None:
    other = tmp_path / "b.ptx"
    other.write_text("ptx b")
    out = tmp_path / "a.ptx"
    out.write_text("ptx v1")
    st, ost = out.stat(), other.stat()
    record = encode_outputs(
        {
            str(out): [st.st_mtime_ns, st.st_size, file_digest(str(out))],
            str(other): [ost.st_mtime_ns, ost.st_size, file_digest(str(other))],
        }
    )
    assert record[1] == str(tmp_path) + "/" and record[2] == "a.ptx\0b.ptx"
    assert stale_outputs(record) == []
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 10))  # touched, same bytes
    assert stale_outputs(record) == []
    out.write_text("ptx v2")  # same size, other bytes
    assert stale_outputs(record) == [str(out)]
    out.unlink()
    assert stale_outputs(record) == [str(out)]
    assert stale_outputs(None) and stale_outputs(encode_outputs({})) == []


def test_task_data_codec_round_trips_and_reads_json() -> None:

    codec = TaskDataCodec()
    record = {
        "kernels/a.cu": [1764556800123456789, 12, "0123456789abcdef"],
        "_values_:": {"signature": {"p": "1"}, "outputs": ["f", "d/", "a\0b", "1 2 x\0 3 4 y"]},
        "deps:": ("kernels/a.cu",),
        "checker:": "ContentChecker",
    }
    text = codec.encode(record)
    assert isinstance(text, str)
    assert codec.decode(text.encode("utf-8").decode("utf-8")) == record
    assert codec.decode('{"x": [1, 2]}') == {"x": [1, 2]}  # a database doit wrote with JSON
    assert codec.decode("\x00m4:garbage") == {}  # unreadable: the task simply runs again


def test_the_codec_keeps_any_list_or_dict_doit_hands_it() -> None:
    """doit's sqlite backend registers the codec as the adapter of every list and dict:
    both round-trip; only a build's profile spans are left out of a record."""
    codec = TaskDataCodec()
    assert codec.decode(codec.encode([1, ("a", 2), "x"])) == [1, ("a", 2), "x"]
    record = {"_values_:": {"profile": [1], "outcome": "built"}, "result:": {"profile": [2]}}
    assert codec.decode(codec.encode(record)) == {
        "_values_:": {"outcome": "built"},
        "result:": {},
    }


def test_a_dict_result_is_kept_as_a_digest_that_changes_with_it(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db"), TaskDataCodec())
    result = {"outcome": "built", "outputs": [["a.ptx", 1, 2]], "n": 1.5}
    db.set("t", "result:", result)
    db.set("t", "_values_:", result)
    db.set("u", "result:", "d41d8cd98f00b204e9800998ecf8427e")  # doit's md5 of another result
    assert db.get("t", "result:") == result_digest(result)  # in memory as on disk
    db.dump()
    again = Database(str(tmp_path / "db"), TaskDataCodec())
    assert again.get("t", "_values_:") == result  # the values are kept whole
    assert again.get("t", "result:") == result_digest(result)
    assert again.get("u", "result:") == "d41d8cd98f00b204e9800998ecf8427e"
    assert result_digest(result) == result_digest(dict(reversed(result.items())))
    assert result_digest({**result, "n": 2.5}) != result_digest(result)
    assert result_digest({**result, "outputs": [["a.ptx", 1, 3]]}) != result_digest(result)
    assert result_digest({**result, "profile": [1]}) == result_digest(result)


# ------------------------------------------------------------------------------ stat trust


def _same_stat_other_bytes(path: Path, data: bytes) -> os.stat_result:
    """Write ``data`` (same size) into ``path`` and return the stat from before: what a
    coarse-timestamp file system shows for an edit within the same clock tick."""
    before = os.stat(path)
    assert len(data) == before.st_size
    path.write_bytes(data)
    return before


def test_a_state_recorded_within_the_racy_window_is_compared_by_content(tmp_path: Path) -> None:
    src = tmp_path / "k.cuh"
    src.write_bytes(b"#define SCALE 2.0f\n")
    checker = ContentChecker()
    state = checker.get_state(str(src), None)
    assert state is not None and len(state) == 5
    assert state[3] == 0, "a change time younger than the racy window must not be trusted"
    # The same tick's edit: every stat field as recorded, other bytes. Seen.
    stale = _same_stat_other_bytes(src, b"#define SCALE 3.0f\n")
    assert ContentChecker().check_modified(str(src), stale, state)


def test_a_settled_state_is_trusted_by_stat_and_anything_else_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsutil, "RACY_NS", 0)  # every change time counts as settled
    src = tmp_path / "k.cuh"
    src.write_bytes(b"#define SCALE 2.0f\n")
    checker = ContentChecker()
    state = checker.get_state(str(src), None)
    assert state is not None and state[3] == os.stat(src).st_ctime_ns != 0
    assert not checker.check_modified(str(src), os.stat(src), state)
    assert checker.hashed == 1, "the no-op path must not read a settled file"
    # mtime set back after a same-size edit: the change time moved, the bytes decide.
    before = os.stat(src)
    src.write_bytes(b"#define SCALE 3.0f\n")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ContentChecker().check_modified(str(src), os.stat(src), state)
    # Replaced by a file of the same bytes (new inode): hashed, unchanged, refreshed.
    src.write_bytes(b"#define SCALE 2.0f\n")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not ContentChecker().check_modified(str(src), os.stat(src), state)
    # An older three-field state is never trusted by its stat alone.
    old = [before.st_mtime_ns, before.st_size, state[2]]
    fresh = ContentChecker()
    assert not fresh.check_modified(str(src), os.stat(src), old)
    assert fresh.hashed == 1
    src.write_bytes(b"#define SCALE 4.0f\n")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ContentChecker().check_modified(str(src), os.stat(src), old)


def test_outputs_recorded_within_the_racy_window_are_refreshed_once_proven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "k.ptx"
    out.write_bytes(b".entry k\n")
    digest = file_digest(str(out))
    racy = encode_outputs({str(out): fsutil.file_state(os.stat(out), digest, time.time_ns())})
    # Proven by content; still within the window, so nothing better to save yet.
    assert check_outputs(racy) == ([], None)
    monkeypatch.setattr(fsutil, "RACY_NS", 0)
    stale, refreshed = check_outputs(racy)
    assert stale == [] and refreshed is not None and refreshed != racy
    assert check_outputs(refreshed) == ([], None), "a settled record is trusted by stat"
    # A same-size edit with the mtime set back is stale, racy record or settled one.
    before = os.stat(out)
    out.write_bytes(b".entry j\n")
    os.utime(out, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert check_outputs(refreshed)[0] == [str(out)]
    assert check_outputs(racy)[0] == [str(out)]


def test_external_files_follow_the_same_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsutil, "RACY_NS", 0)
    ext = tmp_path / "scale.cuh"
    ext.write_bytes(b"#define SCALE 2.0f\n")
    digest = file_hash(str(ext))
    record = {str(ext): fsutil.file_state(os.stat(ext), digest, time.time_ns())}
    assert check_external(record) == ([], None)
    older = {str(ext): [record[str(ext)][0], record[str(ext)][1], digest]}
    stale, refreshed = check_external(older)
    assert stale == [] and refreshed == record, "a three-field record is proven, then refreshed"
    before = os.stat(ext)
    ext.write_bytes(b"#define SCALE 3.0f\n")
    os.utime(ext, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert check_external(record)[0] == [str(ext)]
