"""One way to read settings, for every command (issue 43, item 1; B4, B9).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/config/test_settings_everywhere.py``.
"""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path

import pytest

from metrale_orch.config.values import MAX_JOBS
from tests.support.config import cli
from tests.support.project import doit, orch


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
