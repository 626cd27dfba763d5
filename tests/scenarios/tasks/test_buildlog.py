"""The shared build log: written by a listener thread, every line once, none lost."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from metrale_orch.paths import LOG_NAME
from metrale_orch.tasks.buildlog import PACKAGE, BuildLog, _BuildLogHandler

#: The build log as one run of this process writes it.
LOG = BuildLog()


@pytest.fixture
def build_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "build"
    pkg = logging.getLogger(PACKAGE)
    for handler in list(pkg.handlers):
        if isinstance(handler, _BuildLogHandler) and handler.path.parent == tmp_path / "build":
            pkg.removeHandler(handler)
            handler.stop()
            handler.writer.close()


def _lines(build_dir: Path) -> list[str]:
    return (build_dir / LOG_NAME).read_text(encoding="utf-8").splitlines()


def test_threads_configuring_at_once_write_each_line_once(build_dir: Path) -> None:
    # doit's target threads all configure the log as their first build step: one handler,
    # and every record written exactly once by the time the action returns.
    start = threading.Barrier(16)

    def work(n: int) -> None:
        start.wait()
        log = LOG.open(build_dir, max_bytes=0, backups=0)
        for i in range(40):
            log.getChild("build").info("thread %d line %d", n, i)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    LOG.flush()
    ours = [h for h in logging.getLogger(PACKAGE).handlers if isinstance(h, _BuildLogHandler)]
    assert len([h for h in ours if h.path.parent == build_dir.resolve()]) == 1
    lines = [line.split(": ", 1)[1] for line in _lines(build_dir)]
    assert sorted(lines) == sorted(f"thread {n} line {i}" for n in range(16) for i in range(40))


def test_a_forked_worker_writes_its_own_lines(build_dir: Path) -> None:
    # doit's -P process workers are forked: the parent's handler comes along without its
    # listener thread; the child's records still reach the file, with the child's pid.
    log = LOG.open(build_dir, max_bytes=0, backups=0)
    log.info("parent before")
    LOG.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            child = LOG.open(build_dir, max_bytes=0, backups=0)
            child.info("child line")
            LOG.flush()
        finally:
            os._exit(0)  # as multiprocessing's workers end: no atexit
    os.waitpid(pid, 0)
    log.info("parent after")
    LOG.flush()
    lines = _lines(build_dir)
    assert [line.split(": ", 1)[1] for line in lines] == [
        "parent before",
        "child line",
        "parent after",
    ]
    assert f" {pid} INFO " in lines[1]


def test_lines_logged_just_before_exit_are_written(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from metrale_orch.tasks.buildlog import BuildLog\n"
        "log = BuildLog().open(Path(sys.argv[1]), max_bytes=0, backups=0)\n"
        "for i in range(500): log.info('line %d', i)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "b")], check=True, timeout=60)
    lines = (tmp_path / "b" / LOG_NAME).read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [f"line {i}" for i in range(500)]


def test_a_second_build_directory_replaces_the_first(tmp_path: Path, build_dir: Path) -> None:
    # One process building two projects (a long-lived process, this suite): each record
    # goes to the log of the project being built, and the first project's handler and its
    # listener thread are gone once the second is configured.
    first = tmp_path / "first" / "build"
    log = LOG.open(first, max_bytes=0, backups=0)
    log.info("for the first")
    listeners_before = threading.active_count()
    log = LOG.open(build_dir, max_bytes=0, backups=0)
    log.info("for the second")
    LOG.flush()
    ours = [h for h in logging.getLogger(PACKAGE).handlers if isinstance(h, _BuildLogHandler)]
    assert [h.path for h in ours] == [(build_dir / LOG_NAME).resolve()]
    assert threading.active_count() == listeners_before  # one listener stopped, one started
    assert [line.split(": ", 1)[1] for line in _lines(first)] == ["for the first"]
    assert [line.split(": ", 1)[1] for line in _lines(build_dir)] == ["for the second"]
