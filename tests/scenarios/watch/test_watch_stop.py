"""Ctrl-C or SIGTERM while a cycle compiles: watch stops the compiler, leaves the last
good artefact installed (no partial one), keeps what finished, and exits 130 or 143."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.project import doit
from tests.support.watch import artefacts, start_watch, use_slow_fake_compiler

MUL = "kernels/hopper/qwen/w8/mul.cu"


def _compiler_started(times: Path, source: str, timeout: float = 30) -> int:
    """The pid of the fake compiler once it started compiling ``source``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if times.exists():
            for line in times.read_text().splitlines():
                word, _ns, pid, name = line.split()
                if word == "start" and name == source:
                    return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"{source} never started compiling")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/status").read_text().count("State:\tZ")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_compile_stops_it_cleanly(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, signum: int, status: int
) -> None:
    root, env = fake_project
    use_slow_fake_compiler(tmp_path / "bin")
    times = tmp_path / "times.log"
    watch = start_watch(root, ["hopper/*"], {**env, "FAKECC_TIMES": str(times)})
    try:
        assert "hopper/qwen/w8 built" in watch.cycle()[0]
        times.unlink()  # the first build's compiles are over
        before = artefacts(root / "build")
        mul = root / MUL
        mul.write_text(mul.read_text() + "// SLOW\n")
        pid = _compiler_started(times, "mul.cu")
        watch.stop(signum)
    finally:
        watch.kill()
    assert watch.proc.returncode == status, watch.seen
    said = watch.quiet(0.1)
    cycles = [line for line in said if line.startswith("[")]
    assert len(cycles) == 1 and "mul.cu changed: stopped; " in cycles[0], said
    assert said[-1] == "interrupted; 0 targets finished and kept", said
    assert not _alive(pid), "the compiler outlived watch"
    assert artefacts(root / "build") == before  # no partial artefact, nothing undone
    target_dir = root / "build/hopper/qwen/w8"
    assert sorted(p.name for p in target_dir.iterdir()) == sorted(
        k.rsplit("/", 1)[1] for k in before if k.startswith("hopper/qwen/w8/")
    )
    # The edit is still to build: doit sees it (and the lock is free).
    mul.write_text(mul.read_text().replace("// SLOW\n", "// quick\n"))
    run = doit(root, ["build:hopper/*"], env, timeout=60)
    assert run.returncode == 0 and "1 built" in run.out, run.text
