"""The atomic writes every staged and installed file goes through."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from metrale_orch.fsutil import write_atomic, write_if_changed


def _entries(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_write_atomic_creates_the_directory_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.bin"
    write_atomic(path, b"one")
    assert path.read_bytes() == b"one"
    write_atomic(path, b"two")  # replaces
    assert path.read_bytes() == b"two"
    assert _entries(path.parent) == ["out.bin"]


def test_write_atomic_replaces_a_link_not_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_bytes(b"kept")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_atomic(link, b"new")
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert real.read_bytes() == b"kept"


def test_a_failed_write_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inside").write_bytes(b"x")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "dir", b"a file where a directory is")
    assert _entries(tmp_path) == ["dir"]
    with pytest.raises(OSError):  # the directory cannot be made: a file is in the way
        write_atomic(tmp_path / "dir" / "inside" / "deeper", b"x")
    assert _entries(tmp_path / "dir") == ["inside"]


def test_write_if_changed_writes_only_different_bytes(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "f"
    assert write_if_changed(path, b"abc") is True
    before = path.stat().st_ino
    assert write_if_changed(path, b"abc") is False
    assert path.stat().st_ino == before  # untouched
    assert write_if_changed(path, b"abd") is True  # same size, other bytes
    assert path.read_bytes() == b"abd"
    assert write_if_changed(path, b"abdd") is True
    assert path.read_bytes() == b"abdd"
    assert _entries(path.parent) == ["f"]


def test_read_json_object_is_the_object_or_nothing(tmp_path: Path) -> None:
    from metrale_orch.fsutil import read_json_object

    path = tmp_path / "state.json"
    assert read_json_object(path) == {}  # missing
    for text in ("{", "[1]", '"x"', "\xff"):
        path.write_text(text, encoding="latin-1")
        assert read_json_object(path) == {}, text
    path.write_text('{"a": [1, "b"], "c": "d"}')
    assert read_json_object(path) == {"a": [1, "b"], "c": "d"}


def test_remove_all_but_newest_keeps_the_most_recently_modified(tmp_path: Path) -> None:
    from metrale_orch.fsutil import remove_all_but_newest

    paths = []
    for i in range(5):
        path = tmp_path / f"e{i}"
        path.write_text(str(i))
        os.utime(path, ns=(i * 10**9, i * 10**9))
        paths.append(path)
    remove_all_but_newest(reversed(paths), 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3", "e4"]
    remove_all_but_newest(paths[3:], 5)  # fewer than kept: nothing goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e3", "e4"]


def test_a_private_write_is_the_user_s_alone_and_follows_no_link(tmp_path: Path) -> None:
    """``private``: mode 0600 whatever the umask, and a link planted at the temporary's name
    (which is predictable) is refused rather than followed into another file."""
    path = tmp_path / "sub" / "code.bin"
    old = os.umask(0o002)
    try:
        write_atomic(path, b"one", private=True)
    finally:
        os.umask(old)
    assert path.read_bytes() == b"one" and (path.stat().st_mode & 0o777) == 0o600
    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.symlink_to(victim)
    with pytest.raises(OSError):
        write_atomic(path, b"two", private=True)
    assert victim.read_bytes() == b"kept" and path.read_bytes() == b"one"
