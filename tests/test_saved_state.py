"""The saved state is what was built, outputs are checked, one build per project."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from metrale_orch.fsutil import file_digest
from metrale_orch.tasks.checker import ContentChecker, TaskDataCodec, encode_outputs, stale_outputs
from metrale_orch.tasks.runlock import BuildLock


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
