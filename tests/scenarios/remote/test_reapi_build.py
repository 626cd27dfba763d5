"""Remote execution for real: doit builds on a BuildGrid 0.4.4 engine whose workers (our test
workers on the Bots API) run real nvcc in a fresh directory holding only the input root.

- A target built remotely is byte-identical to a local build, every compile ran on a worker
  (the workers' events), and the summary says so; a second checkout's build is answered by
  the action cache.
- Faults are survived with nothing wrong installed: a server down at the start and one
  killed mid-build (the rest runs here, counted), a worker killed mid-action (BuildGrid
  requeues it), no worker for the platform (here, or a failure with ``remote_strict``), a
  corrupt output blob in the CAS (refused, compiled here), an action past its timeout (a
  compile error, as here).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash

from metrale_orch.executor import RemoteForm
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote.client import AsyncRemoteClient
from metrale_orch.steps.remote_form import platform_properties
from metrale_orch.toolchain.definitions import builtin_toolchains
from metrale_orch.toolchain.probe import find_toolchain
from tests.support.reapi import ReapiStack, ReapiWorker
from tests.support.reapi_fake import run_once
from tests.support.remote import checkout

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

TARGET = "b300/qwen3-8b/bf16"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    returncode: int
    text: str
    seconds: float


def _platform() -> dict[str, str]:
    """What a worker must offer for this machine's nvcc (as ``remote platform`` prints)."""
    found = find_toolchain(builtin_toolchains()["nvcc"], os.environ, arch="sm_100")
    return platform_properties("nvcc", found.identity)


def offering(platform: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    return {k: (v,) for k, v in platform.items()}


def script_form(tmp_path: Path, name: str, text: str, *, staged: str | None = None) -> RemoteForm:
    """A form running ``/bin/sh <name>`` with ``text`` written there; ``staged`` is the text
    the stage's hash says it holds (default: ``text``)."""
    (tmp_path / name).write_text(text)
    return RemoteForm(
        root=tmp_path,
        files={name: xxhash.xxh3_128_hexdigest((text if staged is None else staged).encode())},
        cwd="",
        argv=("/bin/sh", name),
        env={"PATH": "/usr/bin:/bin"},
        outputs={},
        platform=_platform(),
    )


def build(root: Path, **settings: str) -> Run:
    """``doit build:TARGET`` in ``root`` with the cache off (every compile runs) and
    ``settings`` as METRALE_ORCH_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_", "NVCC_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    env["METRALE_ORCH_LOCAL_CACHE"] = str(root / ".cache")
    env["METRALE_ORCH_CACHE_MODE"] = "off"
    env.update({f"METRALE_ORCH_{k.upper()}": v for k, v in settings.items()})
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "doit", f"build:{TARGET}"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return Run(
        returncode=proc.returncode,
        text=proc.stdout + proc.stderr,
        seconds=time.perf_counter() - start,
    )


def outputs(root: Path) -> dict[str, bytes]:
    out = root / "build" / TARGET
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def module_count(root: Path) -> int:
    doc = json.loads((root / "build" / TARGET / "manifest.json").read_text())
    return len(doc["modules"])


def remote_line(run: Run) -> str:
    lines = [ln for ln in run.text.splitlines() if ln.startswith("remote: ")]
    assert len(lines) == 1, run.text
    return lines[0]


def executed(workers: list[ReapiWorker]) -> int:
    return sum(1 for w in workers for e in w.events() if e["event"] == "exec")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target built here, cache off: what every remote build must equal."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    root = checkout(tmp_path_factory.mktemp("reapi-local"), "local")
    run = build(root, jobs="2")
    assert run.returncode == 0, run.text
    return root


@pytest.fixture(scope="module")
def farm(reapi_stack: ReapiStack) -> Iterator[tuple[ReapiStack, list[ReapiWorker]]]:
    """The session stack with two workers offering this machine's nvcc platform."""
    props = offering(_platform())
    workers = [reapi_stack.start_worker(props) for _ in range(2)]
    try:
        yield reapi_stack, workers
    finally:
        for worker in workers:
            worker.stop()


def settings(stack: ReapiStack, **extra: str) -> dict[str, str]:
    return {"remote_executor": stack.url, "remote_instance": stack.instance, **extra}


def test_built_remotely_byte_identical_then_from_the_action_cache(
    farm: tuple[ReapiStack, list[ReapiWorker]], local: Path, tmp_path: Path
) -> None:
    stack, workers = farm
    before = executed(workers)
    root = checkout(tmp_path, "a")
    run = build(root, **settings(stack, remote_strict="true"))
    assert run.returncode == 0, run.text
    modules = module_count(local)
    assert remote_line(run) == f"remote: {modules} ran remotely", run.text
    assert executed(workers) - before == modules  # every compile ran on a worker
    assert outputs(root) == outputs(local)
    stats = json.loads((root / "build" / "cache-stats.json").read_text())
    assert (stats["remote_executed"], stats["action_cache_hits"], stats["ran_here"]) == (
        modules,
        0,
        0,
    )
    events = json.loads((root / "build" / "profile.json").read_text())["traceEvents"]
    compiles = [e for e in events if e.get("cat") == "compile"]
    assert len(compiles) == modules and {e["args"]["where"] for e in compiles} == {"remote"}
    stages = {e["args"]["stage"] for e in events if e.get("cat") == "remote"}
    assert {"queued", "executing", "uploading inputs"} <= stages, stages

    again = checkout(tmp_path, "b")  # another checkout, nothing cached here
    before = executed(workers)
    run = build(again, **settings(stack))
    assert run.returncode == 0, run.text
    line = remote_line(run)
    assert line == f"remote: {modules} ran remotely ({modules} from the action cache)", line
    assert executed(workers) == before
    assert outputs(again) == outputs(local)
    stats = json.loads((again / "build" / "cache-stats.json").read_text())
    assert stats["action_cache_hits"] == modules and stats["remote_executed"] == 0


def test_server_down_at_the_start_builds_here_counted(
    reapi_stack_factory: Callable[..., ReapiStack], local: Path, tmp_path: Path
) -> None:
    stack = reapi_stack_factory(workers=0)
    stack.stop_server()
    root = checkout(tmp_path, "down")
    run = build(root, **settings(stack))
    assert run.returncode == 0, run.text
    line = remote_line(run)
    assert line.startswith("remote: 0 ran remotely, ") and "ran here: " in line, line
    assert "unreachable" in line or "remote off" in line, line
    assert outputs(root) == outputs(local)
    strict = build(checkout(tmp_path, "strict"), **settings(stack, remote_strict="true"))
    assert strict.returncode == 1, strict.text
    assert "remote_strict" in strict.text


def test_no_worker_for_the_platform(
    reapi_stack_factory: Callable[..., ReapiStack], local: Path, tmp_path: Path
) -> None:
    stack = reapi_stack_factory(workers=1)  # offers OSFamily and ISA, not our toolchain
    root = checkout(tmp_path, "nobody")
    run = build(root, **settings(stack, remote_queue_timeout="1.5"))
    assert run.returncode == 0, run.text
    line = remote_line(run)
    assert "no worker for platform" in line and "metrale-toolchain=nvcc" in line, line
    assert outputs(root) == outputs(local)


def test_server_killed_mid_build_the_rest_runs_here(
    reapi_stack_factory: Callable[..., ReapiStack], local: Path, tmp_path: Path
) -> None:
    stack = reapi_stack_factory(workers=0)
    worker = stack.start_worker(offering(_platform()))
    killer = threading.Thread(
        target=lambda: (worker.wait_event("exec", timeout=120), stack.stop_server())
    )
    killer.start()
    root = checkout(tmp_path, "crash")
    run = build(root, **settings(stack, jobs="1"))
    killer.join()
    assert run.returncode == 0, run.text
    assert "ran here: " in remote_line(run)
    assert outputs(root) == outputs(local)


def test_worker_killed_mid_action_is_requeued(
    reapi_stack_factory: Callable[..., ReapiStack], local: Path, tmp_path: Path
) -> None:
    stack = reapi_stack_factory(workers=0)
    props = offering(_platform())
    first = stack.start_worker(props)
    killer = threading.Thread(target=lambda: (first.wait_event("exec", timeout=120), first.kill()))
    killer.start()
    second = stack.start_worker(props)
    root = checkout(tmp_path, "lost")
    run = build(root, **settings(stack, remote_strict="true"))
    killer.join()
    second.stop()
    assert run.returncode == 0, run.text
    assert not first.alive()
    modules = module_count(local)
    assert remote_line(run) == f"remote: {modules} ran remotely", run.text
    assert outputs(root) == outputs(local)


def test_corrupt_output_blob_is_refused_and_compiled_here(
    farm: tuple[ReapiStack, list[ReapiWorker]], local: Path, tmp_path: Path
) -> None:
    stack, _ = farm
    root = checkout(tmp_path, "first")
    assert build(root, **settings(stack, cache_namespace="corrupt")).returncode == 0
    # Every artefact's blob in the CAS is damaged (same size, other bytes).
    damaged = 0
    for name, data in outputs(local).items():
        digest = hashlib.sha256(data).hexdigest()
        if name.endswith(".ptx") and stack.blob_path(digest).is_file():
            stack.corrupt_blob(digest)
            damaged += 1
    assert damaged == module_count(local)
    again = checkout(tmp_path, "again")
    run = build(again, **settings(stack))
    assert run.returncode == 0, run.text
    line = remote_line(run)
    assert "ran here: " in line and "bad result" in line, line
    assert outputs(again) == outputs(local)


def test_an_action_past_its_timeout_is_a_compile_error(
    farm: tuple[ReapiStack, list[ReapiWorker]], tmp_path: Path
) -> None:
    stack, _ = farm
    backend = ReapiBackend(AsyncRemoteClient(stack.url, instance=stack.instance, timeout=30))
    form = script_form(tmp_path, "slow.sh", "sleep 30\n")
    start = time.monotonic()
    run = run_once(backend, form, timeout=1.0)
    assert run.returncode != 0 and "timeout" in run.stderr
    assert time.monotonic() - start < 20


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METRALE_", "NVCC_"))}
    return subprocess.run(
        [sys.executable, "-m", "metrale_orch", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_remote_platform_prints_what_a_worker_offers(tmp_path: Path) -> None:
    root = checkout(tmp_path, "p")
    run = _cli(root, "remote", "platform", "b300")
    assert run.returncode == 0, run.stderr
    keys = [line.split("=", 1)[0] for line in run.stdout.splitlines()]
    assert keys == sorted(keys)
    assert dict(line.split("=", 1) for line in run.stdout.splitlines()) == _platform()
    bad = _cli(root, "remote", "platform", "nosuch")
    assert bad.returncode == 2 and "no hardware 'nosuch'" in bad.stderr, bad.stderr


def test_remote_check_says_where_it_ran_and_what_is_wrong(
    farm: tuple[ReapiStack, list[ReapiWorker]], reapi_stack_factory: Callable[..., ReapiStack],
    tmp_path: Path,
) -> None:  # fmt: skip
    stack, workers = farm
    root = checkout(tmp_path, "c")
    sets = ["--set", f"remote_executor={stack.url}", "--set", f"remote_instance={stack.instance}"]
    run = _cli(root, *sets, "remote", "check", "b300")
    assert run.returncode == 0, run.stdout + run.stderr
    names = {w.name for w in workers}
    assert " ok: b300's nvcc compile ran on " in run.stdout
    assert run.stdout.split(" ran on ")[1].split()[0] in names, run.stdout
    assert _cli(root, "remote", "check").returncode == 2  # remote_executor not set
    nobody = reapi_stack_factory(workers=0)
    sets = ["--set", f"remote_executor={nobody.url}", "--set", "remote_queue_timeout=1"]
    run = _cli(root, *sets, "--set", f"remote_instance={nobody.instance}", "remote", "check")
    assert run.returncode == 1 and "FAILED: no worker for platform" in run.stderr, run.stderr
    nobody.stop_server()
    run = _cli(root, *sets, "--set", f"remote_instance={nobody.instance}", "remote", "check")
    assert run.returncode == 1 and "FAILED: unreachable" in run.stderr, run.stderr


def test_stop_ends_remote_actions_in_flight_at_once(
    farm: tuple[ReapiStack, list[ReapiWorker]], tmp_path: Path
) -> None:
    """Ctrl-C with remote compiles in flight: the channel closes, every action ends as
    stopped at once (not after its timeout), and nothing is run here instead."""
    from metrale_orch.executor import Action, LocalExecutor
    from metrale_orch.executor.offload import RemoteExecutor
    from tests.support.executor import stop_in_flight

    stack, workers = farm
    form = script_form(tmp_path, "slow.sh", "sleep 30\n")
    backend = ReapiBackend(AsyncRemoteClient(stack.url, instance=stack.instance, timeout=30))
    ex = RemoteExecutor(backend, LocalExecutor(1))
    here = tmp_path / "ran-here"
    action = Action(argv=("/bin/sh", "-c", f"touch {here}"), cwd=tmp_path, remote=form, timeout=600)
    before = executed(workers)
    took = stop_in_flight(ex, [action, action], lambda: executed(workers) - before >= 1)
    assert took < 5
    assert not here.exists()


def test_a_file_changed_since_staging_is_never_sent(
    farm: tuple[ReapiStack, list[ReapiWorker]], tmp_path: Path
) -> None:
    """The input root's digests come from the bytes on disk and must match what was staged
    (the stage's xxh3): other bytes are never sent under the staged file's identity."""
    from metrale_orch.executor.offload import RemoteUnavailable

    stack, _ = farm
    form = script_form(tmp_path, "k.sh", "# edited after staging\n", staged="# as staged\n")
    backend = ReapiBackend(AsyncRemoteClient(stack.url, instance=stack.instance, timeout=30))
    with pytest.raises(RemoteUnavailable, match="changed since it was staged"):
        run_once(backend, form, timeout=10)
