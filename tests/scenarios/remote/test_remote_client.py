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
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch.remote import (
    EMPTY,
    ActionSpecError,
    BlobChanged,
    BlobMissing,
    CapabilityError,
    CorruptBlob,
    Digest,
    InputFile,
    InputRootError,
    MerkleMemo,
    MissingResultBlobs,
    RemoteAuthError,
    RemoteClient,
    RemoteConfigError,
    RemoteRejected,
    RemoteUnavailable,
    build_input_root,
    digest_bytes,
    digest_file,
    encode_action,
    parse_digest,
    regen,
)
from metrale_orch.remote._proto import remote_execution_pb2 as re_pb2
from metrale_orch.remote.cas import BLOB_OVERHEAD, REQUEST_OVERHEAD, fits, plan_batches
from metrale_orch.remote.rpc import parse_url
from tests.support import REPO
from tests.support.reapi_cas_server import (
    CasServer,
    bgd_command,
    buildgrid_python,
    cas_server,
    free_port,
)
from tests.support.reapi_deps import StackUnavailable
from tests.support.reapi_fake import FakeRemote, fake_remote, operation

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


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ digests


def test_digest_is_sha256_and_size() -> None:
    assert digest_bytes(b"abc") == Digest(
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", 3
    )
    assert Digest(sha(b""), 0) == EMPTY
    assert str(digest_bytes(b"abc")) == f"{sha(b'abc')}/3"


def test_file_digest_streams_and_matches_bytes(tmp_path: Path) -> None:
    data = os.urandom(1024 * 1024 + 17)  # more than one read chunk
    (tmp_path / "f").write_bytes(data)
    assert digest_file(tmp_path / "f") == digest_bytes(data)


def test_parse_digest_round_trips_and_rejects() -> None:
    d = digest_bytes(b"x")
    assert parse_digest(str(d)) == d
    for bad in ("", "abc/1", f"{d.hash}", f"{d.hash}/-1", f"{d.hash.upper()}/1"):
        with pytest.raises(ValueError):
            parse_digest(bad)


# ------------------------------------------------------------------ Merkle input roots


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _digest_wire(data: bytes) -> bytes:
    size = _varint(2 << 3 | 0) + _varint(len(data)) if data else b""
    return _field(1, sha(data).encode()) + size


def _directory_wire(files: list[tuple[str, bytes, bool]], dirs: list[tuple[str, bytes]]) -> bytes:
    """A REAPI Directory encoded by hand (no protobuf): FileNode = 1, DirectoryNode = 2."""
    out = b""
    for name, data, executable in sorted(files):
        node = _field(1, name.encode()) + _field(2, _digest_wire(data))
        out += _field(1, node + (b"\x20\x01" if executable else b""))
    for name, blob in sorted(dirs):
        out += _field(2, _field(1, name.encode()) + _field(2, _digest_wire(blob)))
    return out


SAMPLE = {
    "kernels/gemv.cu": b"__global__ void gemv() {}\n",
    "kernels/include/tile.cuh": b"#pragma once\n",
    "include/common.h": b"#define N 4\n",
    "build.sh": InputFile(b"#!/bin/sh\nexit 0\n", executable=True),
    "z": b"",
}


def _sample_root_by_hand() -> bytes:
    include = _directory_wire([("common.h", b"#define N 4\n", False)], [])
    tile = _directory_wire([("tile.cuh", b"#pragma once\n", False)], [])
    kernels = _directory_wire([("gemv.cu", SAMPLE["kernels/gemv.cu"], False)], [("include", tile)])
    return _directory_wire(
        [("build.sh", b"#!/bin/sh\nexit 0\n", True), ("z", b"", False)],
        [("include", include), ("kernels", kernels)],
    )


def test_input_root_matches_directory_bytes_encoded_by_hand() -> None:
    root = build_input_root(SAMPLE)
    by_hand = _sample_root_by_hand()
    assert root.digest == digest_bytes(by_hand)
    assert root.blobs[root.digest] == by_hand
    parsed = re_pb2.Directory.FromString(by_hand)
    assert [f.name for f in parsed.files] == ["build.sh", "z"]
    assert not parsed.HasField("node_properties") and not parsed.symlinks


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


@settings(max_examples=40, deadline=None)
@given(st.permutations(sorted(SAMPLE)))
def test_input_root_does_not_depend_on_mapping_order(order: list[str]) -> None:
    assert build_input_root({k: SAMPLE[k] for k in order}).digest == build_input_root(SAMPLE).digest


def test_files_on_disk_stay_on_disk_and_use_the_callers_hasher(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * 300_000)
    seen: list[Path] = []

    def hasher(path: Path) -> Digest:
        seen.append(path)
        return digest_file(path)

    root = build_input_root({"data/big.bin": big, "small": b"s"}, hasher=hasher)
    assert seen == [big]
    assert root.blobs[digest_file(big)] == big  # a path, streamed at upload time
    assert root.blobs[digest_bytes(b"s")] == b"s"


def test_memo_builds_a_shared_subtree_once() -> None:
    memo = MerkleMemo()
    shared = {f"lib/h{i}.h": f"header {i}".encode() for i in range(20)}
    first = build_input_root({**shared, "a.cu": b"a"}, memo=memo)
    misses = memo.misses
    second = build_input_root({**shared, "b.cu": b"b"}, memo=memo)
    assert memo.misses == misses + 1  # only the new root; lib/ came from the memo
    assert memo.hits >= 1
    lib = {d for d in first.blobs if d in second.blobs and isinstance(first.blobs[d], bytes)}
    assert len(lib) == 21  # the lib Directory and its 20 headers are shared
    assert build_input_root({**shared, "a.cu": b"a"}).digest == first.digest


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/passwd", "absolute"),
        ("../x.h", "'..' component"),
        ("a/../b.h", "'..' component"),
        ("./a.h", "'.' component"),
        ("a//b.h", "'empty' component"),
        ("a/", "'empty' component"),
        ("", "non-empty"),
        ("a\0b", "NUL"),
        ("bad\udcff.h", "UTF-8"),
    ],
)
def test_input_paths_are_rejected(path: str, problem: str) -> None:
    with pytest.raises(InputRootError) as info:
        build_input_root({path: b"x"})
    assert problem in str(info.value) and info.value.path == path


def test_a_path_cannot_be_both_file_and_directory() -> None:
    with pytest.raises(InputRootError, match="'a' is also an input file"):
        build_input_root({"a": b"1", "a/b": b"2"})


# ------------------------------------------------------------------ Command and Action


def _action(**overrides: object) -> tuple[Digest, re_pb2.Command, re_pb2.Action]:
    args: dict[str, object] = {
        "argv": ["nvcc", "-c", "k.cu", "-o", "k.o"],
        "env": {"PATH": "/usr/bin", "CUDA_HOME": "/cuda", "A": "1"},
        "cwd_rel": "kernels",
        "outputs": ["k.o", "a.d"],
        "input_root": build_input_root({"kernels/k.cu": b"k"}),
        "platform": [("OSFamily", "linux"), ("ISA", "x86-64"), ("ISA", "avx2")],
        "timeout": 90.5,
    }
    args.update(overrides)
    digest, blobs = encode_action(**args)
    action = re_pb2.Action.FromString(blobs[digest])
    command_blob = blobs[Digest(action.command_digest.hash, action.command_digest.size_bytes)]
    return digest, re_pb2.Command.FromString(command_blob), action


def test_command_and_action_are_canonical() -> None:
    digest, command, action = _action()
    assert list(command.arguments) == ["nvcc", "-c", "k.cu", "-o", "k.o"]
    assert [(v.name, v.value) for v in command.environment_variables] == [
        ("A", "1"),
        ("CUDA_HOME", "/cuda"),
        ("PATH", "/usr/bin"),
    ]
    assert list(command.output_paths) == ["a.d", "k.o"]
    assert command.working_directory == "kernels"
    props = [(p.name, p.value) for p in command.platform.properties]
    assert props == [("ISA", "avx2"), ("ISA", "x86-64"), ("OSFamily", "linux")]
    assert action.platform == command.platform
    assert (action.timeout.seconds, action.timeout.nanos) == (90, 500_000_000)
    assert not action.do_not_cache
    assert action.input_root_digest.hash == build_input_root({"kernels/k.cu": b"k"}).digest.hash
    reordered, _, _ = _action(
        env={"A": "1", "PATH": "/usr/bin", "CUDA_HOME": "/cuda"},
        outputs=["a.d", "k.o", "k.o"],
        platform=[("OSFamily", "linux"), ("ISA", "avx2"), ("ISA", "x86-64")],
    )
    assert reordered == digest
    assert _action(do_not_cache=True)[0] != digest
    assert _action(timeout=None)[2].HasField("timeout") is False


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        ({"argv": []}, "arguments"),
        ({"env": {"A=B": "1"}}, "environment"),
        ({"outputs": ["/abs/k.o"]}, "output path"),
        ({"outputs": ["../k.o"]}, "output path"),
        ({"cwd_rel": "/kernels"}, "working directory"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"platform": {"": "x"}}, "platform"),
    ],
)
def test_bad_action_fields_are_refused(overrides: dict[str, object], what: str) -> None:
    with pytest.raises(ActionSpecError) as info:
        _action(**overrides)
    assert info.value.what == what


# ------------------------------------------------------------------ pure helpers


def test_batches_stay_within_the_limit() -> None:
    limit = 64 * 1024
    sizes = [1000, 30_000, 30_000, 5, 20_000, 60_000, 1]
    digests = [Digest(f"{i:064x}", s) for i, s in enumerate(sizes)]
    small = [d for d in digests if fits(d.size, limit)]
    batches = plan_batches(small, limit)
    assert [d for b in batches for d in b] == small
    for batch in batches:
        assert REQUEST_OVERHEAD + sum(d.size + BLOB_OVERHEAD for d in batch) <= limit
    assert not fits(limit - REQUEST_OVERHEAD, limit)


@pytest.mark.parametrize(
    ("url", "target", "tls"),
    [
        ("grpc://127.0.0.1:8980", "127.0.0.1:8980", False),
        ("grpcs://remote.buildbuddy.io", "remote.buildbuddy.io:443", True),
        ("grpcs://[::1]:9092/", "[::1]:9092", True),
    ],
)
def test_urls(url: str, target: str, tls: bool) -> None:
    assert parse_url(url) == (target, tls)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://host:80", "use grpc://"),
        ("127.0.0.1:8980", "use grpc://"),
        ("grpc://host", "needs a port"),
        ("grpc://host:99999", "port"),
        ("grpc://host:1/instance", "instance name"),
    ],
)
def test_bad_urls(url: str, problem: str) -> None:
    with pytest.raises(RemoteConfigError, match=problem):
        RemoteClient(url)


def test_bad_headers_are_refused_before_connecting() -> None:
    with pytest.raises(RemoteConfigError, match="header"):
        RemoteClient("grpc://127.0.0.1:1", headers={"X Bad": "1"})


# ------------------------------------------------------------------ the stubs


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the test and dev extras)")
    regen.generate(tmp_path)
    assert regen.compare(tmp_path) == [], "run: python -m metrale_orch.remote.regen"


def test_the_grpcio_tools_pin_is_the_one_regen_uses() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in ("dev", "test"):
        assert f"grpcio-tools=={regen.GRPCIO_TOOLS}" in extras[extra]


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


# ------------------------------------------------------------------ dead endpoints


def test_a_refused_port_is_unreachable_at_once() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RemoteUnavailable) as info:
        RemoteClient(f"grpc://127.0.0.1:{port}", timeout=5).capabilities()
    assert time.monotonic() - start < 5
    assert str(info.value) == (
        f"remote execution grpc://127.0.0.1:{port}: "
        f"unreachable: grpc://127.0.0.1:{port} (connection refused)"
    )


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
