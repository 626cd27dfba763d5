"""One storage contract, run against every remote backend.

memory://, file://, S3 on a real moto server and GCS on gcp-storage-emulator
(each server started once for this module, bound to 127.0.0.1:<ephemeral>).
Outage cases print their wall time; the bound asserted is deliberately loose.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec.core
import pytest

from metrale_orch.cache import Cache, CacheSettings, cache_key, open_cache
from metrale_orch.cache.bucket import RemoteStore, remote_object_path
from metrale_orch.cache.objects import CorruptObject, decode_object, encode_object
from tests.support.servers import (
    DNS_FAILURE_ENDPOINT,
    ObjectServer,
    gcs_storage_options,
    refused_endpoint,
    s3_auth_enforced,
    s3_storage_options,
    silent_endpoint,
)

BACKENDS = ["memory", "file", "s3", "gcs"]
OUTPUTS = {"k.ptx": b".version 9.0\n.target sm_90a\n" * 40, "k.cubin": bytes(range(256)) * 3}
META = {
    "command": ["nvcc", "-ptx"],
    "toolchain": "nvcc 13.0",
    "producer": "t",
    "compile_seconds": 0.75,
}


@dataclass
class Backend:
    name: str
    url: str
    storage_options: dict[str, Any]
    server: ObjectServer | None
    tmp: Path

    def settings(self, **kw: Any) -> CacheSettings:
        kw.setdefault("local_dir", self.tmp / f"local-{uuid.uuid4().hex[:8]}")
        kw.setdefault("background_uploads", False)
        return CacheSettings(remote=self.url, storage_options=self.storage_options, **kw)

    def cache(self, **kw: Any) -> Cache:
        return open_cache(self.settings(**kw))

    def _fs(self) -> tuple[Any, str]:
        return fsspec.core.url_to_fs(self.url, **self.storage_options)  # type: ignore[no-any-return]

    def raw_write(self, key: str, data: bytes, namespace: str = "") -> None:
        """Write bytes straight into the store where ``key``'s object lives."""
        fs, root = self._fs()
        path = remote_object_path(root, namespace, key)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)

    def raw_read(self, key: str, namespace: str = "") -> bytes | None:
        fs, root = self._fs()
        try:
            return bytes(fs.cat_file(remote_object_path(root, namespace, key)))
        except FileNotFoundError:
            return None

    def listing(self) -> dict[str, bytes]:
        fs, root = self._fs()
        try:
            return {p: bytes(fs.cat_file(p)) for p in sorted(fs.find(root))}
        except FileNotFoundError:
            return {}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    name = request.param
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    if name == "memory":
        return Backend(name, f"memory://cache/{prefix}", {}, None, tmp_path)
    if name == "file":
        return Backend(name, f"file://{tmp_path}/remote/{prefix}", {}, None, tmp_path)
    server: ObjectServer = request.getfixturevalue("s3" if name == "s3" else "gcs")
    return Backend(name, server.url(prefix), server.storage_options, server, tmp_path)


def _key(label: str) -> str:
    return cache_key("", {"test": label, "id": uuid.uuid4().hex})


def test_miss_put_hit_round_trip(backend: Backend) -> None:
    key = _key("round-trip")
    writer = backend.cache()
    assert writer.get(key) is None
    writer.put(key, OUTPUTS, META)
    local = writer.get(key)
    assert local is not None and local.tier == "local"
    writer.close()

    reader = backend.cache()
    hit = reader.get(key)
    assert hit is not None and hit.tier == "remote"
    assert dict(hit.outputs) == OUTPUTS
    assert dict(hit.meta) == META
    again = reader.get(key)  # the remote hit filled the local tier
    assert again is not None and again.tier == "local"
    reader.close()

    assert (writer.stats.misses, writer.stats.local_hits, writer.stats.puts) == (1, 1, 1)
    assert writer.stats.uploads == 1 and writer.stats.bytes_up > sum(map(len, OUTPUTS.values()))
    assert (reader.stats.remote_hits, reader.stats.local_hits, reader.stats.misses) == (1, 1, 0)
    assert reader.stats.bytes_down == writer.stats.bytes_up
    assert reader.stats.seconds_saved == pytest.approx(1.5)
    assert writer.warnings() == [] and reader.warnings() == []


def test_empty_and_many_outputs_round_trip(backend: Backend) -> None:
    key = _key("shapes")
    outputs = {f"m{i}.ptx": bytes([i]) * i for i in range(12)}  # includes an empty output
    with backend.cache() as cache:
        cache.put(key, outputs, {})
    with backend.cache() as cache:
        hit = cache.get(key)
    assert hit is not None and dict(hit.outputs) == outputs


@pytest.mark.parametrize("backend", ["s3", "gcs"], indirect=True)
def test_one_request_per_lookup(backend: Backend) -> None:
    server = backend.server
    assert server is not None
    key = _key("requests")
    cache = backend.cache()
    mark = server.mark()
    assert cache.get(key) is None
    assert [m for m, _ in server.log()[mark:]] == ["GET"]
    mark = server.mark()
    cache.put(key, OUTPUTS, META)
    assert len(server.log()[mark:]) == 1
    fresh = backend.cache()
    mark = server.mark()
    assert fresh.get(key) is not None
    assert [m for m, _ in server.log()[mark:]] == ["GET"]


def _bad_bytes(kind: str, key: str) -> bytes:
    good = encode_object(key, OUTPUTS, META)
    if kind == "garbage":
        return uuid.uuid4().bytes * 50
    if kind == "truncated":
        return good[:-7]
    if kind == "payload-bit":
        return good[:-10] + bytes([good[-10] ^ 1]) + good[-9:]
    if kind == "header-bit":
        return good[:40] + bytes([good[40] ^ 1]) + good[41:]
    if kind == "other-key":
        return encode_object(_key("other"), OUTPUTS, META)
    if kind == "trailing":
        return good + b"\0"
    if kind == "empty":
        return b""
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["garbage", "truncated", "payload-bit", "header-bit", "other-key", "trailing", "empty"]
)
def test_bad_remote_object_is_a_reported_miss(backend: Backend, kind: str) -> None:
    key = _key(kind)
    backend.raw_write(key, _bad_bytes(kind, key))
    cache = backend.cache()
    assert cache.get(key) is None
    assert cache.stats.corrupt == 1 and cache.stats.misses == 1
    (warning,) = cache.warnings()
    assert key in warning and "corrupt" in warning
    assert not (cache.settings.local_dir / "objects" / key[:2] / key).exists()  # never installed
    # read-write: the bad object was deleted, so a fresh upload replaces it
    cache.put(key, OUTPUTS, META)
    cache.close()
    fresh = backend.cache()
    hit = fresh.get(key)
    assert hit is not None and hit.tier == "remote" and dict(hit.outputs) == OUTPUTS


def test_lookup_reads_at_most_the_object_size_limit(backend: Backend) -> None:
    key = _key("limit")
    big = {"big.cubin": uuid.uuid4().bytes * 1250 + b"."}  # 20 KB
    with backend.cache() as writer:
        writer.put(key, big, META)
    small = backend.cache(max_object_size=4096)
    assert small.get(key) is None
    assert small.stats.corrupt == 1 and small.stats.bytes_down <= 4097
    (warning,) = small.warnings()
    assert "more than the 4096-byte limit" in warning
    assert not (small.settings.local_dir / "objects" / key[:2] / key).exists()
    small.close()
    hit = backend.cache().get(key)  # not proven bad, so not deleted from the remote
    assert hit is not None and hit.tier == "remote" and dict(hit.outputs) == big


def test_concurrent_writers_one_key_readers_never_see_partial(backend: Backend) -> None:
    key = _key("race")
    # 320 KB, so a partial read is possible; never ending in "\r" (see tests.support.servers)
    big = {"big.cubin": uuid.uuid4().bytes * 20_000 + b"."}
    writers = [backend.cache() for _ in range(8)]
    probe = RemoteStore(
        backend.url,
        storage_options=backend.storage_options,
        namespace="",
        timeout=10.0,
        failure_threshold=3,
        writable=False,
        warn=lambda m: None,
    )
    barrier = threading.Barrier(len(writers) + 2)
    done = threading.Event()
    seen: list[str] = []
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            barrier.wait()
            writers[i].put(key, big, dict(META, producer=f"w{i}"))
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            barrier.wait()
            while not done.is_set():
                data = probe.get(key, lambda raw: raw)
                if data is None:
                    seen.append("miss")
                    continue
                decode_object(key, data)  # raises CorruptObject on a partial object
                seen.append("hit")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads[:8]:
        t.join()
    done.set()
    for t in threads[8:]:
        t.join()
    probe.close()
    assert not errors, errors
    assert not any(isinstance(e, CorruptObject) for e in errors)
    uploads = sum(w.stats.uploads for w in writers)
    if backend.name == "gcs":  # the emulator ignores ifGenerationMatch=0: each writer "wins"
        assert uploads >= 1
    else:
        assert uploads == 1, "create-only: exactly one writer wins"
    assert all(w.stats.errors == 0 and w.warnings() == [] for w in writers)
    final = backend.cache().get(key)
    assert final is not None and dict(final.outputs) == big
    print(f"{backend.name}: readers saw {seen.count('hit')} hits, {seen.count('miss')} misses")


def test_read_only_makes_no_write_requests(backend: Backend) -> None:
    present, absent, bad = _key("ro-present"), _key("ro-absent"), _key("ro-bad")
    with backend.cache() as rw:
        rw.put(present, OUTPUTS, META)
    backend.raw_write(bad, b"garbage" * 10)
    before = backend.listing()
    mark = backend.server.mark() if backend.server else 0

    ro = backend.cache(mode="read-only", background_uploads=True)
    hit = ro.get(present)
    assert hit is not None and hit.tier == "remote"
    assert ro.get(absent) is None
    ro.put(absent, OUTPUTS, META)  # local only
    assert ro.get(bad) is None and ro.stats.corrupt == 1
    ro.close()

    if backend.server is not None:
        assert backend.server.writes(since=mark) == []
        assert len(backend.server.log()[mark:]) == 3  # three GETs, nothing else
    assert backend.listing() == before  # the corrupt object stays: deleting is a write
    assert ro.stats.uploads == 0 and ro.stats.bytes_up == 0
    local = ro.get(absent)
    assert local is not None and local.tier == "local"


def test_namespace_disowns_entries(backend: Backend) -> None:
    parts = {"source": b"__global__ void k() {}", "arch": "sm_90a", "nonce": uuid.uuid4().hex}
    a = backend.cache(namespace="team-a")
    key_a = a.key(parts)
    a.put(key_a, OUTPUTS, META)
    a.close()
    b = backend.cache(namespace="team-b")
    key_b = b.key(parts)
    assert key_b != key_a
    assert b.get(key_b) is None
    # even the same key string is not found under another namespace's remote path
    assert b.get(key_a) is None
    assert backend.cache(namespace="team-a").get(key_a) is not None


# -- outages ------------------------------------------------------------------------------------


def _outage_run(settings: CacheSettings) -> tuple[Cache, float]:
    """A small 'run': 6 lookups, 3 puts, close. Returns the cache and the wall time."""
    start = time.monotonic()
    cache = open_cache(settings)
    keys = [_key(f"outage-{i}") for i in range(6)]
    for key in keys[:3]:
        assert cache.get(key) is None
        cache.put(key, OUTPUTS, META)
    for key in keys[3:]:
        assert cache.get(key) is None
    cache.close()
    wall = time.monotonic() - start
    for key in keys[:3]:  # the local tier kept working
        hit = cache.get(key)
        assert hit is not None and hit.tier == "local"
    return cache, wall


def _dead_settings(scheme: str, endpoint: str, tmp: Path, timeout: float) -> CacheSettings:
    opts = s3_storage_options(endpoint) if scheme == "s3" else gcs_storage_options(endpoint)
    return CacheSettings(
        local_dir=tmp / "local",
        remote=f"{scheme}://bucket/prefix",
        storage_options=opts,
        timeout=timeout,
    )


@pytest.mark.parametrize("scheme", ["s3", "gs"])
@pytest.mark.parametrize("outage", ["refused", "silent", "dns"])
def test_dead_remote_degrades_to_local(scheme: str, outage: str, tmp_path: Path) -> None:
    timeout = 1.0
    with silent_endpoint() as silent:
        endpoint = {"refused": refused_endpoint(), "silent": silent, "dns": DNS_FAILURE_ENDPOINT}
        cache, wall = _outage_run(_dead_settings(scheme, endpoint[outage], tmp_path, timeout))
    print(f"\n{scheme} {outage}: {wall:.2f} s for 6 lookups + 3 puts (deadline {timeout} s)")
    (warning,) = cache.warnings()
    assert "off for the rest of this run" in warning and "local cache only" in warning
    assert cache.stats.remote_disabled == 1
    assert cache.stats.errors + cache.stats.timeouts == 1  # the breaker opened on the first
    assert cache.stats.misses == 6
    assert wall < 15, f"an outage must cost about one deadline, took {wall:.1f} s"


def test_forbidden_remote_degrades_to_local(s3: ObjectServer, tmp_path: Path) -> None:
    opts = dict(s3.storage_options, key="unknown", secret="nope")
    settings = CacheSettings(local_dir=tmp_path / "local", remote=s3.url("p"), storage_options=opts)
    with s3_auth_enforced(s3):
        cache, wall = _outage_run(settings)
    print(f"\ns3 403: {wall:.2f} s for 6 lookups + 3 puts (deadline {settings.timeout} s)")
    (warning,) = cache.warnings()
    assert "off for the rest of this run" in warning and "PermissionError" in warning
    assert cache.stats.errors == 1 and cache.stats.timeouts == 0
    assert wall < 15
