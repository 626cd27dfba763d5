"""The remote executor's logic, with a recording backend (the engine's part runs for real
in tests/test_remote_build.py): what goes out, what runs here and why, the circuit
breaker, strict mode, a remote compile error, the remote budget, and stopping."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metrale_orch.executor import Action, ActionStopped, LocalExecutor, RemoteForm
from metrale_orch.executor.offload import (
    BREAKER_FAILURES,
    RemoteExecutor,
    RemoteRun,
    RemoteUnavailable,
)
from metrale_orch.proc import ProcessError


class FakeBackend:
    """Records the forms it gets; answers with ``answer(form)`` (a run or an exception)."""

    endpoint = "grpc://fake:1"

    def __init__(self, answer: object = None, delay: float = 0.0) -> None:
        self.forms: list[RemoteForm] = []
        self.answer = answer
        self.delay = delay
        self.peak = 0
        self._now = 0
        self._lock = threading.Lock()

    def run(self, form: RemoteForm, *, timeout: float, cancel: threading.Event) -> RemoteRun:
        with self._lock:
            self.forms.append(form)
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            end = time.monotonic() + self.delay
            while time.monotonic() < end and not cancel.is_set():
                time.sleep(0.01)
            answer = self.answer
            if isinstance(answer, BaseException):
                raise answer
            if isinstance(answer, RemoteRun):
                return answer
            return RemoteRun(returncode=0, stdout="ok\n", stderr="", seconds=0.01)
        finally:
            with self._lock:
                self._now -= 1

    def close(self) -> None:
        pass


def form(tmp_path: Path, reason: str = "") -> RemoteForm:
    return RemoteForm(
        root=tmp_path,
        files={},
        cwd=".",
        argv=("/bin/true",),
        env={"PATH": "/usr/bin:/bin"},
        outputs={},
        platform={"OSFamily": "linux"},
        local_reason=reason,
    )


def action(tmp_path: Path, *, reason: str = "", remote: bool = True, owner: str = "t") -> Action:
    marker = tmp_path / "ran-here"
    return Action(
        argv=("/bin/sh", "-c", f"echo here >> {marker}"),
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        remote=form(tmp_path, reason) if remote else None,
        owner=owner,
        label=f"{owner} m",
    )


def ran_here(tmp_path: Path) -> int:
    marker = tmp_path / "ran-here"
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_a_form_goes_out_and_is_counted(tmp_path: Path) -> None:
    backend = FakeBackend()
    ex = RemoteExecutor(backend, LocalExecutor(1))
    done = ex.run(action(tmp_path))
    assert done.where == "remote" and done.stdout == "ok\n"
    assert len(backend.forms) == 1 and ran_here(tmp_path) == 0
    cached = RemoteRun(returncode=0, stdout="", stderr="", seconds=0.0, cached=True)
    backend.answer = cached
    assert ex.run(action(tmp_path)).where == "remote (action cache)"
    assert ex.counts("t").to_dict() == {"remote": 1, "action_cache": 1}
    assert ex.counts("t").to_dict() == {}  # taken


def test_what_cannot_go_out_runs_here_with_its_reason(tmp_path: Path) -> None:
    backend = FakeBackend()
    ex = RemoteExecutor(backend, LocalExecutor(1))
    assert ex.run(action(tmp_path, reason="CPATH names '/x'")).where == "local: CPATH names '/x'"
    assert ex.run(action(tmp_path, remote=False)).where == "local: no remote form"
    assert backend.forms == [] and ran_here(tmp_path) == 2
    assert ex.counts("t").to_dict() == {"local": {"CPATH names '/x'": 1, "no remote form": 1}}


def test_infrastructure_failure_runs_here_then_the_breaker_opens(tmp_path: Path) -> None:
    backend = FakeBackend(RemoteUnavailable("unreachable: grpc://fake:1 (connection refused)"))
    ex = RemoteExecutor(backend, LocalExecutor(1))
    for _ in range(BREAKER_FAILURES + 2):
        assert ex.run(action(tmp_path)).where.startswith("local: ")
    assert len(backend.forms) == BREAKER_FAILURES  # then no more calls to a dead endpoint
    assert ran_here(tmp_path) == BREAKER_FAILURES + 2
    local = ex.counts("t").local
    assert local == {"unreachable: grpc://fake:1 (connection refused)": BREAKER_FAILURES + 2}


def test_strict_makes_infrastructure_failures_module_failures(tmp_path: Path) -> None:
    backend = FakeBackend(RemoteUnavailable("no worker for platform OSFamily=linux"))
    ex = RemoteExecutor(backend, LocalExecutor(1), strict=True)
    with pytest.raises(ProcessError, match=r"no worker for platform.*remote_strict"):
        ex.run(action(tmp_path))
    assert ran_here(tmp_path) == 0


def test_a_remote_compile_error_is_a_compile_error_never_retried_here(tmp_path: Path) -> None:
    failed = RemoteRun(returncode=2, stdout="", stderr="k.cu(3): error: x\n", seconds=0.1)
    ex = RemoteExecutor(FakeBackend(failed), LocalExecutor(1))
    with pytest.raises(ProcessError) as err:
        ex.run(action(tmp_path))
    assert err.value.returncode == 2 and "error: x" in err.value.output
    assert ran_here(tmp_path) == 0


def test_remote_jobs_caps_actions_in_flight_independently_of_jobs(tmp_path: Path) -> None:
    backend = FakeBackend(delay=0.2)
    ex = RemoteExecutor(backend, LocalExecutor(1), remote_jobs=4)
    assert ex.jobs == 4
    with ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(lambda _: ex.run(action(tmp_path)), range(10)))
    assert backend.peak == 4


def test_stop_ends_actions_in_flight_and_refuses_the_rest(tmp_path: Path) -> None:
    backend = FakeBackend(delay=30)
    ex = RemoteExecutor(backend, LocalExecutor(1), remote_jobs=1)
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(ex.run, action(tmp_path)) for _ in range(3)]
        time.sleep(0.3)
        start = time.monotonic()
        ex.stop()
        for fut in futures:
            with pytest.raises(ActionStopped):
                fut.result(timeout=5)
    assert time.monotonic() - start < 2
    with pytest.raises(ActionStopped):
        ex.run(action(tmp_path))
