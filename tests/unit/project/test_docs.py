"""The front door stays true: README.md and docs/ (issue 36).

- README.md is at most 300 lines and BENCHMARKS.md at most 200 (the manual is in docs/);
- every relative link resolves to a file, and every ``#anchor`` to a heading there;
- every ``$ metrale-orch ...`` line shown parses with the command's own parser, and every
  ``$ doit ...`` line names tasks the sample tree has;
- the outputs shown for the views that need no build (``layout``, ``rdeps``) are what the
  command prints on the sample tree today (``...`` in a shown output skips lines).

The tests of this topic that start processes are in
``tests/scenarios/project/test_docs.py``.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.cli import _parser
from metrale_orch.tree.resolve import walk
from tests.support import REPO
from tests.support.docs import PAGES, VIEWS, _rel, _shown

#: The sample tree's targets (doit task names are build:<target>).
TARGETS = sorted(str(t) for t in walk(REPO))
DOIT_COMMANDS = {"list", "clean", "forget", "dumpdb", "ignore", "info", "help", "run", "strace"}


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out = set()
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


def _commands(line: str) -> Iterator[list[str]]:
    """Each simple command of a shown line (``&&`` split, comments and variables dropped)."""
    line = re.sub(r"\s{2,}#.*$", "", line)
    for part in line.split("&&"):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            words = words[1:]
        if words:
            yield words


def test_the_front_pages_are_short() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
    assert len((REPO / "BENCHMARKS.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, broken


def test_every_command_shown_is_one_the_tools_take() -> None:
    parser = _parser()
    wrong = []
    seen = 0
    for page, line, _ in _shown():
        for words in _commands(line):
            if words[0] == "metrale-orch":
                seen += 1
                try:
                    parser.parse_args(words[1:])
                except SystemExit:
                    wrong.append(f"{page}: {line}")
            elif words[0] == "doit":
                seen += 1
                tasks = [w for w in words[1:] if not w.startswith("-") and not w.isdigit()]
                tasks = [w for w in tasks if w not in ("process", "thread")]
                for word in tasks:
                    if word in DOIT_COMMANDS or word in ("build", "check", "smoke"):
                        continue
                    kind, _, pattern = word.partition(":")
                    names = (
                        TARGETS if kind == "build" else sorted({t.split("/")[0] for t in TARGETS})
                    )
                    if kind not in ("build", "smoke") or not fnmatch.filter(names, pattern):
                        wrong.append(f"{page}: {line}: {word} names no task of the sample tree")
    assert seen > 20 and not wrong, wrong


def test_there_are_views_to_check() -> None:
    assert len(VIEWS) >= 2
