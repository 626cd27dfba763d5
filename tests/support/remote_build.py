"""Helpers the tests of remote build share (the in-process ones in ``tests/unit/remote/``,
the ones that start processes in ``tests/scenarios/remote/``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
