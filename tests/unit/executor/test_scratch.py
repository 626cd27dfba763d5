"""The directory a compile writes into is made by the executor that runs it here, and
only there: never through a link, and not twice for a compile's second step."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_orch.executor import Action
from metrale_orch.executor.local import _make_scratch
from metrale_orch.proc import ProcessError


def _action(scratch: Path) -> Action:
    return Action(argv=("cc",), cwd=scratch.parent, scratch=scratch)


def test_the_scratch_directory_and_its_parents_are_made(tmp_path: Path) -> None:
    scratch = tmp_path / "build" / ".tmp" / "k.1.abc"
    _make_scratch(_action(scratch))
    assert scratch.is_dir()
    _make_scratch(_action(scratch))  # a second step finds it made
    assert scratch.is_dir()


def test_a_link_or_a_file_in_its_place_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "k.1.abc"
    link.symlink_to(elsewhere)
    with pytest.raises(ProcessError, match="is a link or not a directory"):
        _make_scratch(_action(link))
    plain = tmp_path / "k.2.abc"
    plain.write_text("x")
    with pytest.raises(ProcessError, match="is a link or not a directory"):
        _make_scratch(_action(plain))
