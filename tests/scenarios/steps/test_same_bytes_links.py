"""A build's installed artefacts of the same bytes are links of one file (fsutil.SameBytes);
one edited in place is one file changed for every target that shares it, and the next
build puts each back: no target keeps the edited bytes, none is taken for up to date."""

from __future__ import annotations

from pathlib import Path

from tests.support.project import doit


def _shared(build: Path) -> list[tuple[Path, Path]]:
    """Pairs of installed artefacts of two targets that are one file (same inode)."""
    by_inode: dict[int, list[Path]] = {}
    for path in sorted(build.glob("*/*/*/*.ptx")):
        by_inode.setdefault(path.stat().st_ino, []).append(path)
    return [(paths[0], paths[1]) for paths in by_inode.values() if len(paths) > 1]


def test_an_artefact_edited_in_place_is_rebuilt_in_every_target_that_shares_it(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    assert doit(root, ["build"], env).returncode == 0
    build = root / "build"
    pairs = _shared(build)
    assert pairs, "no artefact of one target was a link of another's"
    first, second = pairs[0]
    clean = first.read_bytes()
    with open(first, "ab") as fh:  # an edit in place reaches both names
        fh.write(b"// edited\n")
    assert second.read_bytes() == clean + b"// edited\n"
    again = doit(root, ["build"], env)
    assert again.returncode == 0, again.text
    assert first.read_bytes() == clean and second.read_bytes() == clean
