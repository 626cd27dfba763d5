"""Ctrl-C with 500 remote actions in flight (issue 45): the build stops at once with 130,
every Execute stream is cancelled at the engine, no compiler ran here, and nothing
partial is installed or left in the build's temporary directory."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.support.project import (
    FILES,
    _kernel,
    fake_compiles,
    make_project,
    project_env,
    start_doit,
    use_fake_compiler,
)
from tests.support.reapi_standin import standin_engine

IN_FLIGHT = 500


def test_ctrl_c_with_500_remote_actions_in_flight_leaves_nothing_behind(tmp_path: Path) -> None:
    files = dict(FILES)
    for i in range(IN_FLIGHT):
        files[f"kernels/hopper/qwen/w8/k{i:03}.cu"] = _kernel(f"k{i:03}")
    root = make_project(tmp_path / "proj", files)
    use_fake_compiler(root, tmp_path / "bin")
    env = project_env(tmp_path, fake_bin=tmp_path / "bin")
    env.update(
        METRALE_ORCH_CACHE_MODE="off",
        METRALE_ORCH_REMOTE_STRICT="1",
        METRALE_ORCH_REMOTE_JOBS=str(IN_FLIGHT + 24),
    )
    with standin_engine(workers=IN_FLIGHT + 24, seconds=300) as engine:
        env["METRALE_ORCH_REMOTE_EXECUTOR"] = engine.url
        proc = start_doit(root, ["build:hopper/qwen/w8"], env)
        try:
            deadline = time.monotonic() + 240
            while engine.running < IN_FLIGHT and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()[0]
                time.sleep(0.1)
            in_flight = engine.running
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            took = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        deadline = time.monotonic() + 10
        while engine.running and time.monotonic() < deadline:
            time.sleep(0.05)
        left = engine.running
    assert in_flight >= IN_FLIGHT, in_flight
    assert proc.returncode == 130, out
    assert took < 15, f"stopping took {took:.1f} s"
    assert "Traceback" not in out, out
    assert left == 0, f"{left} streams still running at the engine"
    assert fake_compiles(tmp_path) == []  # nothing fell back to a compiler here
    tmp = root / "build" / ".tmp"
    assert not tmp.exists() or not list(tmp.rglob("*.ptx")), list(tmp.rglob("*"))
    assert not list((root / "build").glob("*/*/*/*.ptx")), "a partial artefact was installed"
