"""Helpers the tests of the remote area share, the in-process ones (``tests/unit/remote/``) and
the ones that start processes (``tests/scenarios/remote/``) alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrale_orch.executor import Action, RemoteForm
from metrale_orch.executor.offload import RemoteRun
from metrale_orch.remote import InputFile
from tests.support import REPO

TARGET = "b300/qwen3-8b/bf16"


DODO = "from metrale_orch.dodo import *  # noqa: F403\n"


# One write per call: a probe's commands run at once, and lines written piecewise by
# several wrappers interleave in the log.
WRAPPER = """#!/bin/sh
line="$PWD"; for a in "$@"; do line="$line $a"; done
printf '%s\\n' "$line" >> {log}
exec {real} "$@"
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    returncode: int
    text: str
    seconds: float
    #: The nvcc invocations of this run (cwd then argv, one per line).
    nvcc: tuple[str, ...]

    @property
    def compiles(self) -> list[str]:
        """Invocations that are not probes (``--version``, ``--dryrun``)."""
        return [
            line
            for line in self.nvcc
            if " --version" not in f"{line} " and " --dryrun " not in f"{line} "
        ]


def checkout(tmp: Path, name: str) -> Path:
    """A new checkout of the sample tree (``kernels/`` + the one-line dodo.py)."""
    root = tmp / name
    shutil.copytree(REPO / "kernels", root / "kernels")
    (root / "dodo.py").write_text(DODO)
    return root


def build(root: Path, env: Mapping[str, str], log: Path) -> Run:
    """``python -m doit build:TARGET`` in ``root``; the nvcc calls it made."""
    log.write_text("")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", f"build:{TARGET}"],
        cwd=root,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    seconds = time.perf_counter() - t0
    return Run(
        returncode=proc.returncode,
        text=proc.stdout + proc.stderr,
        seconds=seconds,
        nvcc=tuple(line for line in log.read_text().splitlines() if line),
    )


def manifest(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "build" / TARGET / "manifest.json").read_text())
    return doc


def outputs(root: Path) -> dict[str, bytes]:
    """Every file the build installed for the target except the manifest."""
    out_dir = root / "build" / TARGET
    return {
        p.name: p.read_bytes()
        for p in sorted(out_dir.iterdir())
        if p.is_file() and p.name != "manifest.json"
    }


def cache_stats(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "build" / "cache-stats.json").read_text())
    return doc


def logging_nvcc(tmp: Path, real: str) -> tuple[Path, dict[str, str]]:
    """(log, environment): an ``nvcc`` first on PATH that logs each call to ``log`` and
    runs ``real``; no METRALE_*/NVCC_* setting of this machine leaks in."""
    bindir = tmp / "bin"
    bindir.mkdir()
    log = tmp / "nvcc.log"
    wrapper = bindir / "nvcc"
    wrapper.write_text(WRAPPER.format(log=log, real=Path(real).resolve()))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_", "NVCC_"))}
    path = [str(bindir), str(Path(sys.executable).parent), base.get("PATH", "")]
    base["PATH"] = os.pathsep.join(path)
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    return log, base


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

    async def run(
        self,
        form: RemoteForm,
        *,
        timeout: float,
        started: Callable[[float], None] | None = None,
    ) -> RemoteRun:
        with self._lock:
            self.forms.append(form)
            self._now += 1
            self.peak = max(self.peak, self._now)
        try:
            await asyncio.sleep(self.delay)  # cancelled when the build stops
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


SAMPLE = {
    "kernels/gemv.cu": b"__global__ void gemv() {}\n",
    "kernels/include/tile.cuh": b"#pragma once\n",
    "include/common.h": b"#define N 4\n",
    "build.sh": InputFile(b"#!/bin/sh\nexit 0\n", executable=True),
    "z": b"",
}
