"""The REAPI v2 client (metrale_orch.remote): pure parts, a real BuildGrid, a scripted fake.

- Pure: digests, the Merkle input root's canonical form (against Directory bytes
  encoded here by hand, without protobuf, and against BuildGrid's own
  ``merkle_tree_maker`` in its venv), path rejection, the Command and Action form,
  batch planning, URL parsing.
- The stubs: regenerating them changes nothing; they load beside gcsfs (googleapis-
  common-protos) in either order and unpack an ``Any`` by its REAPI type URL; the
  Bots API descriptors are BuildGrid's byte for byte; without grpc the package still
  imports and says which extra to install.
- A real BuildGrid (CAS, ByteStream, action cache; ``tests/support/reapi_cas.py``):
  capabilities, uploads below and above the batch limit, FindMissingBlobs, downloads,
  the action cache, a file changed after hashing, a hundred threads at once.
- A scripted fake server (``tests/support/reapi_fake.py``): corrupt blobs, refused
  credentials, Execute (a non-zero exit, a broken stream followed with WaitExecution,
  the server's UNAVAILABLE, a queue no worker serves, the worker's timeout).
- Dead endpoints: refused and silent, each within its deadline.

The tests of this topic that run in-process are in
``tests/unit/remote/test_remote_client.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2

from metrale_orch.remote import (
    EMPTY,
    BlobChanged,
    BlobMissing,
    CapabilityError,
    CorruptBlob,
    Digest,
    InputFile,
    MissingResultBlobs,
    RemoteAuthError,
    RemoteClient,
    RemoteRejected,
    RemoteUnavailable,
    build_input_root,
    digest_bytes,
    digest_file,
    encode_action,
)
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from tests.support import REPO
from tests.support.reapi_cas_server import (
    CasServer,
    bgd_command,
    buildgrid_python,
    cas_server,
)
from tests.support.reapi_deps import StackUnavailable
from tests.support.reapi_fake import FakeRemote, fake_remote, operation
from tests.support.remote import SAMPLE

STAGE = re_pb2.ExecutionStage


def _buildgrid_or_skip() -> None:
    """Have BuildGrid (made when missing), or skip with why (fail on CI)."""
    try:
        bgd_command()
    except StackUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"BuildGrid is needed here: {exc.reason}")
        pytest.skip(f"no BuildGrid here: {exc.reason}")


@pytest.fixture(scope="module")
def bg_python() -> Path:
    """The Python of BuildGrid's own venv (its protos and Merkle tree maker)."""
    _buildgrid_or_skip()
    return buildgrid_python()


def test_input_root_matches_buildgrids_merkle_tree_maker(tmp_path: Path, bg_python: Path) -> None:
    tree = tmp_path / "tree"
    files = {}
    for rel, spec in SAMPLE.items():
        data, executable = (
            (spec.source, spec.executable) if isinstance(spec, InputFile) else (spec, False)
        )
        assert isinstance(data, bytes)
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if executable else 0o644)
        files[rel] = InputFile(path, executable) if executable else path
    script = (
        "import sys\n"
        "from buildgrid.server.client.cas import merkle_tree_maker\n"
        "*_, (node, _blob, _path) = merkle_tree_maker(sys.argv[1])\n"
        "print(node.digest.hash, node.digest.size_bytes)\n"
    )
    out = subprocess.run(
        [str(bg_python), "-c", script, str(tree)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert build_input_root(files).digest == Digest(out[0], int(out[1]))


_POOL_CHECK = """
import sys
def ours():
    from google.longrunning import operations_pb2
    from metrale_orch.remote._proto import (
        bots_pb2, bots_pb2_grpc, bytestream_pb2_grpc, remote_execution_pb2 as re,
        remote_execution_pb2_grpc, worker_pb2,
    )
    op = operations_pb2.Operation(name="op", done=True)
    op.response.Pack(re.ExecuteResponse(result=re.ActionResult(exit_code=3)))
    back = operations_pb2.Operation.FromString(op.SerializeToString())
    out = re.ExecuteResponse()
    assert back.response.Unpack(out) and out.result.exit_code == 3
    print(back.response.type_url)
def theirs():
    import gcsfs, google.api_core.operations_v1, google.cloud.storage
if sys.argv[1] == "gcsfs-first":
    theirs(); ours()
else:
    ours(); theirs()
print("build" in sys.modules, any(m.startswith("build.") for m in sys.modules))
"""


@pytest.mark.parametrize("order", ["gcsfs-first", "ours-first"])
def test_stubs_load_beside_googleapis_common_protos(order: str) -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _POOL_CHECK, order],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "type.googleapis.com/build.bazel.remote.execution.v2.ExecuteResponse",
        "False",
        "False",
    ]


def test_bots_api_descriptors_are_buildgrids_byte_for_byte(bg_python: Path) -> None:
    from metrale_orch.remote._proto import bots_pb2, worker_pb2

    script = (
        "import sys\n"
        "from buildgrid._protos.google.devtools.remoteworkers.v1test2 import bots_pb2, worker_pb2\n"
        "sys.stdout.write(worker_pb2.DESCRIPTOR.serialized_pb.hex() + ' ' + "
        "bots_pb2.DESCRIPTOR.serialized_pb.hex())\n"
    )
    out = subprocess.run(
        [str(bg_python), "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [
        worker_pb2.DESCRIPTOR.serialized_pb.hex(),
        bots_pb2.DESCRIPTOR.serialized_pb.hex(),
    ]


_NO_GRPC = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "grpc" or name.startswith("grpc."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import metrale_orch, metrale_orch.executor, metrale_orch.remote as remote
from metrale_orch.extras import ExtraMissing
print(remote.digest_bytes(b"").size, "grpc" in sys.modules)
try:
    remote.RemoteClient
except ExtraMissing as exc:
    print(exc)
"""


def test_without_the_extra_the_package_imports_and_says_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_GRPC],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "0 False",
        "remote execution needs grpc: pip install 'metrale-orch[remote]'",
    ]


# ------------------------------------------------------------------ a real BuildGrid


@pytest.fixture(scope="module")
def buildgrid() -> Iterator[CasServer]:
    _buildgrid_or_skip()
    with cas_server() as server:
        yield server


@pytest.fixture
def client(buildgrid: CasServer) -> Iterator[RemoteClient]:
    with RemoteClient(buildgrid.url, instance=buildgrid.instance, timeout=10) as c:
        yield c


def test_capabilities(client: RemoteClient) -> None:
    caps = client.capabilities()
    assert caps.server_max_batch_bytes == 4 * 1024 * 1024 - 1024  # BuildGrid's fixed limit
    assert caps.max_batch_bytes == caps.server_max_batch_bytes
    assert caps.ac_update_enabled and not caps.exec_enabled
    assert client.capabilities() is caps  # read once


def test_upload_batches_small_blobs_and_streams_big_ones(
    buildgrid: CasServer, tmp_path: Path
) -> None:
    small = {digest_bytes(b): b for b in (os.urandom(n) for n in (1, 100, 5000, 20_000))}
    big_bytes = os.urandom(300_000)
    big_file = tmp_path / "big.bin"
    big_file.write_bytes(os.urandom(200_001))
    blobs: dict[Digest, bytes | Path] = {**small, digest_bytes(big_bytes): big_bytes}
    blobs[digest_file(big_file)] = big_file
    blobs[EMPTY] = b""
    with RemoteClient(
        buildgrid.url, instance=buildgrid.instance, batch_limit=64 * 1024, chunk_size=64 * 1024
    ) as client:
        assert client.find_missing(blobs) == set(blobs) - {EMPTY}
        stats = client.upload(blobs)
        assert (stats.sent, stats.present) == (6, 0)
        assert stats.bytes == sum(d.size for d in blobs)
        assert client.find_missing(blobs) == set()
        assert client.upload(blobs) == (0, 0, 6)  # FindMissingBlobs first: nothing resent
        for digest, blob in blobs.items():
            expected = blob if isinstance(blob, bytes) else blob.read_bytes()
            assert client.download(digest) == expected
            client.download_to(digest, tmp_path / "out")
            assert (tmp_path / "out").read_bytes() == expected
        assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin", "out"]


def test_a_blob_over_the_servers_batch_limit_goes_through_bytestream(
    client: RemoteClient,
) -> None:
    data = os.urandom(5 * 1024 * 1024)
    digest = digest_bytes(data)
    client.upload({digest: data})
    assert client.find_missing([digest]) == set()
    assert client.download(digest) == data


def test_a_missing_blob_is_reported(client: RemoteClient) -> None:
    for size in (10, 5 * 1024 * 1024):  # BatchReadBlobs and ByteStream Read
        with pytest.raises(BlobMissing):
            client.download(Digest("0" * 64, size))


def test_a_file_changed_after_hashing_is_never_committed(
    buildgrid: CasServer, tmp_path: Path
) -> None:
    with RemoteClient(
        buildgrid.url, instance=buildgrid.instance, batch_limit=64 * 1024, chunk_size=16 * 1024
    ) as client:
        for size in (1000, 100_000):  # batched, streamed
            path = tmp_path / f"f{size}"
            path.write_bytes(os.urandom(size))
            digest = digest_file(path)
            path.write_bytes(os.urandom(size))
            with pytest.raises(BlobChanged, match=str(path)):
                client.upload({digest: path})
            assert client.find_missing([digest]) == {digest}


def test_action_cache_round_trip_after_its_blobs(client: RemoteClient) -> None:
    digest, blobs = encode_action(
        ["true"], {}, "", ["out.o"], build_input_root({"a": os.urandom(8)}), {}, 10
    )
    assert client.get_action_result(digest) is None
    client.upload(blobs)
    out, stderr = os.urandom(50), b"warning: x\n"
    result = re_pb2.ActionResult(exit_code=2, stderr_digest=_msg(digest_bytes(stderr)))
    result.output_files.add(path="out.o", digest=_msg(digest_bytes(out)))
    with pytest.raises(MissingResultBlobs, match="2 blob"):
        client.update_action_result(digest, result)
    assert client.get_action_result(digest) is None  # nothing stored before its blobs
    client.update_action_result(
        digest, result, blobs={digest_bytes(out): out, digest_bytes(stderr): stderr}
    )
    got = client.get_action_result(digest)
    assert got is not None and got.exit_code == 2
    assert client.std_outputs(got) == (b"", stderr)
    assert client.download(digest_bytes(out)) == out


def test_a_hundred_threads_share_one_client(client: RemoteClient) -> None:
    shared = os.urandom(1000)

    def work(i: int) -> bool:
        mine = os.urandom(100 + i)
        client.upload({digest_bytes(shared): shared, digest_bytes(mine): mine})
        return client.download(digest_bytes(mine)) == mine

    with ThreadPoolExecutor(100) as pool:
        assert all(pool.map(work, range(100)))


def _msg(digest: Digest) -> re_pb2.Digest:
    return re_pb2.Digest(hash=digest.hash, size_bytes=digest.size)


# ------------------------------------------------------------------ a scripted fake server


@pytest.fixture
def fake() -> Iterator[FakeRemote]:
    with fake_remote() as server:
        yield server


def test_a_corrupt_blob_is_an_error_never_a_value(fake: FakeRemote, tmp_path: Path) -> None:
    client = RemoteClient(fake.url, batch_limit=64 * 1024)
    for size in (100, 200_000):  # BatchReadBlobs, ByteStream Read
        good = os.urandom(size)
        digest = digest_bytes(good)
        fake.blobs[digest] = good[:-1] + bytes([good[-1] ^ 1])
        with pytest.raises(CorruptBlob, match=digest.hash):
            client.download(digest)
        with pytest.raises(CorruptBlob):
            client.download_to(digest, tmp_path / "out")
        assert list(tmp_path.iterdir()) == []  # no file, no leftover part
        fake.blobs[digest] = good + b"more"  # too long
        with pytest.raises(CorruptBlob):
            client.download(digest)
    assert {"BatchReadBlobs", "Read"} <= set(fake.methods())


def test_upload_asks_what_is_missing_first_then_batches_then_streams(fake: FakeRemote) -> None:
    present, small, big = b"already there", os.urandom(100), os.urandom(100_000)
    fake.blobs[digest_bytes(present)] = present
    client = RemoteClient(fake.url, batch_limit=64 * 1024, chunk_size=16 * 1024)
    blobs = {digest_bytes(b): b for b in (present, small, big)}
    assert client.upload(blobs) == (2, 100_100, 1)
    assert fake.methods() == ["GetCapabilities", "FindMissingBlobs", "BatchUpdateBlobs", "Write"]
    assert fake.blobs[digest_bytes(big)] == big and fake.blobs[digest_bytes(small)] == small


def test_a_refused_blob_in_a_batch_is_an_error(fake: FakeRemote) -> None:
    bad, overloaded = b"bad", b"later"
    fake.refuse[digest_bytes(bad)] = (grpc.StatusCode.INVALID_ARGUMENT, "digest mismatch")
    fake.refuse[digest_bytes(overloaded)] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "disk full")
    client = RemoteClient(fake.url)
    with pytest.raises(RemoteRejected, match="INVALID_ARGUMENT: digest mismatch"):
        client.upload({digest_bytes(bad): bad})
    with pytest.raises(RemoteUnavailable, match="overloaded"):
        client.upload({digest_bytes(overloaded): overloaded})


def test_refused_credentials_name_the_header_setting(fake: FakeRemote) -> None:
    fake.fail = (grpc.StatusCode.UNAUTHENTICATED, "missing API key")
    client = RemoteClient(fake.url, headers={"X-BuildBuddy-API-Key": "wrong"})
    with pytest.raises(RemoteAuthError) as info:
        client.find_missing([digest_bytes(b"x")])
    text = str(info.value)
    assert "UNAUTHENTICATED: missing API key" in text
    assert "sent headers: x-buildbuddy-api-key" in text and "header" in text
    _, metadata = fake.calls[0]
    assert metadata["x-buildbuddy-api-key"] == "wrong"
    assert "build.bazel.remote.execution.v2.requestmetadata-bin" in metadata


def test_a_server_without_sha256_is_refused(fake: FakeRemote) -> None:
    fake.caps.cache_capabilities.ClearField("digest_functions")
    fake.caps.cache_capabilities.digest_functions.append(re_pb2.DigestFunction.BLAKE3)
    with pytest.raises(CapabilityError, match=r"does not offer SHA-256 .*BLAKE3"):
        RemoteClient(fake.url).capabilities()


def _finished(exit_code: int = 0, code: int = 0, message: str = "") -> re_pb2.ExecuteResponse:
    meta = re_pb2.ExecutedActionMetadata(worker="w1")
    stages = [
        "queued",
        "worker_start",
        "input_fetch_start",
        "input_fetch_completed",
        "execution_start",
        "execution_completed",
        "output_upload_start",
        "output_upload_completed",
        "worker_completed",
    ]
    for i, name in enumerate(stages):
        getattr(meta, f"{name}_timestamp").FromNanoseconds(1_000_000_000 * (100 + i))
    response = re_pb2.ExecuteResponse(
        result=re_pb2.ActionResult(exit_code=exit_code, execution_metadata=meta)
    )
    response.status.code, response.status.message = code, message
    return response


ACTION = digest_bytes(b"an action")


def test_execute_returns_a_non_zero_exit_as_a_result(fake: FakeRemote) -> None:
    def script(request: object, context: object) -> Iterator[operations_pb2.Operation]:
        yield operation("op-1", STAGE.QUEUED)
        yield operation("op-1", STAGE.EXECUTING)
        yield operation("op-1", STAGE.COMPLETED, response=_finished(3))

    fake.execute = script
    got = RemoteClient(fake.url).execute(ACTION, timeout=5)
    assert (got.exit_code, got.cached, got.timed_out, got.operation) == (3, False, False, "op-1")
    assert got.timings.worker == "w1" and got.timings.wall > 0
    assert got.timings.durations() == {
        "queued": 1.0,
        "input_fetch": 1.0,
        "execution": 1.0,
        "output_upload": 1.0,
        "worker": 7.0,
    }


def test_a_broken_execute_stream_is_followed_with_wait_execution(fake: FakeRemote) -> None:
    def broken(
        request: object, context: grpc.ServicerContext
    ) -> Iterator[operations_pb2.Operation]:
        yield operation("op-2", STAGE.QUEUED)
        context.abort(grpc.StatusCode.UNAVAILABLE, "stream reset")

    def wait(
        request: re_pb2.WaitExecutionRequest, context: object
    ) -> Iterator[operations_pb2.Operation]:
        assert request.name == "op-2"
        yield operation("op-2", STAGE.COMPLETED, response=_finished(0))

    fake.execute, fake.wait = broken, wait
    got = RemoteClient(fake.url).execute(ACTION, timeout=5)
    assert got.exit_code == 0 and got.operation == "op-2"
    assert fake.methods()[-2:] == ["Execute", "WaitExecution"]


def test_the_servers_unavailable_is_an_infrastructure_error(fake: FakeRemote) -> None:
    def script(request: object, context: object) -> Iterator[operations_pb2.Operation]:
        yield operation("op-3", STAGE.COMPLETED, response=_finished(code=14, message="bot lost"))

    fake.execute = script
    with pytest.raises(RemoteUnavailable, match="UNAVAILABLE: bot lost"):
        RemoteClient(fake.url).execute(ACTION, timeout=5)


def test_the_workers_timeout_is_a_timed_out_result(fake: FakeRemote) -> None:
    def script(request: object, context: object) -> Iterator[operations_pb2.Operation]:
        yield operation("op-4", STAGE.COMPLETED, response=_finished(code=4, message="timeout"))

    fake.execute = script
    got = RemoteClient(fake.url).execute(ACTION, timeout=5)
    assert got.timed_out


def test_a_queue_no_worker_serves_ends_at_the_deadline(fake: FakeRemote) -> None:
    def script(
        request: object, context: grpc.ServicerContext
    ) -> Iterator[operations_pb2.Operation]:
        yield operation("op-5", STAGE.QUEUED)
        while context.is_active():
            time.sleep(0.02)

    fake.execute = script
    start = time.monotonic()
    with pytest.raises(RemoteUnavailable) as info:
        RemoteClient(fake.url).execute(
            ACTION, timeout=0.5, platform={"OSFamily": "linux", "gpu": "h100"}
        )
    assert time.monotonic() - start < 2
    assert "no worker for platform OSFamily=linux gpu=h100 took the action within 0.5 s" in str(
        info.value
    )


def test_a_cache_only_server_refuses_execute(fake: FakeRemote) -> None:
    fake.caps.execution_capabilities.exec_enabled = False
    with pytest.raises(CapabilityError, match="does not execute"):
        RemoteClient(fake.url).execute(ACTION, timeout=5)


def test_a_silent_server_costs_one_deadline() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"grpc://127.0.0.1:{listener.getsockname()[1]}"
        client = RemoteClient(url, timeout=0.5)
        start = time.monotonic()
        with pytest.raises(RemoteUnavailable, match=r"no answer to GetCapabilities within 0\.5 s"):
            client.capabilities()
        with pytest.raises(RemoteUnavailable):  # shared, not another deadline
            client.find_missing([digest_bytes(b"x")])
        assert time.monotonic() - start < 2
