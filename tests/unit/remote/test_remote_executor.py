"""The remote executor's logic, with a recording backend (the engine's part runs for real
in tests/scenarios/remote/test_remote_build.py): what goes out, what runs here and why, the circuit
breaker, strict mode, a remote compile error, the remote budget, and stopping.

The tests of this topic that start processes are in
``tests/scenarios/remote/test_remote_executor.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metrale_orch.executor import ActionStopped, LocalExecutor
from metrale_orch.executor.offload import (
    RemoteExecutor,
    RemoteRun,
    RemoteUnavailable,
)
from metrale_orch.proc import ProcessError
from tests.support.executor import run_action, run_actions, stop_in_flight
from tests.support.remote import FakeBackend, action, ran_here


def test_a_form_goes_out_and_is_counted(tmp_path: Path) -> None:
    backend = FakeBackend()
    ex = RemoteExecutor(backend, LocalExecutor(1))
    done = run_action(ex, action(tmp_path))
    assert done.where == "remote" and done.stdout == "ok\n"
    assert len(backend.forms) == 1 and ran_here(tmp_path) == 0
    cached = RemoteRun(returncode=0, stdout="", stderr="", seconds=0.0, cached=True)
    backend.answer = cached
    assert run_action(ex, action(tmp_path)).where == "remote (action cache)"
    assert ex.counts("t").to_dict() == {"remote": 1, "action_cache": 1}
    assert ex.counts("t").to_dict() == {}  # taken


def test_strict_makes_infrastructure_failures_module_failures(tmp_path: Path) -> None:
    backend = FakeBackend(RemoteUnavailable("no worker for platform OSFamily=linux"))
    ex = RemoteExecutor(backend, LocalExecutor(1), strict=True)
    with pytest.raises(ProcessError, match=r"no worker for platform.*remote_strict"):
        run_action(ex, action(tmp_path))
    assert ran_here(tmp_path) == 0


def test_a_remote_compile_error_is_a_compile_error_never_retried_here(tmp_path: Path) -> None:
    failed = RemoteRun(returncode=2, stdout="", stderr="k.cu(3): error: x\n", seconds=0.1)
    ex = RemoteExecutor(FakeBackend(failed), LocalExecutor(1))
    with pytest.raises(ProcessError) as err:
        run_action(ex, action(tmp_path))
    assert err.value.returncode == 2 and "error: x" in err.value.output
    assert ran_here(tmp_path) == 0


def test_remote_jobs_caps_actions_in_flight_independently_of_jobs(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.2)
    ex = RemoteExecutor(backend, LocalExecutor(1), remote_jobs=4)
    assert ex.jobs == 4
    run_actions(ex, [action(tmp_path) for _ in range(10)])
    assert backend.peak == 4


def test_stop_ends_actions_in_flight_and_refuses_the_rest(tmp_path: Path) -> None:
    backend = FakeBackend(delay=30)
    ex = RemoteExecutor(backend, LocalExecutor(1), remote_jobs=1)
    begun = time.monotonic()
    took = stop_in_flight(ex, [action(tmp_path) for _ in range(3)], lambda: ex.running == 1)
    assert took < 2 and time.monotonic() - begun < 10
    with pytest.raises(ActionStopped):
        run_action(ex, action(tmp_path))
