"""The cache under hostile conditions (issue 11), and the API the build relies on.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/cache/test_cache_hardening.py``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from metrale_orch.cache import (
    open_cache,
)
from tests.support.cache_hardening import META, OUTPUTS, _key, _path, _settings
from tests.support.servers import (
    ObjectServer,
    s3_auth_enforced,
)


def test_s3_object_over_the_limit_is_refused_after_limit_plus_one_bytes(
    s3: ObjectServer, tmp_path: Path
) -> None:
    url = s3.url(f"big-{uuid.uuid4().hex[:8]}")
    key = _key("big")
    big = {"big.cubin": os.urandom(20_000)}
    with open_cache(_settings(tmp_path, "w", remote=url, storage_options=s3.storage_options)) as w:
        w.put(key, big, META)
    reader = open_cache(
        _settings(
            tmp_path,
            "r",
            remote=url,
            storage_options=s3.storage_options,
            mode="read-only",
            max_object_size=4096,
        )
    )
    assert reader.get(key) is None
    assert reader.stats.bytes_down == 4097 and reader.stats.corrupt == 1
    (warning,) = reader.warnings()
    assert "more than the 4096-byte limit" in warning
    assert not _path(tmp_path / "r", key).exists()
    roomy = open_cache(_settings(tmp_path, "r2", remote=url, storage_options=s3.storage_options))
    hit = roomy.get(key)
    assert hit is not None and dict(hit.outputs) == big


def test_missing_bucket_is_one_warning_and_the_remote_goes_off(
    s3: ObjectServer, tmp_path: Path
) -> None:
    url = f"s3://nosuch-{uuid.uuid4().hex[:10]}/prefix"
    cache = open_cache(_settings(tmp_path, remote=url, storage_options=s3.storage_options))
    mark = s3.mark()
    for i in range(8):
        key = _key(f"m{i}")
        assert cache.get(key) is None
        cache.put(key, OUTPUTS, META)
    cache.close()
    (warning,) = cache.warnings()
    assert url in warning and "does not exist" in warning and "create it" in warning
    assert "off for the rest of this run" in warning
    assert cache.stats.errors == 1 and cache.stats.remote_disabled == 1
    assert cache.stats.misses == 8 and cache.stats.puts == 8  # the local tier kept working
    assert len(s3.log()[mark:]) == 1  # one GET, then nothing


def test_denied_access_switches_a_proven_remote_off_at_once(
    s3: ObjectServer, tmp_path: Path
) -> None:
    opts = dict(s3.storage_options, key="unknown", secret="nope")
    cache = open_cache(_settings(tmp_path, remote=s3.url("denied"), storage_options=opts))
    assert cache.get(_key("before")) is None  # moto does not check keys yet: proven
    with s3_auth_enforced(s3):
        mark = s3.mark()
        for _ in range(5):
            assert cache.get(_key("after")) is None
        requests = len(s3.log()[mark:])
    assert requests == 1
    (warning,) = cache.warnings()
    assert s3.url("denied") in warning and "denies access" in warning
    assert "check its credentials" in warning and "off for the rest of this run" in warning
    assert cache.stats.errors == 1 and cache.stats.remote_disabled == 1
