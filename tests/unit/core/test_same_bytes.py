"""Files of the same bytes written in one run are hard links of the first: while the
first is still what was written, and never at the cost of another name's bytes."""

from __future__ import annotations

import os
from pathlib import Path

from metrale_orch.fsutil import SameBytes, bytes_hash, write_atomic

DATA = b"// kernel header\n" * 40


def _write(same: SameBytes, path: Path, data: bytes = DATA) -> None:
    same.write(path, data, bytes_hash(data))


def test_the_same_bytes_again_are_a_link_to_the_first(tmp_path: Path) -> None:
    same = SameBytes()
    _write(same, tmp_path / "a" / "x.h")
    _write(same, tmp_path / "b" / "x.h")  # its directory is made
    _write(same, tmp_path / "c.h", b"other bytes\n")
    first, second = (tmp_path / "a" / "x.h").stat(), (tmp_path / "b" / "x.h").stat()
    assert first.st_ino == second.st_ino and first.st_nlink == 2
    assert (tmp_path / "b" / "x.h").read_bytes() == DATA
    assert (tmp_path / "c.h").stat().st_nlink == 1


def test_a_name_in_place_is_replaced_by_the_link(tmp_path: Path) -> None:
    same = SameBytes()
    _write(same, tmp_path / "a.h")
    (tmp_path / "b.h").write_bytes(b"old bytes\n")
    _write(same, tmp_path / "b.h")
    assert (tmp_path / "b.h").read_bytes() == DATA
    assert (tmp_path / "b.h").stat().st_ino == (tmp_path / "a.h").stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h", "b.h"]  # no temporary left


def test_a_first_file_changed_since_is_not_linked_to(tmp_path: Path) -> None:
    same = SameBytes()
    _write(same, tmp_path / "a.h")
    with open(tmp_path / "a.h", "r+b") as fh:  # changed in place, same size
        fh.write(b"XX")
    os.utime(tmp_path / "a.h", ns=(1, 1))
    _write(same, tmp_path / "b.h")
    assert (tmp_path / "b.h").read_bytes() == DATA
    assert (tmp_path / "b.h").stat().st_ino != (tmp_path / "a.h").stat().st_ino
    write_atomic(tmp_path / "b.h", b"replaced\n")  # as every write of the package replaces
    _write(same, tmp_path / "c.h")
    assert (tmp_path / "c.h").read_bytes() == DATA


def test_a_first_file_removed_is_written_again(tmp_path: Path) -> None:
    same = SameBytes()
    _write(same, tmp_path / "a.h")
    (tmp_path / "a.h").unlink()
    _write(same, tmp_path / "b.h")
    assert (tmp_path / "b.h").read_bytes() == DATA and (tmp_path / "b.h").stat().st_nlink == 1
