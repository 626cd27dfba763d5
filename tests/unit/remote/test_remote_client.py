"""The REAPI v2 client (metrale_orch.remote): pure parts, a real BuildGrid, a scripted fake.

These are the tests of this topic that run in-process; the others, and the rest of what they
check, are in ``tests/scenarios/remote/test_remote_client.py``.
"""

from __future__ import annotations

import hashlib
import os
import time
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch.remote import (
    EMPTY,
    ActionSpecError,
    Digest,
    InputRootError,
    MerkleMemo,
    RemoteClient,
    RemoteConfigError,
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
    free_port,
)
from tests.support.remote import SAMPLE


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
