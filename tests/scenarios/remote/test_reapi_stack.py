"""The REAPI test stack itself (issue 20): BuildGrid 0.4.4 + PostgreSQL + our Bots-API worker.

Driven with the stack's small probe client (the project's own client is tested elsewhere),
each test pins one behaviour the remote executor's tests will lean on: outputs and stdout
come back, BuildGrid caches results itself, a worker sees only its input root and the
Command's environment, timeouts, platforms nobody offers, lost workers, a server that goes
away, corrupt CAS blobs, the cheaper stack variants, and a real ``nvcc --ptx`` compile that
matches a local one byte for byte. Most tests share the session stack; fault tests make
their own or use workers with a platform of their own.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import reapi
from tests.support.reapi import ProbeAction, ReapiStack, server_config
from tests.support.reapi_deps import BGD_SERVER, free_port

SH = "/bin/sh"


def _salt() -> str:
    return uuid.uuid4().hex


def _own_platform(prefix: str) -> dict[str, list[str]]:
    """A platform only the workers a test starts for it offer."""
    return {"metrale-toolchain": [f"{prefix}-{_salt()[:8]}"]}


def test_outputs_and_stdout_come_back_then_the_action_cache_answers(
    reapi_stack: ReapiStack,
) -> None:
    payload = f"input {_salt()}\n".encode()
    action = ProbeAction(
        argv=(SH, "-c", "cat in.txt > out/o.txt; echo made it; echo to stderr >&2"),
        files={"in.txt": payload},
        output_paths=("out/o.txt",),
    )
    first, second = reapi_stack.execute_all([action, action])

    assert first.ok, first
    assert not first.cached_result
    assert first.exit_code == 0
    assert first.outputs == {"out/o.txt": payload}
    assert (first.stdout, first.stderr) == (b"made it\n", b"to stderr\n")
    assert first.worker in {w.name for w in reapi_stack.workers}
    assert first.stages[-2:] == ("EXECUTING", "COMPLETED")
    # BuildGrid wrote the result into the action cache itself: the same action is a hit.
    assert second.ok and second.cached_result, second
    assert (second.outputs, second.stdout) == (first.outputs, first.stdout)
    [entry] = reapi_stack.probe(
        [{"op": "get_action_result", "hash": first.action_hash, "size": first.action_size}]
    )
    assert entry == {"exit_code": 0, "worker": first.worker}


def test_the_input_root_is_materialised_with_modes_dirs_and_symlinks(
    reapi_stack: ReapiStack,
) -> None:
    script = (
        "set -e; test -x tool.sh; ./tool.sh > out/ran.txt; cat link; test -d empty;"
        " cp tool.sh out/copy.sh; ln -s ran.txt out/alias; pwd"
    )
    outcome = reapi_stack.execute(
        ProbeAction(
            argv=(SH, "-c", script),
            files={
                "sub/tool.sh": b"#!/bin/sh\necho tool ran\n",
                "sub/d/e/f.txt": b"deep\n",
                "plain.txt": _salt().encode(),
            },
            executables=frozenset({"sub/tool.sh"}),
            symlinks={"sub/link": "d/e/f.txt"},
            directories=("sub/empty",),
            working_directory="sub",
            output_paths=("out/ran.txt", "out/copy.sh", "out/alias", "out/missing"),
        )
    )
    assert outcome.ok and outcome.exit_code == 0, outcome
    assert outcome.stdout.startswith(b"deep\n")
    # A fresh directory of the worker's, the working directory below the input root.
    assert outcome.stdout.rstrip().endswith(b"/root/sub")
    assert outcome.outputs == {
        "out/ran.txt": b"tool ran\n",
        "out/copy.sh": b"#!/bin/sh\necho tool ran\n",
    }
    assert outcome.executables == {"out/copy.sh"}
    assert outcome.symlinks == {"out/alias": "ran.txt"}


def test_the_command_gets_exactly_its_environment(reapi_stack: ReapiStack) -> None:
    env = {"A": "1", "PATH": "/usr/bin:/bin", "WITH SPACE": "x y", "SALT": _salt()}
    outcome = reapi_stack.execute(ProbeAction(argv=("/usr/bin/env",), env=env))
    assert outcome.ok, outcome
    assert sorted(outcome.stdout.decode().splitlines()) == sorted(
        f"{k}={v}" for k, v in env.items()
    )


def test_output_directories_big_blobs_and_reapi_2_0_fields(reapi_stack: ReapiStack) -> None:
    big = os.urandom(5 << 19)  # 2.5 MiB: ByteStream both ways (batches stop at 1 MiB)
    outcome = reapi_stack.execute(
        ProbeAction(
            argv=(SH, "-c", "mkdir -p gen/sub; cp big.bin gen/sub/b; echo x > gen/x; cp big.bin o"),
            files={"big.bin": big},
            output_files=("o",),
            output_directories=("gen",),
        )
    )
    assert outcome.ok and outcome.exit_code == 0, outcome
    assert outcome.outputs == {"o": big, "gen/sub/b": big, "gen/x": b"x\n"}


def test_a_worker_can_inline_stdout(reapi_stack: ReapiStack) -> None:
    platform = _own_platform("inline")
    reapi_stack.start_worker(platform, inline_stdio=True)
    outcome = reapi_stack.execute(ProbeAction(argv=("/bin/echo", "inline"), platform=platform))
    assert outcome.ok and outcome.stdout_inline and outcome.stdout == b"inline\n", outcome


def test_a_nonzero_exit_is_a_result_and_is_cached(reapi_stack: ReapiStack) -> None:
    action = ProbeAction(argv=(SH, "-c", "echo failing >&2; exit 3"), salt=_salt())
    first, second = reapi_stack.execute_all([action, action])
    assert first.ok and first.exit_code == 3 and first.stderr == b"failing\n", first
    assert second.cached_result and second.exit_code == 3  # cache-failed-actions: on


def test_a_command_reads_only_its_input_root(reapi_stack: ReapiStack, tmp_path: Path) -> None:
    if reapi_stack.isolation_error:
        reapi.unavailable(reapi_stack.isolation_error)
    secret = tmp_path / "secret.txt"
    secret.write_text("the client's file\n")
    climb = "../" * 40 + str(secret).lstrip("/")
    script = (
        'for p in "$@"; do if cat "$p" 2>/dev/null; then echo "read $p"; '
        'else echo "cannot read"; fi; done'
    )
    outcome = reapi_stack.execute(
        ProbeAction(
            argv=(SH, "-c", script, "sh", "secret.txt", str(secret), climb, "in.txt"),
            files={"in.txt": b"uploaded\n"},
            salt=_salt(),
        )
    )
    assert outcome.ok and outcome.exit_code == 0, outcome
    # Not uploaded: not there by relative path, by absolute path, or by climbing out.
    assert outcome.stdout.decode().splitlines() == [
        "cannot read",
        "cannot read",
        "cannot read",
        "uploaded",
        "read in.txt",
    ]


def test_an_action_no_worker_can_take_stays_queued(reapi_stack: ReapiStack) -> None:
    outcome = reapi_stack.execute(
        ProbeAction(argv=("/bin/true",), platform=_own_platform("nobody-offers")),
        deadline_s=1.5,
    )
    assert outcome.rpc_code == "DEADLINE_EXCEEDED", outcome
    assert outcome.stages[-1] == "QUEUED"
    # A key the scheduler does not know is refused outright.
    refused = reapi_stack.execute(ProbeAction(argv=("/bin/true",), platform={"colour": ["red"]}))
    assert refused.rpc_code == "FAILED_PRECONDITION"
    assert "Unregistered platform property" in refused.rpc_message


def test_a_timeout_is_deadline_exceeded_and_kills_the_group(reapi_stack: ReapiStack) -> None:
    marker = f"{30 + int(_salt()[:4], 16) / 65536:.6f}"  # sleep's argument names our processes
    action = ProbeAction(
        argv=(SH, "-c", f"echo started; sleep {marker} & sleep {marker}"), timeout_s=0.5
    )
    first, second = reapi_stack.execute_all([action, action])
    assert first.rpc_code == "OK" and first.status_code == "DEADLINE_EXCEEDED", first
    assert first.exit_code == 137  # SIGKILL, as a shell reports it
    assert first.stdout == b"started\n"
    assert first.elapsed_s < 5
    assert not second.cached_result  # a status other than OK is never cached
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout == "", "the timed-out command's background child survived"


def test_a_command_that_cannot_start_is_a_failed_precondition(reapi_stack: ReapiStack) -> None:
    outcome = reapi_stack.execute(ProbeAction(argv=("/no/such/tool",), salt=_salt()))
    assert outcome.status_code == "FAILED_PRECONDITION", outcome
    assert "/no/such/tool" in outcome.status_message


def test_a_corrupt_cas_blob(reapi_stack: ReapiStack) -> None:
    data = f"corrupt me {_salt()}\n".encode()
    first = reapi_stack.execute(ProbeAction(argv=("/bin/cat", "in.txt"), files={"in.txt": data}))
    assert first.ok and first.stdout == data
    digest = first.input_files["in.txt"]
    reapi_stack.corrupt_blob(digest)  # same size, every byte inverted

    # BuildGrid serves the stored bytes unchecked, through both read paths.
    for via in ("batch", "bytestream"):
        read = reapi_stack.read_blob(digest, len(data), via=via)
        assert read.code == "OK" and read.data == bytes(b ^ 0xFF for b in data), via
    # The worker checks every hash: the action fails as REAPI says for a missing input.
    rerun = reapi_stack.execute(
        ProbeAction(argv=("/bin/cat", "in.txt"), files={"in.txt": data}, salt=_salt())
    )
    assert rerun.status_code == "FAILED_PRECONDITION", rerun
    assert rerun.missing == (f"blobs/{digest}/{len(data)}",)
    # Uploading it again does not repair it: the file exists, so the write is skipped.
    [upload] = reapi_stack.probe([{"op": "upload", "data_b64": _b64(data), "force": True}])
    assert upload["status_code"] == "OK"
    assert reapi_stack.read_blob(digest, len(data)).data != data
    # A shortened file: BatchReadBlobs returns the short bytes as OK, ByteStream DATA_LOSS.
    reapi_stack.corrupt_blob(digest, data[:5])
    assert reapi_stack.read_blob(digest, len(data)).data == data[:5]
    assert reapi_stack.read_blob(digest, len(data), via="bytestream").code == "DATA_LOSS"
    reapi_stack.blob_path(digest).unlink()
    assert reapi_stack.read_blob(digest, len(data)).code == "NOT_FOUND"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.slow
def test_a_killed_worker_s_lease_is_requeued_after_the_keepalive(reapi_stack: ReapiStack) -> None:
    platform = _own_platform("kill")
    victim = reapi_stack.start_worker(platform, name=f"victim-{_salt()[:6]}")
    pending = reapi_stack.start_execute(
        ProbeAction(argv=(SH, "-c", "echo run; sleep 0.5; echo done"), platform=platform)
    )
    started = victim.wait_event("exec")
    victim.kill()
    rescuer = reapi_stack.start_worker(platform, name=f"rescuer-{_salt()[:6]}")
    again = rescuer.wait_event("lease")
    outcome = pending.wait()

    assert outcome.ok and outcome.stdout == b"run\ndone\n", outcome
    assert outcome.worker == rescuer.name
    # Run again by the rescuer. (Not counted in the stream's stages: the server streams
    # what it sees when it looks, so a requeue and a new lease may show as one EXECUTING.)
    assert rescuer.wait_event("exec")["t"] >= again["t"]
    # The session expires after the keepalive, the reaper (every 0.5 s) requeues the job.
    waited = again["t"] - started["t"]
    assert reapi_stack.options.keepalive_s - 0.5 < waited < reapi_stack.options.keepalive_s + 3


def test_a_stopped_worker_hands_its_lease_back_at_once(reapi_stack: ReapiStack) -> None:
    platform = _own_platform("term")
    leaver = reapi_stack.start_worker(platform, name=f"leaver-{_salt()[:6]}")
    pending = reapi_stack.start_execute(
        ProbeAction(argv=(SH, "-c", "echo run; sleep 0.5; echo done"), platform=platform)
    )
    started = leaver.wait_event("exec")
    stayer = reapi_stack.start_worker(platform, name=f"stayer-{_salt()[:6]}")
    assert leaver.stop() == 0
    again = stayer.wait_event("lease")
    outcome = pending.wait()
    assert outcome.ok and outcome.worker == stayer.name, outcome
    assert again["t"] - started["t"] < 2.0
    assert leaver.events()[-1]["event"] == "stopped"


@pytest.mark.slow
def test_a_server_down_at_the_start_and_in_the_middle(
    reapi_stack_factory: Callable[..., ReapiStack],
) -> None:
    stack = reapi_stack_factory(workers=1)
    stack.stop_server()
    down = stack.execute(ProbeAction(argv=("/bin/true",)), deadline_s=2)
    assert down.rpc_code == "UNAVAILABLE", down
    stack.start_server()  # the same port; the worker's session survived in PostgreSQL
    assert stack.execute(ProbeAction(argv=("/bin/echo", "back"))).stdout == b"back\n"

    action = ProbeAction(argv=(SH, "-c", "echo run; sleep 1; echo done"))
    [worker] = stack.workers
    seen = len(worker.events())
    pending = stack.start_execute(action)
    worker.wait_event("exec", after=seen)
    went_down = time.time()
    stack.stop_server()
    broken = pending.wait()
    assert broken.rpc_code == "UNAVAILABLE", broken  # the client's stream dies with the server
    stack.start_server()
    # The job survived in the database and the worker kept running (its uploads waited for
    # the server): a new Execute gets the run that started before the outage.
    joined = stack.execute(action)
    assert joined.ok and joined.stdout == b"run\ndone\n", joined
    assert joined.timestamps["execution_start_timestamp"] < went_down
    assert [e["event"] for e in worker.events()[seen:]].count("exec") == 1
    # The action cache lives in the server's memory: the restarts forgot "back" (not the CAS).
    again = stack.execute(ProbeAction(argv=("/bin/echo", "back")))
    assert again.ok and not again.cached_result


def test_the_empty_instance_name_and_a_read_only_action_cache(
    reapi_stack_factory: Callable[..., ReapiStack],
) -> None:
    stack = reapi_stack_factory(workers=1, instance="", ac_allow_updates=False)
    action = ProbeAction(argv=("/bin/echo", "hi"))
    first, second = stack.execute_all([action, action])
    assert first.ok and first.stdout == b"hi\n", first
    assert not second.cached_result  # the scheduler's write was refused: nothing cached
    update, get = stack.probe(
        [
            {"op": "update_action_result", "hash": first.action_hash, "size": first.action_size},
            {"op": "get_action_result", "hash": first.action_hash, "size": first.action_size},
        ]
    )
    assert update["rpc_code"] == "UNIMPLEMENTED"
    assert get["rpc_code"] == "NOT_FOUND"


def test_a_cas_and_action_cache_only_stack(
    reapi_stack_factory: Callable[..., ReapiStack],
) -> None:
    stack = reapi_stack_factory(execution=False, workers=0)
    assert stack.database_url is None and not stack.workers
    outcome = stack.execute(ProbeAction(argv=("/bin/true",)))
    assert outcome.rpc_code == "UNIMPLEMENTED", outcome
    update, get = stack.probe(
        [
            {
                "op": "update_action_result",
                "hash": outcome.action_hash,
                "size": outcome.action_size,
                "exit_code": 7,
            },
            {"op": "get_action_result", "hash": outcome.action_hash, "size": outcome.action_size},
        ]
    )
    assert update == {"status_code": "OK"}
    assert get["exit_code"] == 7


def test_the_fast_server_launcher_still_validates_the_config(tmp_path: Path) -> None:
    """BGD_SERVER skips BuildGrid's metaschema checks, not the config's validation."""
    try:
        venv = reapi.buildgrid_venv(os.environ)
    except reapi.StackUnavailable as exc:
        reapi.unavailable(exc.reason)
    config = server_config(
        port=free_port(),
        cas_dir=tmp_path / "cas",
        instance="main",
        database_url=None,
        match_property_keys=(),
    ).replace("thread-pool-size: 64", "thread-pool-size: 2")
    (tmp_path / "bad.yml").write_text(config)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", BGD_SERVER, "server", "start", "bad.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode != 0
    assert "failed validation: 2 is less than the minimum of 5" in done.stderr


KERNEL = b"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_real_nvcc_compile_matches_a_local_one(reapi_stack: ReapiStack, tmp_path: Path) -> None:
    nvcc = shutil.which("nvcc")
    assert nvcc is not None
    # A same-host worker reaches the toolkit; it sees only the Command's PATH.
    env = {"PATH": f"{os.path.dirname(nvcc)}:/usr/bin:/bin"}
    argv = ("nvcc", "--ptx", "-arch=sm_90", "-o", "out/k.ptx", "k.cu")
    outcome = reapi_stack.execute(
        ProbeAction(argv=argv, env=env, files={"k.cu": KERNEL}, output_paths=("out/k.ptx",)),
        skip_cache_lookup=True,
    )
    assert outcome.ok and outcome.exit_code == 0, outcome.stderr.decode()

    (tmp_path / "out").mkdir()
    (tmp_path / "k.cu").write_bytes(KERNEL)
    started = time.monotonic()
    subprocess.run(argv, cwd=tmp_path, env=env, check=True, capture_output=True)
    local = (tmp_path / "out" / "k.ptx").read_bytes()
    assert time.monotonic() - started < 60
    assert outcome.outputs["out/k.ptx"] == local
    assert b".entry scale" in local
