"""One way to read settings, for every command (issue 43, item 1; B4, B9).

Every ``metrale-orch`` command, enumerated from the parser so that a new one is covered
when it is added, gets its configuration from ``pyproject.toml`` < environment < ``--set``
and checks it before its own arguments: the same bad setting, wherever it is set, is the
same one line and exit 2 whatever the command, and the same setting gives the same
answer (``status`` and ``why`` read the build directory ``--set`` names).

The tests of this topic that start processes are in
``tests/scenarios/config/test_settings_everywhere.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.cli import _parser
from tests.support.config import cli

#: The argument a leaf command's required positional gets: never read, since the
#: configuration is refused first (were it not, a path such as ``cache keygen``'s lands in
#: the test's own directory).
_ANY = "x"


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[list[str]]:
    """The argv of each runnable (sub-)command under ``parser``, with its required
    arguments filled in."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        for name, sub in sorted(subs[0].choices.items()):
            yield from _leaves(sub, (*path, name))
        return
    argv = list(path)
    for action in parser._actions:
        if action.option_strings:
            if action.required:
                argv += [action.option_strings[0], _ANY]
        elif action.nargs in (None, "+"):
            argv.append(_ANY)
        elif action.nargs == argparse.REMAINDER:  # another program's arguments (doit's)
            argv.append("--help")
    yield argv


COMMANDS = {" ".join(argv): argv for argv in _leaves(_parser(), ())}

#: The same mistake made at each level: (argv before the command, environment, pyproject
#: text, the one line it is).
MODE_LINE = "cache_mode: must be one of read-write, read-only, off, got 'of'"
BAD = {
    "--set": (["--set", "cache_mode=of"], {}, "", f"error: command line: {MODE_LINE}"),
    "environment": (
        [],
        {"METRALE_ORCH_CACHE_MODE": "of"},
        "",
        f"error: environment METRALE_ORCH_CACHE_MODE: {MODE_LINE}",
    ),
    "pyproject value": (
        [],
        {},
        '[tool.metrale-orch]\ncache_mode = "of"\n',
        f"error: pyproject.toml [tool.metrale-orch]: {MODE_LINE}",
    ),
    "broken pyproject": (
        [],
        {},
        "[tool.metrale-orch\n",
        "error: pyproject.toml: (file): cannot be read: Expected ']' at the end of a table "
        "declaration (at line 1, column 19)",
    ),
}


def test_every_command_is_enumerated() -> None:
    # The enumeration reaches the nested commands: a parser change that hides them fails.
    assert {"status", "why x", "rdeps x", "check", "doit --help", "cache stats", "size"} <= set(
        COMMANDS
    ), sorted(COMMANDS)


@pytest.mark.parametrize("where", sorted(BAD))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_the_same_bad_setting_in_one_line(
    fake_project: tuple[Path, dict[str, str]],
    command: str,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, env = fake_project
    monkeypatch.chdir(root)
    before, variables, pyproject, line = BAD[where]
    if pyproject:
        (root / "pyproject.toml").write_text(pyproject)
    code, out, err = cli(root, {**env, **variables}, *before, *COMMANDS[command])
    assert (code, out, err) == (2, "", line + "\n")


def test_a_digit_string_past_pythons_limit_in_pyproject_is_one_line(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    """tomllib lets an integer of more than 4300 digits through as a bare ValueError."""
    root, env = fake_project
    (root / "pyproject.toml").write_text("[tool.metrale-orch]\nmemory = " + "9" * 5000 + "\n")
    code, out, err = cli(root, env, "status")
    assert (code, out) == (2, "")
    assert err.startswith("error: pyproject.toml: (file): cannot be read: Exceeds the limit")
    assert err.count("\n") == 1, err
