"""Helpers for the edit loop's tests: a ``metrale-orch watch`` process as a user runs it,
its cycle lines, and the comparison of a watched tree's artefacts with a clean build.

:func:`start_watch` runs ``python -m metrale_orch watch ARGS`` in a project (stdout and
stderr joined); :class:`Watch` reads its lines on a thread. :func:`clean_build` copies the
tree as it is now into a fresh directory and builds it there with the cache off;
:func:`artefacts` reads a build directory's installed files (each target's manifest
without the per-run ``outcome``) for a byte-for-byte comparison.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.project import FAKECC, doit

__all__ = [
    "SLOW_FAKECC",
    "Watch",
    "artefacts",
    "clean_build",
    "start_watch",
    "use_slow_fake_compiler",
]

#: The recording fake compiler, sleeping 60 s on a source that says ``SLOW``.
SLOW_FAKECC = FAKECC.replace(
    'delay = float(os.environ.get("FAKECC_DELAY", "0") or 0)',
    'delay = 60.0 if "SLOW" in text else float(os.environ.get("FAKECC_DELAY", "0") or 0)',
)
assert SLOW_FAKECC != FAKECC  # the fake compiler's text moved: follow it


def use_slow_fake_compiler(bin_dir: Path) -> None:
    """Replace the fake compiler in ``bin_dir`` by :data:`SLOW_FAKECC`."""
    script = bin_dir / "fakecc"
    script.write_text(f"#!{sys.executable}\n" + SLOW_FAKECC)
    script.chmod(0o755)


class Watch:
    """A running ``metrale-orch watch`` and the lines it printed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        out = self.proc.stdout
        assert out is not None
        with out:
            for line in out:
                self.lines.put(line.rstrip("\n"))

    def cycle(self, timeout: float = 60) -> list[str]:
        """The next cycle's lines (its ``[HH:MM:SS] …`` line and the indented ones after
        it that have arrived within a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._next(deadline - time.monotonic())
            if line.startswith("["):
                found = [line]
                while True:
                    try:
                        more = self.lines.get(timeout=0.3)
                    except queue.Empty:
                        return found
                    self.seen.append(more)
                    if not more.startswith("    "):
                        self.lines.put(more)  # put back: the order of one reader is kept
                        return found
                    found.append(more)

    def quiet(self, seconds: float) -> list[str]:
        """The lines printed within ``seconds`` (expected: none)."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got.append(self.lines.get(timeout=left))
            except queue.Empty:
                break
        self.seen.extend(got)
        return got

    def settle(self, build_dir: Path, quiet_s: float = 0.7, timeout: float = 120) -> list[str]:
        """Wait until watch is idle: nothing printed for ``quiet_s`` seconds and no cycle
        holding the build lock; the lines printed meanwhile."""
        got: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.quiet(quiet_s)
            got.extend(lines)
            if not lines and _lock_free(build_dir):
                return got
        raise AssertionError(f"watch never settled; printed so far: {self.seen}")

    def _next(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.01, timeout))
        except queue.Empty:
            raise AssertionError(f"no cycle line; printed so far: {self.seen}") from None
        self.seen.append(line)
        return line

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30) -> int:
        """Send ``signum``; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        status = self.proc.wait(timeout)
        self._reader.join(5)
        return status

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(5)


def _lock_free(build_dir: Path) -> bool:
    """Whether no build holds ``build_dir``'s build lock (taken and let go at once)."""
    try:
        fd = os.open(build_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing lets the lock go
    return True


def start_watch(root: Path, args: Sequence[str], env: Mapping[str, str]) -> Watch:
    """Start ``python -m metrale_orch watch ARGS`` in ``root``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "metrale_orch", "watch", *args],
        cwd=root,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Watch(proc)


def clean_build(root: Path, into: Path, pattern: str, env: Mapping[str, str]) -> Path:
    """Build a copy of ``root``'s tree as it is now in ``into`` (made afresh), cache off;
    returns its build directory."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    for name in ("kernels", "toolchains"):
        if (root / name).is_dir():
            shutil.copytree(root / name, into / name, symlinks=True)
    for name in ("dodo.py", "pyproject.toml"):
        if (root / name).is_file():
            shutil.copy2(root / name, into / name)
    clean_env = {**env, "METRALE_ORCH_CACHE_MODE": "off"}
    clean_env.pop("FAKECC_LOG", None)
    run = doit(into, [f"build:{pattern}"], clean_env)
    assert run.returncode == 0, run.text
    return into / "build"


def artefacts(build_dir: Path) -> dict[str, bytes]:
    """Every installed file of every target under ``build_dir`` (build-relative path ->
    bytes; a manifest without its modules' ``outcome``, which says how a run obtained
    them)."""
    found: dict[str, bytes] = {}
    for manifest in sorted(build_dir.glob("*/*/*/manifest.json")):
        target_dir = manifest.parent
        for path in sorted(target_dir.iterdir()):
            rel = path.relative_to(build_dir).as_posix()
            if path.name == "manifest.json":
                doc = json.loads(path.read_text())
                for module in doc.get("modules", []):
                    module.pop("outcome", None)
                found[rel] = json.dumps(doc, sort_keys=True).encode()
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = b"<" + os.fsencode(path.name) + b" is no file>"
    return found
