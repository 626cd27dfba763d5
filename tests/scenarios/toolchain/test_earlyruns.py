"""The probes' dry runs started from the last run's plan before the package loads
(metrale_orch.toolchain.earlyruns): taken only by exactly their own command, never
a result of their own."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import metrale_orch.toolchain.records as records
from metrale_orch.toolchain import earlyruns
from metrale_orch.toolchain.earlyruns import EarlyRuns
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain
from tests.support.project import doit
from tests.support.tasks import LOADER_PYPROJECT
from tests.support.toolchain import NVCC, _setup


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Files the test just wrote count as settled; each test's temporary directories are
    in a directory of its own."""
    monkeypatch.setattr(records, "RACY_NS", 0)
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))


@pytest.fixture
def early() -> Iterator[EarlyRuns]:
    """A run's early runs (none started, nothing asked), discarded after the test."""
    runs = EarlyRuns()
    yield runs
    runs.discard()


def _probe(tmp_path: Path, env: dict[str, str], early: EarlyRuns | None = None) -> str:
    """A run's probe of the fake nvcc, taking its dry runs from ``early`` when started there."""
    program = tmp_path / "bin" / "nvcc"
    state = tmp_path / "state"
    return probe_toolchain(NVCC, program, env, state_dir=state, memo=ProbeMemo(early)).identity


def _planned(tmp_path: Path, env: dict[str, str]) -> str:
    """Probe twice (the second run runs only the dry runs), leave what the second asked
    as the plan, as the next process would find it: the identity."""
    _probe(tmp_path, env)
    second = EarlyRuns()
    identity = _probe(tmp_path, env, second)
    (tmp_path / "state" / earlyruns.PLAN_NAME).write_bytes(second.plan_bytes(env))
    (tmp_path / "probe.log").write_text("")
    return identity


def _ran(tmp_path: Path) -> list[str]:
    return sorted((tmp_path / "probe.log").read_text().splitlines())


def test_the_planned_dry_runs_start_early_and_are_taken_not_repeated(
    tmp_path: Path, early: EarlyRuns
) -> None:
    env = _setup(tmp_path)
    identity = _planned(tmp_path, env)
    assert early.start_plan(tmp_path / "state", env) == 2  # nvcc's and gcc's dry runs
    assert early.waiting() == 2
    assert _probe(tmp_path, env, early) == identity
    assert early.waiting() == 0
    ran = _ran(tmp_path)
    assert len(ran) == 2 and [r.split()[0] for r in ran] == ["gcc", "nvcc"], ran
    # The dry run ran in a directory of its own, which is gone once read.
    assert list((tmp_path / "t").iterdir()) == []


def test_an_early_run_is_taken_only_by_exactly_its_command(
    tmp_path: Path, early: EarlyRuns
) -> None:
    """A variable the plan's run did not have (here one a wrapper reads, which no key
    names) leaves the early runs untaken: the probe runs its own, and sees the change."""
    env = _setup(tmp_path)
    identity = _planned(tmp_path, env)
    assert early.start_plan(tmp_path / "state", env) == 2
    wrapped = {**env, "FAKE_NVCC_DRYRUN": "-DWRAPPED=1"}
    changed = _probe(tmp_path, wrapped, early)
    assert changed != identity
    assert early.waiting() == 2
    early.discard()  # what the end of the run (or the process) does: killed, reaped, removed
    assert early.waiting() == 0
    assert list((tmp_path / "t").iterdir()) == []
    assert _probe(tmp_path, wrapped) == changed


def test_a_forked_process_takes_no_early_run(tmp_path: Path, early: EarlyRuns) -> None:
    """A worker doit forks (``-P process``) owns none of its parent's early runs: it
    neither takes nor discards them, and its probe runs its own commands."""
    import os

    env = _setup(tmp_path)
    identity = _planned(tmp_path, env)
    assert early.start_plan(tmp_path / "state", env) == 2
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit status
        ok = _probe(tmp_path, env, early) == identity and early.waiting() == 0
        early.discard()
        os._exit(0 if ok else 1)
    _pid, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert early.waiting() == 2  # still the parent's, untouched
    # The early nvcc and gcc dry runs, and the child's own two.
    assert len(_ran(tmp_path)) == 4
    assert _probe(tmp_path, env, early) == identity and early.waiting() == 0
    assert len(_ran(tmp_path)) == 4  # the parent took its early runs


def test_a_plan_keeps_no_value_of_the_caller_s_environment(
    tmp_path: Path, early: EarlyRuns
) -> None:
    """The plan holds what the probes' environment changes against the caller's, not the
    caller's own values: the next process starts each run with its own environment."""
    env = {**_setup(tmp_path), "MY_TOKEN": "secret-1"}
    _planned(tmp_path, env)
    plan = (tmp_path / "state" / earlyruns.PLAN_NAME).read_text()
    assert "secret-1" not in plan
    assert all(r["set"] == {} and r["unset"] == [] for r in json.loads(plan)["runs"])
    later = {**env, "MY_TOKEN": "secret-2"}
    identity = _probe(tmp_path, later)
    assert early.start_plan(tmp_path / "state", later) == 2
    assert _probe(tmp_path, later, early) == identity
    assert early.waiting() == 0


@pytest.mark.parametrize(
    "plan",
    [
        "not json",
        '{"runs": 3}',
        '{"runs": [{"argv": ["nvcc", "--dryrun"], "cwd": "<probe dir>", "set": {}, "unset": []}]}',
        '{"runs": [{"argv": ["/no/such/nvcc"], "cwd": "<probe dir>", "set": {}, "unset": []}]}',
        '{"runs": [{"argv": ["/bin/true"], "cwd": "rel", "set": {}, "unset": []}]}',
        '{"runs": [{"argv": ["/bin/true"], "cwd": "<probe dir>", "set": {"A": 1}, "unset": []}]}',
        '{"runs": [{"argv": [], "cwd": "<probe dir>", "set": {}, "unset": []}]}',
        '{"runs": ["x"]}',
    ],
)
def test_a_malformed_plan_starts_nothing(tmp_path: Path, plan: str, early: EarlyRuns) -> None:
    (tmp_path / earlyruns.PLAN_NAME).write_text(plan)
    assert early.start_plan(tmp_path, {"PATH": "/usr/bin"}) == 0
    assert early.waiting() == 0


@pytest.mark.parametrize("door", ["plain", "loader"])
def test_a_doit_run_leaves_its_plan_and_the_next_takes_it(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, door: str
) -> None:
    """A run leaves the dry runs its stamps asked for as the plan; the next run starts
    them (plain doit: while the dodo file is imported; the package's task loader: when
    doit hands it the command), takes them (each ran once in that run), and leaves no
    directory of theirs behind."""
    root, env = fake_project
    if door == "loader":
        with (root / "pyproject.toml").open("a") as f:
            f.write(LOADER_PYPROJECT)
    log = tmp_path / "xcrun.log"
    xcrun = tmp_path / "bin/xcrun"  # the apple target's compiler, logging each dry run
    xcrun.write_text(
        "#!/bin/sh\n"
        'out=""; deps=""; prev=""\n'
        'for a in "$@"; do [ "$prev" = -o ] && out="$a"; [ "$prev" = -MF ] && deps="$a"; '
        'prev="$a"; done\n'
        f'case "$*" in *-###*) echo "$*" >> {log};; *--version*) ;;\n'
        '  *) echo air > "$out"; [ -z "$deps" ] || echo "k.air: k.metal" > "$deps";; esac\n'
        'echo "Apple metal version 32023.1"\n'
    )
    xcrun.chmod(0o755)
    env = {**env, "TMPDIR": str(tmp_path / "t")}
    for _ in range(2):  # the first run stamps every toolchain, the second what is used
        run = doit(root, ["build"], env)
        assert run.returncode == 0, run.text
    plan = json.loads((root / "build/.state" / earlyruns.PLAN_NAME).read_text())
    assert [r["argv"][0] for r in plan["runs"] if r["argv"][0] == str(xcrun)] == [str(xcrun)]
    log.write_text("")
    again = doit(root, ["build"], env)
    assert again.returncode == 0, again.text
    assert log.read_text().splitlines() == [
        "-sdk macosx metal -### -x metal -std=metal3.1 -c metrale_probe.cu -o metrale_probe.air"
    ]
    assert list((tmp_path / "t").iterdir()) == []
