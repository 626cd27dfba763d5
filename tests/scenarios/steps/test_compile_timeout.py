"""``compile_timeout`` (issue 35): one setting for how long a compile may run, here and as
the remote Action's ``timeout``; a server that refuses the timeout is reported once,
naming the setting and the server's answer.

Real doit runs on the small project with the recording fake compiler (told to sleep), and
the scriptable REAPI server in the test process for a server with a lower maximum.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.digest import Digest
from tests.support.project import doit, fake_compiles, make_project, project_env, use_fake_compiler
from tests.support.reapi_fake import FakeRemote, fake_remote

TARGET = "hopper/qwen/w8"


def _project(tmp_path: Path, **env: str) -> tuple[Path, dict[str, str]]:
    root = make_project(tmp_path / "proj")
    use_fake_compiler(root, tmp_path / "bin")
    base = project_env(tmp_path, fake_bin=tmp_path / "bin")
    base["METRALE_ORCH_CACHE_MODE"] = "off"
    base.update(env)
    return root, base


def test_a_compile_past_compile_timeout_is_stopped_and_named(tmp_path: Path) -> None:
    root, env = _project(tmp_path, FAKECC_DELAY="30", METRALE_ORCH_COMPILE_TIMEOUT="1")
    run = doit(root, [f"build:{TARGET}"], env, timeout=60)
    assert run.returncode != 0, run.text
    assert "timed out after 1 s" in run.text, run.text
    assert fake_compiles(tmp_path) == []  # stopped before it wrote anything


def test_a_compile_within_compile_timeout_builds(tmp_path: Path) -> None:
    root, env = _project(tmp_path, FAKECC_DELAY="0.2", METRALE_ORCH_COMPILE_TIMEOUT="30")
    run = doit(root, [f"build:{TARGET}"], env, timeout=60)
    assert run.returncode == 0, run.text
    assert fake_compiles(tmp_path) == ["sm_90a add.cu", "sm_90a mul.cu"]


def _limited(fake: FakeRemote, limit: float, seen: list[float]) -> None:
    """Make ``fake`` a server whose maximum execution timeout is ``limit`` seconds: it
    refuses an Action with a longer timeout (as BuildGrid does), and answers any other
    with UNAVAILABLE (no worker here), so the build runs it locally."""

    def script(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        digest = Digest(request.action_digest.hash, request.action_digest.size_bytes)
        action = re_pb2.Action.FromString(fake.blobs[digest])
        timeout = action.timeout.seconds + action.timeout.nanos / 1e9
        seen.append(timeout)
        if timeout > limit:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Action timeout {timeout:g}s exceeds the maximum execution timeout {limit:g}s",
            )
        context.abort(grpc.StatusCode.UNAVAILABLE, "no worker here")
        yield from ()

    fake.execute = script


def _remote_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("remote: ")]


def test_a_server_refusing_the_timeout_is_reported_once_naming_the_setting(
    tmp_path: Path,
) -> None:
    seen: list[float] = []
    with fake_remote() as fake:
        _limited(fake, 600, seen)
        root, env = _project(tmp_path, METRALE_ORCH_REMOTE_EXECUTOR=fake.url)
        run = doit(root, [f"build:{TARGET}"], env, timeout=120)
    assert run.returncode == 0, run.text  # not strict: compiled here
    assert seen and set(seen) == {900.0}, seen
    said = [line for line in run.text.splitlines() if "compile_timeout" in line]
    assert len(said) == 1, run.text
    assert "900 s" in said[0] and "exceeds the maximum execution timeout 600s" in said[0]


def test_compile_timeout_is_the_remote_actions_timeout(tmp_path: Path) -> None:
    seen: list[float] = []
    with fake_remote() as fake:
        _limited(fake, 600, seen)
        root, env = _project(
            tmp_path, METRALE_ORCH_REMOTE_EXECUTOR=fake.url, METRALE_ORCH_COMPILE_TIMEOUT="300"
        )
        run = doit(root, [f"build:{TARGET}"], env, timeout=120)
    assert run.returncode == 0, run.text
    assert seen and set(seen) == {300.0}, seen
    assert "compile_timeout" not in run.text


def test_a_timeout_no_wait_can_take_is_refused_in_one_line(tmp_path: Path) -> None:
    root, env = _project(tmp_path)
    for value in ("inf", "1e12", "nan", "0"):
        env["METRALE_ORCH_COMPILE_TIMEOUT"] = value
        run = doit(root, [f"build:{TARGET}"], env, timeout=60)
        assert run.returncode != 0, run.text
        assert "METRALE_ORCH_COMPILE_TIMEOUT" in run.text and "compile_timeout" in run.text
        assert "Traceback" not in run.text, run.text


def test_a_compile_whose_daemon_keeps_its_output_open_still_stops(tmp_path: Path) -> None:
    """A compiler that starts a process in a session of its own (a cache daemon) that holds
    its output open: past compile_timeout the compile fails within seconds, not when the
    daemon exits."""
    root, env = _project(tmp_path, METRALE_ORCH_COMPILE_TIMEOUT="1")
    fake = tmp_path / "bin" / "fakecc"
    real = fake.read_text()
    marker = tmp_path / "daemon-done"
    fake.write_text(
        real.replace(
            "import time\n",
            "import time, subprocess\n"
            f"subprocess.Popen(['setsid', 'sh', '-c', 'sleep 60; touch {marker}'])\n"
            "time.sleep(30)\n",
            1,
        )
    )
    try:
        run = doit(root, [f"build:{TARGET}"], env, timeout=120)
        assert run.returncode != 0 and "timed out after 1 s" in run.text, run.text
        assert not marker.exists()  # the build ended while the daemon still held the pipes
    finally:
        subprocess.run(["pkill", "-f", f"touch {marker}"], check=False)
