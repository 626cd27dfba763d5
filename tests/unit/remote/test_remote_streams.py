"""The remote client at many actions in flight (issue 45): Execute streams are spread over
a pool of connections, an action the engine's action cache answers uploads and executes
nothing, and a result's outputs come back in one batch read."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import xxhash
from google.longrunning import operations_pb2

from metrale_orch.executor import RemoteForm
from metrale_orch.executor.reapi import ReapiBackend
from metrale_orch.remote import AsyncRemoteClient, Digest, RemoteClient, digest_bytes
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.wire import digest_message
from tests.support.reapi_fake import fake_remote, operation, run_once

STAGE = re_pb2.ExecutionStage


def test_the_channel_pool_spreads_streams_over_connections() -> None:
    peers: Counter[str] = Counter()
    lock = threading.Lock()

    def script(request: object, context: grpc.ServicerContext) -> Iterator[Any]:
        with lock:
            peers[context.peer()] += 1
        yield operation("op", STAGE.EXECUTING)
        time.sleep(0.5)
        yield operation("op", STAGE.COMPLETED, response=re_pb2.ExecuteResponse())

    streams = 240  # three channels of 80
    with fake_remote(threads=streams + 16) as fake:
        fake.execute = script
        client = RemoteClient(fake.url, streams=streams)
        with ThreadPoolExecutor(streams) as pool:
            runs = [
                pool.submit(client.execute, digest_bytes(b"action"), timeout=30)
                for _ in range(streams)
            ]
            assert all(r.result().exit_code == 0 for r in runs)
        carried = list(client.channels.carried)
        client.close()
    assert len(peers) == 3, peers  # one connection each: three client ports
    assert sorted(peers.values()) == sorted(carried)
    assert min(carried) >= streams // 3 - 10, carried


def test_an_action_cache_hit_uploads_and_executes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    source = b"__global__ void k() {}\n"
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.cu").write_bytes(source)
    form = RemoteForm(
        root=tmp_path,
        files={"w/a.cu": xxhash.xxh3_128(source).hexdigest()},
        cwd="w",
        argv=("nvcc", "--ptx", "a.cu", "-o", "a.ptx"),
        env={"PATH": "/usr/bin:/bin"},
        outputs={"w/a.ptx": out / "a.ptx"},
        platform={"OSFamily": "linux"},
    )
    ptx = b".version 8.0\n"
    ptx_digest = digest_bytes(ptx)

    def script(
        request: re_pb2.ExecuteRequest, context: object
    ) -> Iterator[operations_pb2.Operation]:
        result = re_pb2.ActionResult(exit_code=0)
        result.output_files.add(path="a.ptx", digest=digest_message(ptx_digest))
        fake.blobs[ptx_digest] = ptx
        action = request.action_digest
        fake.results[Digest(action.hash, action.size_bytes)] = result  # as an engine caches it
        yield operation("op", STAGE.COMPLETED, response=re_pb2.ExecuteResponse(result=result))

    with fake_remote() as fake:
        fake.execute = script
        first = ReapiBackend(AsyncRemoteClient(fake.url))
        ran = run_once(first, form)
        assert not ran.cached and "Execute" in fake.methods()
        with fake.lock:
            fake.calls.clear()
        second = ReapiBackend(AsyncRemoteClient(fake.url))  # nothing known present: a new run
        got = run_once(second, form)
        methods = fake.methods()
    assert got.cached and got.returncode == 0
    assert got.outputs == {out / "a.ptx": ptx} == ran.outputs
    assert not (out / "a.ptx").exists()  # brought back in memory, written nowhere
    assert methods == ["GetCapabilities", "GetActionResult", "BatchReadBlobs"], methods


def test_outputs_and_std_streams_come_back_in_one_batch_read(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    form = RemoteForm(
        root=tmp_path,
        files={},
        cwd="w",
        argv=("nvcc", "--ptx", "a.cu"),
        env={"PATH": "/usr/bin:/bin"},
        outputs={"w/a.ptx": out / "a.ptx", "w/a.d": out / "a.d"},
        platform={"OSFamily": "linux"},
    )
    blobs = {name: f"{name} bytes\n".encode() for name in ("a.ptx", "a.d", "stderr")}

    def script(request: object, context: object) -> Iterator[operations_pb2.Operation]:
        result = re_pb2.ActionResult(exit_code=0)
        for name, data in blobs.items():
            digest = digest_bytes(data)
            fake.blobs[digest] = data
            if name == "stderr":
                result.stderr_digest.CopyFrom(digest_message(digest))
            else:
                result.output_files.add(path=name, digest=digest_message(digest))
        yield operation("op", STAGE.COMPLETED, response=re_pb2.ExecuteResponse(result=result))

    with fake_remote() as fake:
        fake.execute = script
        backend = ReapiBackend(AsyncRemoteClient(fake.url))
        got = run_once(backend, form)
        methods = fake.methods()
    assert got.returncode == 0 and got.stderr == "stderr bytes\n"
    assert got.outputs == {out / "a.ptx": blobs["a.ptx"], out / "a.d": blobs["a.d"]}
    assert not any(out.iterdir())  # brought back in memory, written nowhere
    assert methods.count("BatchReadBlobs") == 1, methods
