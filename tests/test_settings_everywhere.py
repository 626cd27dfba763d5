"""One way to read settings, for every command (issue 43, item 1; B4, B9).

Every ``metrale-orch`` command, enumerated from the parser so that a new one is covered
when it is added, gets its configuration from ``pyproject.toml`` < environment < ``--set``
and checks it before its own arguments: the same bad setting, wherever it is set, is the
same one line and exit 2 whatever the command, and the same setting gives the same
answer (``status`` and ``why`` read the build directory ``--set`` names).
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import astuple
from pathlib import Path

import pytest

from metrale_orch.cli import _parser, main
from metrale_orch.config.values import MAX_JOBS
from tests.support.project import doit, orch

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


def cli(root: Path, env: Mapping[str, str], *argv: str) -> tuple[int, str, str]:
    """``metrale-orch --root ROOT ARGV`` as a user runs it: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *argv], environ=dict(env), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


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


def test_status_and_why_answer_for_the_build_dir_set(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    build = doit(root, ["build:hopper/qwen/w8"], env)
    assert build.returncode == 0, build.text
    code, out, err = cli(root, env, "status", "hopper/qwen/w8", "--exit-code")
    assert (code, out, err) == (0, "up to date  hopper/qwen/w8\n1 target(s): 1 up to date\n", "")
    # Elsewhere nothing is built: the answer for that build directory, as `doit build`
    # under the same setting would act on it.
    code, out, err = cli(
        root, env, "--set", "build_dir=elsewhere", "status", "hopper/qwen/w8", "--exit-code"
    )
    assert (code, err) == (1, ""), out
    assert out.startswith("stale  hopper/qwen/w8  ("), out
    # The same setting from the environment gives the same answer.
    via_env = cli(
        root,
        {**env, "METRALE_ORCH_BUILD_DIR": "elsewhere"},
        "status",
        "hopper/qwen/w8",
        "--exit-code",
    )
    assert via_env == (code, out, err)
    code, out, err = cli(root, env, "--set", "build_dir=elsewhere", "why", "hopper/qwen/w8")
    assert (code, err) == (0, "")
    assert out.startswith("hopper/qwen/w8 is stale:\n"), out
    assert "missing output" in out or "signature part changed: " in out, out


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("memory", "9" * 400),
        ("memory", f'"{"9" * 400}M"'),
        ("size_budget", '{ hopper = "' + "9" * 400 + 'G" }'),
        ("log_backups", "9" * 400),
        ("jobs", str(MAX_JOBS + 1)),
        ("cache_timeout", "inf"),
        ("cache_timeout", "nan"),
    ],
)
def test_a_huge_or_not_finite_number_in_pyproject_is_one_line_for_doit(
    fake_project: tuple[Path, dict[str, str]], key: str, text: str
) -> None:
    """B4: a size of 400 digits was an OverflowError traceback on every doit run."""
    root, env = fake_project
    (root / "pyproject.toml").write_text(f"[tool.metrale-orch]\n{key} = {text}\n")
    code, out, err = astuple(orch(root, ["doit", "build"], env))
    assert (code, out) == (2, ""), err
    assert err.startswith(f"error: pyproject.toml [tool.metrale-orch]: {key}"), err
    assert err.count("\n") == 1 and len(err) < 300, err
    # Plain doit (its own pyproject reading done) refuses it as any bad value: the
    # configuration's failure, no traceback.
    run = doit(root, ["build"], env)
    assert run.returncode != 0
    assert "Traceback" not in run.text and "OverflowError" not in run.text, run.text
    assert f"pyproject.toml [tool.metrale-orch]: {key}" in run.text, run.text


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


@pytest.mark.parametrize("jobs", ["100000", "9" * 5000])
def test_too_many_jobs_are_refused_before_any_thread_starts(
    fake_project: tuple[Path, dict[str, str]], jobs: str
) -> None:
    """B9: METRALE_ORCH_JOBS=100000 reached doit's num_process: a thread per slot until
    'can't start new thread' (traceback, exit 3)."""
    root, env = fake_project
    env = {**env, "METRALE_ORCH_JOBS": jobs}
    code, out, err = astuple(orch(root, ["doit", "build"], env))
    assert (code, out) == (2, "")
    assert err.startswith("error: environment METRALE_ORCH_JOBS: jobs: must be a positive "), err
    assert err.count("\n") == 1 and len(err) < 300, err
    run = doit(root, ["build"], env)
    assert run.returncode != 0
    assert "Traceback" not in run.text and "thread" not in run.text, run.text
    assert "METRALE_ORCH_JOBS: jobs: must be a positive integer" in run.text, run.text
    # The most allowed is taken as it is.
    code, out, err = cli(
        root, {**env, "METRALE_ORCH_JOBS": str(MAX_JOBS)}, "status", "hopper/qwen/w8", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["counts"] == {"stale": 1}
