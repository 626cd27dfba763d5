"""The saved state is what was built, outputs are checked, one build per project."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from metrale_orch._checker import ContentChecker, stale_outputs
from metrale_orch._fsutil import file_digest
from metrale_orch._runlock import BuildLock


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
    out = tmp_path / "a.ptx"
    out.write_text("ptx v1")
    st = out.stat()
    record = {str(out): [st.st_mtime_ns, st.st_size, file_digest(str(out))]}
    assert stale_outputs(record) == []
    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns + 10))  # touched, same bytes
    assert stale_outputs(record) == []
    out.write_text("ptx v2")  # same size, other bytes
    assert stale_outputs(record) == [str(out)]
    out.unlink()
    assert stale_outputs(record) == [str(out)]
    assert stale_outputs(None) and stale_outputs({}) == []


def test_build_lock_second_holder_waits_and_names_the_first(tmp_path: Path) -> None:
    build = tmp_path / "build"
    first = BuildLock(build)
    said: list[str] = []
    first.acquire(said.append)
    assert first.held and said == []
    holder = (build / ".lock.holder").read_text()
    assert f"pid {os.getpid()}" in holder
    code = (
        "import sys; from pathlib import Path; from metrale_orch._runlock import BuildLock\n"
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
