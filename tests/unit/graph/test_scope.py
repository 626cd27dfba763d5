"""A run's scope (``metrale_orch.graph.scope``): which build sub-tasks it needs."""

from __future__ import annotations

import pytest
from doit.control import TaskControl
from doit.exceptions import InvalidCommand
from doit.task import Task
from hypothesis import given
from hypothesis import strategies as st

from metrale_orch.graph.scope import build_scope, in_scope


@pytest.mark.parametrize(
    ("selection", "scope"),
    [
        (("build:hopper/m/q",), ("build:hopper/m/q",)),
        (("build:b/m/q", "build:a/*", "build:b/m/q"), ("build:a/*", "build:b/m/q")),
        ((), None),  # the default tasks
        (None, None),  # another command, or none
        (("build",), None),  # the group: every target
        (("build:",), None),
        (("build:hopper/m/q", "smoke:hopper"), None),
        (("build:hopper/m/q", "check"), None),
        (("build*",), None),  # a pattern doit may match other tasks with
        (("manifest.json",), None),  # a target file doit looks up
    ],
)
def test_build_scope(selection: tuple[str, ...] | None, scope: tuple[str, ...] | None) -> None:
    assert build_scope(selection) == scope


def test_in_scope_reads_words_as_doit_does() -> None:
    assert in_scope("hopper/m/q", None)
    assert in_scope("hopper/m/q", ("build:hopper/m/q",))
    assert not in_scope("hopper/m/q2", ("build:hopper/m/q",))
    assert in_scope("hopper/m/q", ("build:gb10/*", "build:hopper/*"))
    assert not in_scope("gb10x/m/q", ("build:gb10/*",))
    # doit globs a word only when it holds "*": "?" and "[" are then plain characters.
    assert in_scope("hopper/m/q?", ("build:hopper/m/q?",))
    assert not in_scope("hopper/m/qx", ("build:hopper/m/q?",))


_NAME = st.text(alphabet="ab/?[]*-", min_size=1, max_size=8)


@given(
    targets=st.lists(_NAME.filter(lambda t: "*" not in t), min_size=1, max_size=6, unique=True),
    words=st.lists(_NAME, min_size=1, max_size=3),
)
def test_in_scope_is_doits_own_selection(targets: list[str], words: list[str]) -> None:
    """The targets in the scope are exactly the sub-tasks doit's own selection of the
    words picks (``TaskControl``, which ``doit run`` asks)."""
    tasks = [Task(f"build:{t}", None) for t in targets]
    selection = [f"build:{w}" for w in words]
    control = TaskControl(tasks)
    try:
        picked = set(control._filter_tasks(selection))
    except InvalidCommand:  # a word naming no task: doit refuses the run
        picked = None
    ours = {f"build:{t}" for t in targets if in_scope(t, tuple(selection))}
    if picked is None:
        assert any("*" not in w and w not in {t.name for t in tasks} for w in selection)
    else:
        assert ours == picked
