"""Helpers the tests of remote executor share (the in-process ones in
``tests/unit/remote/``, the ones that start processes in ``tests/scenarios/remote/``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from metrale_orch.executor import Action, RemoteForm
from metrale_orch.executor.offload import (
    RemoteRun,
)


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
