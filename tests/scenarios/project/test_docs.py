"""The front door stays true: README.md and docs/ (issue 36).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/project/test_docs.py``.
"""

from __future__ import annotations

import io
import shlex

import pytest

from metrale_orch.cli import main
from tests.support import REPO
from tests.support.docs import VIEWS


def _matches(shown: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` shows ``shown``'s lines in order, a ``...`` line skipping any."""
    at = 0
    skipping = False
    for line in shown:
        if line.strip() == "...":
            skipping = True
            continue
        if skipping:
            while at < len(actual) and actual[at] != line:
                at += 1
        if at >= len(actual) or actual[at] != line:
            return False
        at += 1
        skipping = False
    return skipping or at == len(actual)


@pytest.mark.parametrize(("page", "line", "out"), VIEWS, ids=[f"{p}: {c}" for p, c, _ in VIEWS])
def test_a_views_shown_output_is_what_it_prints(page: str, line: str, out: list[str]) -> None:
    text = io.StringIO()
    code = main(["--root", str(REPO), *shlex.split(line)[1:]], out=text, err=io.StringIO())
    assert code == 0
    actual = text.getvalue().splitlines()
    assert _matches(out, actual), "\n".join(actual)
