"""The remote executor's logic, with a recording backend (the engine's part runs for real
in tests/scenarios/remote/test_remote_build.py): what goes out, what runs here and why, the circuit
breaker, strict mode, a remote compile error, the remote budget, and stopping.

These are the tests of this topic that start processes; the others are in
``tests/unit/remote/test_remote_executor.py``.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.executor import LocalExecutor
from metrale_orch.executor.offload import (
    BREAKER_FAILURES,
    RemoteExecutor,
    RemoteUnavailable,
)
from tests.support.executor import run_action
from tests.support.remote import FakeBackend, action, ran_here


def test_what_cannot_go_out_runs_here_with_its_reason(tmp_path: Path) -> None:
    backend = FakeBackend()
    ex = RemoteExecutor(backend, LocalExecutor(1))
    done = run_action(ex, action(tmp_path, reason="CPATH names '/x'"))
    assert done.where == "local: CPATH names '/x'"
    assert run_action(ex, action(tmp_path, remote=False)).where == "local: no remote form"
    assert backend.forms == [] and ran_here(tmp_path) == 2
    assert ex.counts("t").to_dict() == {"local": {"CPATH names '/x'": 1, "no remote form": 1}}


def test_infrastructure_failure_runs_here_then_the_breaker_opens(tmp_path: Path) -> None:
    backend = FakeBackend(RemoteUnavailable("unreachable: grpc://fake:1 (connection refused)"))
    ex = RemoteExecutor(backend, LocalExecutor(1))
    for _ in range(BREAKER_FAILURES + 2):
        assert run_action(ex, action(tmp_path)).where.startswith("local: ")
    assert len(backend.forms) == BREAKER_FAILURES  # then no more calls to a dead endpoint
    assert ran_here(tmp_path) == BREAKER_FAILURES + 2
    local = ex.counts("t").local
    assert local == {"unreachable: grpc://fake:1 (connection refused)": BREAKER_FAILURES + 2}
