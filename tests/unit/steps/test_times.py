"""The kept compile times (metrale_orch.steps.times): longest work first, across runs.

The tests of this topic that start processes are in ``tests/scenarios/steps/test_times.py``.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.executor import LocalExecutor
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.times import (
    TARGET_TIMES,
    TIMES,
    CompileTimes,
    longest_first,
    merge_compiles,
    read_target_seconds,
    read_times,
    write_times,
)


def test_merge_keeps_what_did_not_compile_and_drops_what_is_gone() -> None:
    old = CompileTimes(
        {
            "a": {"m1": ("k1", 2.0), "m2": ("k2", 3.0), "gone": ("k9", 1.0)},
            "b": {"m1": ("k1", 2.0)},
            "removed": {"x": ("kx", 5.0)},
        }
    )
    new = merge_compiles(
        old,
        [("a", "m1", "k1b", 4.0), ("c", "n", "kn", 1.5)],
        seen={"a": {"m1", "m2"}},
        alive={"a", "b", "c"},
    )
    # A hit (a/m2, b/m1) keeps its last compile's time; an edited module takes the new one.
    assert new.modules == {
        "a": {"m1": ("k1b", 4.0), "m2": ("k2", 3.0)},
        "b": {"m1": ("k1", 2.0)},
        "c": {"n": ("kn", 1.5)},
    }
    assert new.target_seconds() == {"a": 7.0, "b": 2.0, "c": 1.5}
    assert new.by_key() == {"k1b": 4.0, "k2": 3.0, "k1": 2.0, "kn": 1.5}
    assert new.by_module()[("a", "m2")] == 3.0


def test_files_round_trip_sorted_and_garbage_reads_as_nothing(tmp_path: Path) -> None:
    times = CompileTimes({"z": {"b": ("k2", 1.0), "a": ("k1", 0.25)}, "y": {"m": ("k3", 2.0)}})
    write_times(tmp_path, times)
    assert read_times(tmp_path) == times
    assert read_target_seconds(tmp_path) == {"y": 2.0, "z": 1.25}
    text = (tmp_path / TIMES).read_text()
    assert text.index('"y"') < text.index('"z"') and text.index('"a"') < text.index('"b"')
    for garbage in ("{", "[]", '{"schema": 99, "modules": {}}', '{"schema": 1, "modules": 3}'):
        (tmp_path / TIMES).write_text(garbage)
        (tmp_path / TARGET_TIMES).write_text(garbage)
        assert read_times(tmp_path) == CompileTimes()
        assert read_target_seconds(tmp_path) == {}
    (tmp_path / TIMES).write_text('{"schema": 1, "modules": {"t": {"m": ["k", true], "n": ["k"]}}}')
    assert read_times(tmp_path) == CompileTimes()


def test_longest_first_puts_new_targets_first_then_by_seconds() -> None:
    names = ["a", "b", "c", "d", "e"]
    seconds = {"a": 1.0, "b": 9.0, "c": 9.0, "d": 3.0}
    assert longest_first(names, seconds, {"e": 1, "a": 50}) == ["e", "b", "c", "d", "a"]
    # Nothing known (a first build): the largest targets first, ties by name.
    assert longest_first(names, {}, {"c": 5, "a": 5, "e": 9}) == ["e", "a", "c", "b", "d"]


def test_a_module_whose_key_changed_keeps_its_last_time() -> None:
    session = BuildSession(
        LocalExecutor(1), expected={"k1": 4.0}, by_module={("t", "m"): 2.5, ("t", "n"): 1.0}
    )
    try:
        assert session.expected_seconds("k1", "t", "n") == 4.0  # by key first
        assert session.expected_seconds("edited", "t", "m") == 2.5
        assert session.expected_seconds("new", "t", "new") == 0.0
    finally:
        session.close()
