"""The cache under hostile conditions (issue 11), and the API the build relies on.

- Local entries that are not plain objects (FIFO, symlink, directory, huge,
  unreadable, wrong size) are refused without blocking or reading them whole,
  removed or reported once, and never end ``cache gc``/``verify`` in an
  internal error.
- Remote answers are bounded; garbage counts against the breaker; a missing
  bucket, denied access and a closed port are one clear warning each.
- ``get(accept=...)``, ``put(replace=True)`` and ``track()``.

Remote cases use real servers on 127.0.0.1 (moto, a tiny garbage HTTP server).

The tests of this topic that start processes are in
``tests/scenarios/cache/test_cache_hardening.py``.
"""

from __future__ import annotations

import errno
import io
import os
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import fsspec.core
import pytest

from metrale_orch.cache import (
    Cache,
    CacheSettings,
    CacheSettingsError,
    CacheStats,
    gc_local,
    open_cache,
    read_stats,
    verify_local,
)
from metrale_orch.cache import bucket as remote_mod
from metrale_orch.cache import local as local_mod
from metrale_orch.cache import maintenance as maintenance_mod
from metrale_orch.cache.objects import decode_object, encode_object
from metrale_orch.cli import main
from tests.support.cache_hardening import META, OUTPUTS, _key, _path, _settings
from tests.support.servers import (
    garbage_server,
    refused_endpoint,
    silent_endpoint,
)

T = TypeVar("T")


def _within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, failing (instead of hanging the suite) if it takes longer than ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (blocked on a cache entry?)"
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


# -- the local tier: only regular files, bounded ------------------------------------------------


def test_fifo_at_an_object_path_is_refused_without_blocking(tmp_path: Path) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key("fifo")
    path = _path(tmp_path / "cache", key)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert _within(10, lambda: cache.get(key)) is None
    assert not path.exists() and not path.is_fifo()
    assert cache.stats.corrupt == 1 and cache.stats.misses == 1
    (warning,) = cache.warnings()
    assert key in warning and "fifo, not a regular file" in warning and "deleted it" in warning
    assert str(tmp_path / "cache") in warning
    cache.put(key, OUTPUTS, META)  # the slot is usable again
    hit = cache.get(key)
    assert hit is not None and dict(hit.outputs) == OUTPUTS


@pytest.mark.parametrize("target", ["/dev/zero", "valid-object"])
def test_symlink_at_an_object_path_is_refused_never_followed(tmp_path: Path, target: str) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key("symlink")
    path = _path(tmp_path / "cache", key)
    path.parent.mkdir(parents=True)
    pointee = Path(target)
    if target == "valid-object":  # even a good object elsewhere is not served through a link
        pointee = tmp_path / "elsewhere"
        pointee.write_bytes(encode_object(key, OUTPUTS, META))
    path.symlink_to(pointee)
    assert _within(10, lambda: cache.get(key)) is None
    assert not path.is_symlink()
    assert pointee.exists()  # the link went, not what it pointed at
    assert cache.stats.corrupt == 1
    (warning,) = cache.warnings()
    assert "symbolic link, not a regular file" in warning and key in warning


def test_directory_at_a_key_path_is_removed_not_warned_on_every_build(tmp_path: Path) -> None:
    key = _key("dir")
    path = _path(tmp_path / "cache", key)
    (path / "inner").mkdir(parents=True)
    (path / "inner" / "f").write_text("x")
    first = open_cache(_settings(tmp_path))
    assert first.get(key) is None
    (warning,) = first.warnings()
    assert "a directory, not a regular file" in warning and key in warning
    assert not path.exists()
    second = open_cache(_settings(tmp_path))  # the next build: nothing left to warn about
    assert second.get(key) is None
    second.put(key, OUTPUTS, META)
    assert second.get(key) is not None
    assert second.warnings() == [] and second.stats.corrupt == 0 and second.stats.puts == 1


def test_huge_object_is_refused_without_reading_it(tmp_path: Path) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key("huge")
    path = _path(tmp_path / "cache", key)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as fh:  # 3 GiB, sparse: a valid prefix, then zeros
        fh.write(encode_object(key, OUTPUTS, META)[:64])
        fh.truncate(3 * 1024**3)
    tracemalloc.start()
    try:
        assert _within(30, lambda: cache.get(key)) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, f"read {peak} bytes of a 3 GiB object"
    assert not path.exists() and cache.stats.corrupt == 1
    (warning,) = cache.warnings()
    assert "more than the 2147483648-byte limit" in warning


def test_object_over_the_configured_limit_is_neither_stored_nor_read(tmp_path: Path) -> None:
    small = open_cache(_settings(tmp_path, max_object_size=1024))
    key = _key("limit")
    small.put(key, {"big": b"x" * 4096}, META)
    assert not _path(tmp_path / "cache", key).exists()
    (warning,) = small.warnings()
    assert "more than the 1024-byte limit" in warning and "not storing it" in warning
    open_cache(_settings(tmp_path)).put(key, {"big": b"x" * 4096}, META)
    assert small.get(key) is None and small.stats.corrupt == 1
    assert not _path(tmp_path / "cache", key).exists()
    with pytest.raises(CacheSettingsError, match="max_object_size"):
        _settings(tmp_path, max_object_size=0)


@pytest.mark.parametrize("change", ["append", "cut-payload", "cut-header"])
def test_size_other_than_the_header_declares_is_refused(tmp_path: Path, change: str) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key(change)
    cache.put(key, OUTPUTS, META)
    path = _path(tmp_path / "cache", key)
    good = path.read_bytes()
    bad = {"append": good + b"\0" * 10, "cut-payload": good[:-10], "cut-header": good[:40]}
    path.write_bytes(bad[change])
    assert cache.get(key) is None and not path.exists()
    (warning,) = cache.warnings()
    expected = {"append": "trailing garbage", "cut-payload": "truncated", "cut-header": "truncated"}
    assert expected[change] in warning


def _refuse_open(monkeypatch: pytest.MonkeyPatch, victim: Path) -> None:
    """Make ``victim`` unreadable (EACCES), whoever runs the tests (root reads anything)."""
    real_open = os.open

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if Path(os.fsdecode(path)) == victim:
            raise PermissionError(errno.EACCES, "Permission denied", str(victim))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(local_mod.os, "open", fake_open)


def test_unreadable_object_is_an_error_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key("eacces")
    cache.put(key, OUTPUTS, META)
    path = _path(tmp_path / "cache", key)
    _refuse_open(monkeypatch, path)
    assert cache.get(key) is None
    assert cache.stats.errors == 1 and cache.stats.misses == 1
    (warning,) = cache.warnings()
    assert "cannot be read (PermissionError: Permission denied)" in warning
    assert "deleted it" in warning and not path.exists()


def test_bad_entry_that_cannot_be_removed_is_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = open_cache(_settings(tmp_path))
    key = _key("stuck")
    path = _path(tmp_path / "cache", key)
    path.mkdir(parents=True)

    def refuse(self: Any, key: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(local_mod.LocalTier, "remove", refuse)
    for _ in range(3):
        assert cache.get(key) is None
    (warning,) = cache.warnings()
    assert "cannot be removed (PermissionError: Permission denied)" in warning
    assert f"remove {path} by hand" in warning
    assert cache.stats.corrupt == 3 and cache.stats.misses == 3


# -- housekeeping: gc and verify never end in an internal error ---------------------------------


def _odd_cache(local_dir: Path) -> dict[str, Path]:
    """A local tier holding one good object and one of every odd entry."""
    writer = open_cache(CacheSettings(local_dir=local_dir))
    entries: dict[str, Path] = {}
    for name in ("good", "fifo", "devzero", "dir", "huge", "unreadable", "corrupt"):
        key = _key(name)
        path = _path(local_dir, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entries[name] = path
        if name in ("good", "unreadable", "corrupt"):
            writer.put(key, OUTPUTS, META)
    os.mkfifo(entries["fifo"])
    entries["devzero"].symlink_to("/dev/zero")
    (entries["dir"] / "sub").mkdir(parents=True)
    with open(entries["huge"], "wb") as fh:
        fh.truncate(3 * 1024**3)
    corrupt = entries["corrupt"]
    corrupt.write_bytes(corrupt.read_bytes()[:-1] + b"!")
    return entries


def _cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"METRALE_ORCH_LOCAL_CACHE": str(tmp_path / "cache")}
    code = main(["--root", str(tmp_path), *argv], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_verify_reports_and_removes_every_odd_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _odd_cache(tmp_path / "cache")
    _refuse_open(monkeypatch, entries["unreadable"])
    code, out, err = _within(60, lambda: _cli(tmp_path, "cache", "verify"))
    assert "internal error" not in err and err == ""
    assert code == 1
    assert "checked 7 objects" in out and "1 ok, 6 bad" in out
    for name, reason in [
        ("fifo", "a fifo, not a regular file"),
        ("devzero", "a symbolic link, not a regular file"),
        ("dir", "a directory, not a regular file"),
        ("huge", "more than the 2147483648-byte limit"),
        ("unreadable", "unreadable (PermissionError: Permission denied)"),
        ("corrupt", "hash mismatch"),
    ]:
        (line,) = [
            ln for ln in out.splitlines() if ln.startswith(f"bad object {entries[name].name}:")
        ]
        assert reason in line and line.endswith("(removed)"), line
        assert not entries[name].exists() and not entries[name].is_symlink()
    code, out, err = _cli(tmp_path, "cache", "verify")
    assert code == 0 and "1 ok, 0 bad" in out and err == ""


def test_cli_gc_and_stats_remove_odd_entries_without_reading_them(tmp_path: Path) -> None:
    entries = _odd_cache(tmp_path / "cache")
    code, out, err = _within(60, lambda: _cli(tmp_path, "cache", "stats"))
    assert code == 0 and err == "" and "local: 4 objects" in out  # regular files only
    code, out, err = _within(60, lambda: _cli(tmp_path, "cache", "gc", "--max-size", "1G"))
    assert code == 0 and err == ""
    assert "removed 4 unusable entries" in out and "now holds 3 objects" in out
    for name in ("fifo", "devzero", "dir", "huge"):
        assert not entries[name].exists() and not entries[name].is_symlink()
    assert entries["good"].exists()


def test_gc_and_verify_report_what_they_cannot_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "cache"
    key = _key("stuck")
    (_path(local, key) / "sub").mkdir(parents=True)

    def refuse(path: Path) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(maintenance_mod, "remove_entry", refuse)
    result = gc_local(local, 0)
    (problem,) = result.problems
    assert str(_path(local, key)) in problem and "remove it by hand" in problem
    code, out, err = _cli(tmp_path, "cache", "gc", "--max-size", "0")
    assert code == 1 and err == "" and "cannot be removed" in out
    (bad,) = verify_local(local).bad
    assert not bad.removed and "Permission denied" in bad.error
    code, out, err = _cli(tmp_path, "cache", "verify")
    assert code == 1 and err == "" and "remove it by hand" in out


def test_unlistable_shard_is_a_problem_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = tmp_path / "cache"
    open_cache(CacheSettings(local_dir=local)).put(_key(), OUTPUTS, META)
    real_scandir = os.scandir

    def fake_scandir(path: Any = ".") -> Any:
        if Path(os.fsdecode(path)).parent == local / "objects":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(local_mod.os, "scandir", fake_scandir)
    result = verify_local(local)
    assert result.checked == 0 and len(result.problems) == 1
    assert "cannot be listed (Permission denied)" in result.problems[0]
    assert len(gc_local(local, 0).problems) == 1


# -- remote: bounded reads, garbage, missing bucket, denied access, closed port -----------------


def test_garbage_answers_are_failures_for_the_breaker(tmp_path: Path) -> None:
    with garbage_server() as server:
        cache = open_cache(
            _settings(
                tmp_path,
                remote=server.url("p"),
                storage_options=server.storage_options,
                mode="read-only",
                failure_threshold=3,
            )
        )
        for _ in range(8):
            assert cache.get(_key("garbage")) is None
        requests = server.log()
    assert [m for m, _ in requests] == ["GET"] * 3  # then off: no more requests
    assert cache.stats.corrupt == 3 and cache.stats.misses == 8 and cache.stats.remote_disabled == 1
    off = [w for w in cache.warnings() if "off for the rest of this run" in w]
    assert len(off) == 1
    assert "after 3 failed calls" in off[0] and "failed verification" in off[0]
    assert server.url("p") in off[0]


def test_garbage_server_costs_about_one_deadline_per_run(tmp_path: Path) -> None:
    timeout = 1.0
    with garbage_server() as server:
        cache = open_cache(
            _settings(
                tmp_path,
                remote=server.url("p"),
                storage_options=server.storage_options,
                timeout=timeout,
            )
        )
        start = time.monotonic()
        for i in range(8):  # eight modules: look up, compile, publish
            key = _key(f"module-{i}")
            assert cache.get(key) is None
            cache.put(key, OUTPUTS, META)
        cache.close()
        wall = time.monotonic() - start
    print(f"\ngarbage server: {wall:.2f} s for 8 modules (deadline {timeout} s)")
    assert cache.stats.remote_disabled == 1 and cache.stats.remote_hits == 0
    assert len([w for w in cache.warnings() if "off for the rest of this run" in w]) == 1
    assert wall < 4 * timeout + 2, f"a garbage server must cost about one deadline: {wall:.1f} s"


def test_remote_read_stops_at_the_limit_even_if_the_server_ignores_ranges(
    tmp_path: Path,
) -> None:
    limit = 64 * 1024
    with garbage_server(size=4 * 1024 * 1024) as server:
        cache = open_cache(
            _settings(
                tmp_path,
                remote=server.url("p"),
                storage_options=server.storage_options,
                mode="read-only",
                max_object_size=limit,
            )
        )
        assert cache.get(_key("endless")) is None
    assert cache.stats.bytes_down == limit + 1 and cache.stats.corrupt == 1
    (warning,) = cache.warnings()
    assert f"more than the {limit}-byte limit" in warning


@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_closed_port_is_reported_as_connection_refused(outage: str, tmp_path: Path) -> None:
    with silent_endpoint() as silent:
        endpoint = refused_endpoint() if outage == "refused" else silent
        opts = {
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        cache = open_cache(
            _settings(tmp_path, remote="s3://bucket/p", storage_options=opts, timeout=1.0)
        )
        assert cache.get(_key(outage)) is None
    (warning,) = cache.warnings()
    if outage == "refused":
        port = endpoint.rsplit(":", 1)[1]
        assert f"connection refused by 127.0.0.1:{port}" in warning
        assert (cache.stats.errors, cache.stats.timeouts) == (1, 0)
    else:
        assert "no answer within 1 s" in warning
        assert (cache.stats.errors, cache.stats.timeouts) == (0, 1)


def test_proven_remote_goes_off_after_threshold_garbage_answers(tmp_path: Path) -> None:
    url = f"memory://garbage-{uuid.uuid4().hex[:8]}/p"
    fs, root = fsspec.core.url_to_fs(url)
    good = _key("good")
    with open_cache(_settings(tmp_path, "w", remote=url, background_uploads=False)) as writer:
        writer.put(good, OUTPUTS, META)
    bad = [_key(f"bad{i}") for i in range(5)]
    for key in bad:
        fs.pipe_file(remote_mod.remote_object_path(root, "", key), b"garbage" * 10)
    cache = open_cache(_settings(tmp_path, remote=url, mode="read-only", failure_threshold=3))
    assert cache.get(_key("absent")) is None  # a clean not-found proves the remote
    assert cache.get(bad[0]) is None and cache.get(bad[1]) is None
    hit = cache.get(good)  # a verified answer resets the count
    assert hit is not None and hit.tier == "remote"
    for key in bad[2:]:
        assert cache.get(key) is None
    assert cache.stats.remote_disabled == 1 and cache.stats.corrupt == 5
    assert open_cache(_settings(tmp_path, "x")).get(good) is None  # sanity: a separate tier
    assert cache.get(_key("later")) is None and cache.stats.corrupt == 5


def test_fifo_in_a_file_remote_is_refused_without_blocking(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/remote"
    key = _key("fifo")
    path = Path(remote_mod.remote_object_path(str(tmp_path / "remote"), "", key))
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    cache = open_cache(_settings(tmp_path, remote=url, mode="read-only", timeout=5.0))
    assert _within(10, lambda: cache.get(key)) is None
    assert cache.stats.corrupt == 1 and cache.stats.timeouts == 0
    assert "fifo, not a regular file" in cache.warnings()[0]


# -- validity: accept, replace ------------------------------------------------------------------


def _meta(deps: str) -> dict[str, Any]:
    return dict(META, deps=deps)


def _accept(deps: str) -> Callable[[Any], bool]:
    return lambda meta: meta.get("deps") == deps


def test_rejected_local_entry_is_kept_and_the_remote_replaces_it(tmp_path: Path) -> None:
    url = f"memory://accept-{uuid.uuid4().hex[:8]}/p"
    key = _key("accept")
    with open_cache(_settings(tmp_path, "a", remote=url, background_uploads=False)) as a:
        a.put(key, {"m.ptx": b"fresh"}, _meta("v2"))
    b = open_cache(_settings(tmp_path, "b"))  # no remote: a stale local entry
    b.put(key, {"m.ptx": b"stale"}, _meta("v1"))
    path = _path(tmp_path / "b", key)

    local_only = open_cache(_settings(tmp_path, "b"))
    assert local_only.get(key, accept=_accept("v2")) is None
    assert path.exists()  # kept: the caller replaces it
    s = local_only.stats
    assert (s.misses, s.rejected, s.corrupt, s.local_hits) == (1, 1, 0, 0)
    assert local_only.warnings() == []

    both = open_cache(_settings(tmp_path, "b", remote=url))
    hit = both.get(key, accept=_accept("v2"))
    assert hit is not None and hit.tier == "remote" and hit.outputs["m.ptx"] == b"fresh"
    assert (both.stats.remote_hits, both.stats.misses, both.stats.rejected) == (1, 0, 0)
    assert decode_object(key, path.read_bytes()).outputs["m.ptx"] == b"fresh"  # replaced
    again = both.get(key, accept=_accept("v2"))
    assert again is not None and again.tier == "local"


def test_rejected_remote_entry_is_not_copied_to_the_local_tier(tmp_path: Path) -> None:
    url = f"memory://reject-{uuid.uuid4().hex[:8]}/p"
    key = _key("reject")
    with open_cache(_settings(tmp_path, "a", remote=url, background_uploads=False)) as a:
        a.put(key, {"m.ptx": b"old"}, _meta("v1"))
    cache = open_cache(_settings(tmp_path, "b", remote=url))
    assert cache.get(key, accept=_accept("v2")) is None
    assert not _path(tmp_path / "b", key).exists()
    s = cache.stats
    assert (s.misses, s.rejected, s.remote_hits, s.puts, s.corrupt) == (1, 1, 0, 0, 0)
    assert s.bytes_down > 0 and s.seconds_saved == 0
    hit = cache.get(key, accept=_accept("v1"))
    assert hit is not None and hit.tier == "remote"


def test_put_replace_overwrites_the_local_entry_and_leaves_the_remote(tmp_path: Path) -> None:
    url = f"memory://replace-{uuid.uuid4().hex[:8]}/p"
    key = _key("replace")
    cache = open_cache(_settings(tmp_path, remote=url, background_uploads=False))
    cache.put(key, {"m.ptx": b"one"}, _meta("v1"))
    cache.put(key, {"m.ptx": b"two"}, _meta("v2"))  # create-only: ignored
    hit = cache.get(key)
    assert hit is not None and hit.outputs["m.ptx"] == b"one"
    cache.put(key, {"m.ptx": b"two"}, _meta("v2"), replace=True)
    hit = cache.get(key)
    assert hit is not None and hit.outputs["m.ptx"] == b"two" and hit.meta["deps"] == "v2"
    assert cache.warnings() == [] and cache.stats.errors == 0
    assert (cache.stats.puts, cache.stats.uploads) == (2, 1)
    remote = open_cache(_settings(tmp_path, "fresh", remote=url)).get(key)
    assert remote is not None and remote.outputs["m.ptx"] == b"one"  # left as it was
    leftovers = [p.name for p in _path(tmp_path / "cache", key).parent.iterdir()]
    assert leftovers == [key]  # no temporaries left


# -- statistics ---------------------------------------------------------------------------------


def test_rejected_counter_round_trips_and_old_files_still_read(tmp_path: Path) -> None:
    stats = CacheStats(misses=3, rejected=2, local_hits=1)
    assert CacheStats.from_dict(stats.to_dict()) == stats
    assert (stats + CacheStats(rejected=1)).rejected == 3
    assert "3 misses, 2 rejected as stale" in stats.summary_line()
    assert "rejected" not in CacheStats(misses=1).summary_line()
    old = tmp_path / "cache-stats.json"
    old.write_text('{"local_hits": 4, "misses": 1, "seconds_saved": 2.5}\n')
    assert read_stats(old) == CacheStats(local_hits=4, misses=1, seconds_saved=2.5)


def test_track_gives_each_thread_exactly_its_own_counts(tmp_path: Path) -> None:
    cache = open_cache(_settings(tmp_path))
    shared = _key("shared")
    cache.put(shared, OUTPUTS, META)
    n = 6
    barrier = threading.Barrier(n)
    results: dict[int, CacheStats] = {}

    def task(i: int) -> None:
        with cache.track() as mine:
            barrier.wait()
            for j in range(i + 1):  # task i: i+1 misses and puts, then i+1 hits
                key = _key(f"{i}-{j}")
                assert cache.get(key) is None
                cache.put(key, OUTPUTS, META)
                assert cache.get(shared) is not None
        results[i] = mine

    threads = [threading.Thread(target=task, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, mine in results.items():
        assert (mine.misses, mine.puts, mine.local_hits) == (i + 1, i + 1, i + 1), i
        assert mine.seconds_saved == pytest.approx(i + 1)
    total = sum(results.values(), CacheStats())
    expected = cache.stats.copy()
    expected.puts -= 1  # the shared entry was put outside any tracker
    assert total == expected


def test_track_counts_background_uploads_queued_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real_put = remote_mod.RemoteStore.put

    def slow_put(self: remote_mod.RemoteStore, key: str, data: bytes) -> bool:
        assert gate.wait(30)
        return real_put(self, key, data)

    monkeypatch.setattr(remote_mod.RemoteStore, "put", slow_put)
    url = f"memory://track-{uuid.uuid4().hex[:8]}/p"
    cache = open_cache(_settings(tmp_path, remote=url, background_uploads=True))
    with cache.track() as outer:
        with cache.track() as inner:
            cache.put(_key("a"), OUTPUTS, META)
        cache.put(_key("b"), OUTPUTS, META)
    assert (outer.puts, inner.puts, outer.uploads) == (2, 1, 0)  # uploads still queued

    other: list[CacheStats] = []

    def elsewhere() -> None:  # a thread does not inherit a tracker
        with cache.track() as mine:
            gate.set()
            cache.flush()
        other.append(mine)

    with cache.track() as unrelated:
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        cache.flush()
    assert (outer.uploads, inner.uploads) == (2, 1)
    assert outer.bytes_up == cache.stats.bytes_up > 0
    assert other[0] == CacheStats() and unrelated == CacheStats()
    assert cache.stats.uploads == 2
    cache.close()


def test_track_without_a_cache_call_is_empty_and_caches_are_separate(tmp_path: Path) -> None:
    a = open_cache(_settings(tmp_path, "a"))
    b = open_cache(_settings(tmp_path, "b"))
    with a.track() as seen_by_a:
        assert b.get(_key()) is None
    assert seen_by_a == CacheStats() and b.stats.misses == 1
    off = Cache(_settings(tmp_path, "off", mode="off"))
    with off.track() as one_miss:
        assert off.get(_key()) is None
    assert one_miss == CacheStats(misses=1, cache_off=1)  # issue 43: a miss, cache off
