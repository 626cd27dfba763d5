"""The cache's keys, object format, local tier, breaker, housekeeping and CLI.

The storage contract over every backend lives in ``test_cache_contract.py``.

The tests of this topic that start processes are in ``tests/scenarios/cache/test_cache.py``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import fsspec.implementations.memory as memory
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch.cache import (
    RUN_META,
    SCHEMA,
    CacheKeyError,
    CacheSettings,
    CacheSettingsError,
    CacheStats,
    CacheStatsError,
    SizeError,
    cache_key,
    gc_local,
    open_cache,
    parse_size,
    read_stats,
    verify_local,
    write_stats,
)
from metrale_orch.cache.objects import (
    CorruptObject,
    canonical_key_bytes,
    decode_object,
    encode_object,
)
from metrale_orch.cli import main
from metrale_orch.config import load_config
from tests.support.cache import META, _key, _local

# -- keys ---------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_key_ignores_mapping_order(parts: dict[str, Any]) -> None:
    reordered = dict(reversed(list(parts.items())))
    assert cache_key("ns", parts) == cache_key("ns", reordered)


@given(st.text(max_size=8), st.text(max_size=8))
def test_key_depends_on_namespace(a: str, b: str) -> None:
    assert (cache_key(a, {"x": 1}) == cache_key(b, {"x": 1})) == (a == b)


def test_key_distinguishes_types_and_content() -> None:
    keys = {
        cache_key("", {"v": "ab"}),
        cache_key("", {"v": b"ab"}),
        cache_key("", {"v": ["ab"]}),
        cache_key("", {"v": 1}),
        cache_key("", {"v": True}),
        cache_key("", {"v": 1.0}),
        cache_key("", {"v": None}),
        cache_key("", {"v": {"ab": None}}),
        cache_key("", {"v": b"ac"}),
    }
    assert len(keys) == 9
    assert all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    assert cache_key("", {"a": [1, 2]}) != cache_key("", {"a": [2, 1]})


def test_key_rejects_unencodable_values() -> None:
    with pytest.raises(CacheKeyError, match="PosixPath"):
        cache_key("", {"p": Path("/abs")})
    with pytest.raises(CacheKeyError, match="non-finite"):
        cache_key("", {"x": float("nan")})


def test_key_bytes_are_pinned() -> None:
    # Every key ever written depends on these bytes: a faster encoder must write the same
    # ones (this literal was produced by the first encoder, before it was made faster).
    parts = {
        "argv": ["nvcc", "-arch=sm_90a", "-I."],
        "inputs": [["a.cu", "0f"], ["../x/\u00fc.h", "1e"]],
        "env": {"Z": "1", "A": ""},
        "n": 7,
        "big": 2**70,
        "f": 0.5,
        "t": True,
        "no": False,
        "none": None,
        "raw": b"\x00\xff",
        "tup": ("s", 1),
        "nested": {"m": [{"k": [None]}]},
    }
    assert (
        canonical_key_bytes("ns", parts)
        == (
            '["metrale-orch-cache",1,"ns",["m",[["argv",["l",[["s","nvcc"],["s","-arch=sm_90a"],'
            '["s","-I."]]]],["big",["i","1180591620717411303424"]],["env",["m",[["A",["s",""]],'
            '["Z",["s","1"]]]]],["f",["d","0x1.0000000000000p-1"]],["inputs",["l",[["l",[["s",'
            '"a.cu"],["s","0f"]]],["l",[["s","../x/\u00fc.h"],["s","1e"]]]]]],["n",["i","7"]],'
            '["nested",["m",[["m",["l",[["m",[["k",["l",["n"]]]]]]]]]]],["no","f"],["none","n"],'
            '["raw",["b","00ff"]],["t","t"],["tup",["l",[["s","s"],["i","1"]]]]]]]'
        ).encode()
    )
    assert cache_key("ns", parts) == "2977f63ab7113216305e87a2270580e0"


def test_key_errors_name_the_place() -> None:
    with pytest.raises(CacheKeyError, match=r"parts\.a\[1\]\.b\[0\]: object cannot"):
        cache_key("", {"a": [1, {"b": [object()]}]})
    with pytest.raises(CacheKeyError, match=r"parts\.l\[0\]\[1\]: non-finite float"):
        cache_key("", {"l": [[1, float("inf")]]})


# -- object format ------------------------------------------------------------------------------


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.binary(max_size=64), max_size=4))
def test_object_round_trip(outputs: dict[str, bytes]) -> None:
    key = cache_key("", {"o": 1})
    obj = decode_object(key, encode_object(key, outputs, META))
    assert dict(obj.outputs) == outputs and dict(obj.meta) == META


@given(st.data())
def test_any_single_byte_change_or_cut_is_detected(data: st.DataObject) -> None:
    key = cache_key("", {"o": 2})
    good = encode_object(key, {"a": b"x" * 50, "b": b"yz"}, META)
    i = data.draw(st.integers(0, len(good) - 1))
    flipped = good[:i] + bytes([good[i] ^ data.draw(st.integers(1, 255))]) + good[i + 1 :]
    with pytest.raises(CorruptObject):
        decode_object(key, flipped)
    with pytest.raises(CorruptObject):
        decode_object(key, good[:i])


def test_object_header_records_schema_and_hashes() -> None:
    key = _key()
    data = encode_object(key, {"k.ptx": b"abc"}, META)
    header = json.loads(data[28 : 28 + int.from_bytes(data[8:12], "little")])
    assert header["schema"] == SCHEMA and header["key"] == key
    expected = {"name": "k.ptx", "size": 3, "xxh3": xxhash.xxh3_128_hexdigest(b"abc")}
    assert header["outputs"] == [expected] and header["meta"] == META


# -- local tier ---------------------------------------------------------------------------------


def test_local_hit_miss_and_stats(tmp_path: Path) -> None:
    cache = open_cache(_local(tmp_path))
    key = _key()
    assert cache.get(key) is None
    cache.put(key, {"m.ptx": b"ptx"}, META)
    cache.put(key, {"m.ptx": b"other"}, META)  # create-only: the first one stays
    hit = cache.get(key)
    assert hit is not None and hit.tier == "local" and hit.outputs["m.ptx"] == b"ptx"
    assert (tmp_path / "cache" / "objects" / key[:2] / key).is_file()
    s = cache.stats
    assert (s.local_hits, s.misses, s.puts, s.seconds_saved) == (1, 1, 1, 2.0)
    assert cache.warnings() == []


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_corrupt_local_object_is_deleted_and_reported(tmp_path: Path, damage: str) -> None:
    cache = open_cache(_local(tmp_path))
    key = _key(damage)
    cache.put(key, {"m.ptx": b"p" * 100}, META)
    path = tmp_path / "cache" / "objects" / key[:2] / key
    good = path.read_bytes()
    bad = {"truncate": good[:-1], "garbage": os.urandom(64), "flip": good[:-3] + b"!" + good[-2:]}
    path.write_bytes(bad[damage])
    assert cache.get(key) is None
    assert not path.exists()
    assert cache.stats.corrupt == 1
    (warning,) = cache.warnings()
    assert key in warning and "corrupt" in warning


def test_mode_off_is_no_cache_at_all(tmp_path: Path) -> None:
    cache = open_cache(_local(tmp_path, mode="off", remote="memory://x/y"))
    key = _key()
    cache.put(key, {"a": b"b"}, META)
    assert cache.get(key) is None

    async def locked() -> None:
        async with cache.key_lock(key):
            pass

    asyncio.run(locked())
    cache.close()
    assert not (tmp_path / "cache").exists()
    # Issue 43: the lookup is still a miss (hits + shared + misses = every lookup).
    assert cache.stats == CacheStats(misses=1, cache_off=1)


def test_bad_arguments_are_cache_errors(tmp_path: Path) -> None:
    cache = open_cache(_local(tmp_path))
    with pytest.raises(CacheKeyError):
        cache.get("../etc/passwd")
    with pytest.raises(CacheKeyError, match="meta"):
        cache.put(_key(), {"a": b""}, {"when": object()})
    with pytest.raises(CacheSettingsError, match="mode"):
        CacheSettings(local_dir=tmp_path, mode="sometimes")
    with pytest.raises(CacheSettingsError, match="timeout"):
        CacheSettings(local_dir=tmp_path, timeout=0)


def test_local_concurrent_writers_exactly_one_wins(tmp_path: Path) -> None:
    key = _key("race")
    caches = [open_cache(_local(tmp_path)) for _ in range(8)]
    barrier = threading.Barrier(8)
    payload = {"big": os.urandom(1 << 20)}

    def write(c: Any) -> None:
        barrier.wait()
        c.put(key, payload, META)

    threads = [threading.Thread(target=write, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.stats.puts for c in caches) == 1
    assert [p.name for p in (tmp_path / "cache" / "objects" / key[:2]).iterdir()] == [key]


# -- remote tier details ------------------------------------------------------------------------


def test_missing_extra_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError
    cache = open_cache(_local(tmp_path, remote="s3://bucket/prefix"))
    key = _key()
    assert cache.get(key) is None
    cache.put(key, {"a": b"b"}, META)
    assert cache.get(key) is not None
    cache.close()
    (warning,) = cache.warnings()
    assert "pip install 'metrale-orch[s3]'" in warning
    assert cache.stats.remote_disabled == 1


def test_unknown_protocol_is_one_warning(tmp_path: Path) -> None:
    cache = open_cache(_local(tmp_path, remote="nosuchproto://x/y"))
    assert cache.get(_key()) is None
    assert cache.get(_key()) is None
    (warning,) = cache.warnings()
    assert "nosuchproto://x/y" in warning


def test_breaker_after_success_needs_threshold_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_cat = memory.MemoryFileSystem.cat_file

    def flaky(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(path)
        if len(calls) == 1:
            return real_cat(self, path, *args, **kwargs)
        raise ConnectionError("flaky network")

    monkeypatch.setattr(memory.MemoryFileSystem, "cat_file", flaky)
    url = f"memory://breaker-{uuid.uuid4().hex[:8]}/p"
    cache = open_cache(_local(tmp_path, remote=url, failure_threshold=3))
    for _ in range(6):
        assert cache.get(_key()) is None
    assert len(calls) == 4  # 1 success, then 3 failures open the breaker
    assert cache.stats.errors == 3 and cache.stats.misses == 6
    (warning,) = cache.warnings()
    assert "after 3 failed calls" in warning and "flaky network" in warning


def test_forbidden_writes_keep_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"memory://ro-{uuid.uuid4().hex[:8]}/p"
    key = _key()
    with open_cache(_local(tmp_path / "a", remote=url)) as writer:
        writer.put(key, {"a": b"b"}, META)

    def refuse(self: Any, path: str, data: bytes, mode: str = "overwrite") -> None:
        raise PermissionError("Access Denied")

    monkeypatch.setattr(memory.MemoryFileSystem, "pipe_file", refuse)
    cache = open_cache(_local(tmp_path / "b", remote=url, background_uploads=False))
    for _ in range(4):
        cache.put(_key(), {"x": b"y"}, META)
    hit = open_cache(_local(tmp_path / "c", remote=url)).get(key)
    assert hit is not None and hit.tier == "remote"
    assert cache.get(key) is not None  # reads still go to the remote
    (warning,) = cache.warnings()
    assert "refuses writes" in warning
    assert cache.stats.errors == 1 and cache.stats.remote_disabled == 0


def test_background_uploads_finish_on_close(tmp_path: Path) -> None:
    url = f"memory://bg-{uuid.uuid4().hex[:8]}/p"
    keys = [_key(str(i)) for i in range(20)]
    cache = open_cache(_local(tmp_path / "a", remote=url, background_uploads=True))
    for key in keys:
        cache.put(key, {"o": key.encode()}, META)
    cache.close()
    assert cache.stats.uploads == 20
    reader = open_cache(_local(tmp_path / "b", remote=url))
    assert all(reader.get(k) is not None for k in keys)
    assert reader.stats.remote_hits == 20


def test_settings_from_config(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.metrale-orch]\ncache = "s3://b/p"\ncache_namespace = "n1"\n'
        "storage_options = {anon = true}\n"
    )
    env = {"METRALE_ORCH_LOCAL_CACHE": str(tmp_path / "lc"), "METRALE_ORCH_CACHE_MODE": "read-only"}
    settings = CacheSettings.from_config(load_config(tmp_path, env))
    assert settings.remote == "s3://b/p" and settings.mode == "read-only"
    assert settings.namespace == "n1" and settings.local_dir == tmp_path / "lc"
    assert dict(settings.storage_options) == {"anon": True} and settings.timeout == 2.0


# -- stats --------------------------------------------------------------------------------------


def test_stats_round_trip_add_and_summary(tmp_path: Path) -> None:
    a = CacheStats(local_hits=2, misses=1, bytes_down=2048, seconds_saved=1.25)
    b = CacheStats(remote_hits=3, timeouts=1, bytes_up=10, seconds_saved=0.5, remote_disabled=1)
    total = a + b
    assert (total.local_hits, total.remote_hits, total.timeouts) == (2, 3, 1)
    assert total.seconds_saved == pytest.approx(1.75)
    assert CacheStats.from_dict(total.to_dict()) == total
    line = total.summary_line()
    assert line.startswith("cache: 2 local hits, 3 remote hits, 1 miss (1 timeout)")
    assert "1.8 s of compiling saved" in line and "remote off" in line
    path = tmp_path / "build" / "cache-stats.json"
    write_stats(path, total)
    assert read_stats(path) == total
    path.write_text('{"misses": -1}')
    with pytest.raises(CacheStatsError, match=r"cache-stats\.json"):
        read_stats(path)


def test_stats_count_shared_lookups_in_their_own_words(tmp_path: Path) -> None:
    # Issue 35: the modules another target obtained in the run were left out of the line.
    stats = CacheStats(local_hits=2, remote_hits=1, shared=120, misses=69) + CacheStats(shared=1)
    assert stats.lookups == 2 + 1 + 121 + 69
    line = stats.summary_line()
    assert line.startswith("cache: 2 local hits, 1 remote hit, 121 shared, 69 misses; "), line
    path = tmp_path / "cache-stats.json"
    write_stats(path, stats)
    assert read_stats(path) == stats and json.loads(path.read_text())["shared"] == 121


def test_an_entry_this_run_stored_is_shared_not_a_hit(tmp_path: Path) -> None:
    # Another worker process of the same run compiled it: served, counted as shared.
    cache = open_cache(_local(tmp_path))
    key = "0" * 32
    cache.put(key, {"a.ptx": b"x"}, {"compile_seconds": 2.0, RUN_META: "run-1"})
    with cache.track() as mine:
        same = cache.get(key, run="run-1")
        other = cache.get(key, run="run-2")
        cache.count_shared()
    assert same is not None and same.shared and other is not None and not other.shared
    assert (mine.shared, mine.local_hits, mine.seconds_saved) == (2, 1, 2.0)


# -- housekeeping -------------------------------------------------------------------------------


def _fill(tmp_path: Path, n: int, size: int) -> list[str]:
    cache = open_cache(_local(tmp_path))
    keys = []
    for i in range(n):
        key = _key(str(i))
        cache.put(key, {"o": bytes([i]) * size}, META)
        path = tmp_path / "cache" / "objects" / key[:2] / key
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # i-th oldest use
        keys.append(key)
    return keys


def test_gc_removes_least_recently_used(tmp_path: Path) -> None:
    keys = _fill(tmp_path, 6, 1000)
    cache = open_cache(_local(tmp_path))
    assert cache.get(keys[0]) is not None  # a hit makes the oldest the newest
    obj_size = (tmp_path / "cache" / "objects" / keys[1][:2] / keys[1]).stat().st_size
    with open(tmp_path / "cache" / "objects" / keys[1][:2] / keys[1], "rb") as held:  # a reader
        result = gc_local(tmp_path / "cache", 3 * obj_size)
        assert decode_object(keys[1], held.read()).outputs["o"] == bytes([1]) * 1000
    assert result.removed == 3 and result.objects_after == 3
    assert result.bytes_after <= 3 * obj_size
    survivors = {k for k in keys if cache.get(k) is not None}
    assert survivors == {keys[0], keys[4], keys[5]}


def test_verify_removes_bad_objects(tmp_path: Path) -> None:
    keys = _fill(tmp_path, 4, 100)
    bad = tmp_path / "cache" / "objects" / keys[2][:2] / keys[2]
    bad.write_bytes(bad.read_bytes()[:-5])
    result = verify_local(tmp_path / "cache")
    assert (result.checked, result.ok) == (4, 3)
    assert [b.key for b in result.bad] == [keys[2]] and "truncated" in result.bad[0].reason
    assert not bad.exists()
    assert verify_local(tmp_path / "cache").bad == ()


@pytest.mark.parametrize(
    ("text", "size"), [("500M", 500 * 2**20), ("2G", 2 * 2**30), ("4096", 4096), ("1.5KiB", 1536)]
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_junk() -> None:
    with pytest.raises(SizeError, match="500M"):
        parse_size("lots")


# -- CLI ----------------------------------------------------------------------------------------


def _cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"METRALE_ORCH_LOCAL_CACHE": str(tmp_path / "cache")}
    code = main(["--root", str(tmp_path), *argv], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_stats(tmp_path: Path) -> None:
    _fill(tmp_path, 2, 10)
    code, out, _ = _cli(tmp_path, "cache", "stats")
    assert code == 0 and "no statistics yet" in out and "local: 2 objects" in out
    write_stats(tmp_path / "build" / "cache-stats.json", CacheStats(local_hits=7))
    code, out, _ = _cli(tmp_path, "cache", "stats", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["last_run"]["local_hits"] == 7 and doc["local"]["objects"] == 2
    code, out, _ = _cli(tmp_path, "cache", "stats")
    assert "last run: cache: 7 local hits" in out


def test_cli_gc_and_verify(tmp_path: Path) -> None:
    keys = _fill(tmp_path, 3, 10)
    code, out, _ = _cli(tmp_path, "cache", "gc", "--max-size", "0")
    assert code == 0 and "removed 3 objects" in out
    keys = _fill(tmp_path, 2, 10)
    bad = tmp_path / "cache" / "objects" / keys[0][:2] / keys[0]
    bad.write_bytes(b"junk")
    code, out, _ = _cli(tmp_path, "cache", "verify")
    assert code == 1 and f"bad object {keys[0]}" in out and "1 ok, 1 bad" in out
    code, out, _ = _cli(tmp_path, "cache", "verify")
    assert code == 0
    code, _, err = _cli(tmp_path, "cache", "gc", "--max-size", "huge")
    assert code == 2 and err.startswith("error: size 'huge'")
