"""What changed, decided by content: an event names where to look, the bytes decide."""

from __future__ import annotations

import os
from pathlib import Path

from metrale_orch.watch.changes import Changes, FileTable, watched_roots


def _tree(root: Path) -> Path:
    (root / "kernels/hw/m/q").mkdir(parents=True)
    (root / "kernels/hw/m/q/a.cu").write_text("a\n")
    (root / "kernels/hw/HARDWARE.toml").write_text("[hardware]\n")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "elsewhere.txt").write_text("not watched\n")
    return root


def test_the_same_bytes_are_no_change(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    table = FileTable(root, watched_roots(root))
    source = root / "kernels/hw/m/q/a.cu"
    source.write_text("a\n")
    assert not table.confirm(["kernels/hw/m/q/a.cu"])
    tmp = source.with_name(".a.cu.tmp")  # an atomic save of other bytes
    tmp.write_text("b\n")
    os.replace(tmp, source)
    assert table.confirm(["kernels/hw/m/q/a.cu", "kernels/hw/m/q/.a.cu.tmp"]) == Changes(
        changed=("kernels/hw/m/q/a.cu",)
    )
    assert not table.confirm(["kernels/hw/m/q/a.cu"])  # the table took the new state


def test_added_removed_and_unwatched(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    table = FileTable(root, watched_roots(root))
    (root / "kernels/hw/m/q/b.cu").write_text("b\n")
    (root / "kernels/hw/m/q/a.cu").unlink()
    (root / "elsewhere.txt").write_text("changed\n")
    assert table.confirm(["kernels/hw/m/q", "elsewhere.txt"]) == Changes(
        added=("kernels/hw/m/q/b.cu",), removed=("kernels/hw/m/q/a.cu",)
    )


def test_a_rescan_finds_what_no_event_named(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    table = FileTable(root, watched_roots(root))
    (root / "toolchains").mkdir()
    (root / "toolchains/nvcc.toml").write_text("[toolchain]\n")
    (root / "kernels/hw/HARDWARE.toml").write_text("[hardware]\nvendor = 'x'\n")
    assert table.rescan() == Changes(
        changed=("kernels/hw/HARDWARE.toml",), added=("toolchains/nvcc.toml",)
    )
    assert not table.rescan()


def test_the_watched_set_is_what_a_build_reads(tmp_path: Path) -> None:
    assert watched_roots(tmp_path) == ("kernels", "pyproject.toml", "toolchains")
    assert "hip/compat" in watched_roots(tmp_path, tmp_path / "hip/compat")
    assert watched_roots(tmp_path, tmp_path.parent / "elsewhere") == watched_roots(tmp_path)
