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
from metrale_orch.toolchain.probe import ProbeMemo, probe_toolchain
from tests.support.project import doit
from tests.test_probe_records import NVCC, _setup


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Files the test just wrote count as settled; each test starts with no early run and
    nothing asked, and its temporary directories in a directory of its own."""
    monkeypatch.setattr(records, "RACY_NS", 0)
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    earlyruns.reset()
    yield
    earlyruns.reset()


def _probe(tmp_path: Path, env: dict[str, str]) -> str:
    program = tmp_path / "bin" / "nvcc"
    state = tmp_path / "state"
    return probe_toolchain(NVCC, program, env, state_dir=state, memo=ProbeMemo()).identity


def _planned(tmp_path: Path, env: dict[str, str]) -> str:
    """Probe twice (the second run runs only the dry runs), leave what the second asked
    as the plan, and start it as the next process would: the identity."""
    _probe(tmp_path, env)
    earlyruns.reset()
    identity = _probe(tmp_path, env)
    (tmp_path / "state" / earlyruns.PLAN_NAME).write_bytes(earlyruns.plan_bytes(env))
    earlyruns.reset()
    (tmp_path / "probe.log").write_text("")
    return identity


def _ran(tmp_path: Path) -> list[str]:
    return sorted((tmp_path / "probe.log").read_text().splitlines())


def test_the_planned_dry_runs_start_early_and_are_taken_not_repeated(tmp_path: Path) -> None:
    env = _setup(tmp_path)
    identity = _planned(tmp_path, env)
    assert earlyruns.start_plan(tmp_path / "state", env) == 2  # nvcc's and gcc's dry runs
    assert earlyruns.waiting() == 2
    assert _probe(tmp_path, env) == identity
    assert earlyruns.waiting() == 0
    ran = _ran(tmp_path)
    assert len(ran) == 2 and [r.split()[0] for r in ran] == ["gcc", "nvcc"], ran
    # The dry run ran in a directory of its own, which is gone once read.
    assert list((tmp_path / "t").iterdir()) == []


def test_an_early_run_is_taken_only_by_exactly_its_command(tmp_path: Path) -> None:
    """A variable the plan's run did not have (here one a wrapper reads, which no key
    names) leaves the early runs untaken: the probe runs its own, and sees the change."""
    env = _setup(tmp_path)
    identity = _planned(tmp_path, env)
    assert earlyruns.start_plan(tmp_path / "state", env) == 2
    wrapped = {**env, "FAKE_NVCC_DRYRUN": "-DWRAPPED=1"}
    changed = _probe(tmp_path, wrapped)
    assert changed != identity
    assert earlyruns.waiting() == 2
    earlyruns.reset()  # what the end of the process does: killed, reaped, removed
    assert earlyruns.waiting() == 0
    assert list((tmp_path / "t").iterdir()) == []
    earlyruns.reset()
    assert _probe(tmp_path, wrapped) == changed


def test_a_plan_keeps_no_value_of_the_caller_s_environment(tmp_path: Path) -> None:
    """The plan holds what the probes' environment changes against the caller's, not the
    caller's own values: the next process starts each run with its own environment."""
    env = {**_setup(tmp_path), "MY_TOKEN": "secret-1"}
    _planned(tmp_path, env)
    plan = (tmp_path / "state" / earlyruns.PLAN_NAME).read_text()
    assert "secret-1" not in plan
    assert all(r["set"] == {} and r["unset"] == [] for r in json.loads(plan)["runs"])
    later = {**env, "MY_TOKEN": "secret-2"}
    identity = _probe(tmp_path, later)
    earlyruns.reset()
    assert earlyruns.start_plan(tmp_path / "state", later) == 2
    assert _probe(tmp_path, later) == identity
    assert earlyruns.waiting() == 0


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
def test_a_malformed_plan_starts_nothing(tmp_path: Path, plan: str) -> None:
    (tmp_path / earlyruns.PLAN_NAME).write_text(plan)
    assert earlyruns.start_plan(tmp_path, {"PATH": "/usr/bin"}) == 0
    assert earlyruns.waiting() == 0


def test_a_doit_run_leaves_its_plan_and_the_next_takes_it(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A run leaves the dry runs its stamps asked for as the plan; the next run starts
    them before the package loads, takes them (each ran once in that run), and leaves
    no directory of theirs behind."""
    root, env = fake_project
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
