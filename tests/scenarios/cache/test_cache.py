"""The cache's keys, object format, local tier, breaker, housekeeping and CLI.

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/cache/test_cache.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from metrale_orch.cache import (
    cache_key,
    open_cache,
)
from tests.support.cache import META, _key, _local


def test_key_is_stable_across_processes() -> None:
    code = (
        "from metrale_orch.cache import cache_key; print(cache_key('n', {'b': b'\\x00', 'a': 1}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == cache_key("n", {"a": 1, "b": b"\0"})


def test_key_lock_serialises_processes(tmp_path: Path) -> None:
    settings = _local(tmp_path)
    key = _key("lock")
    child = (
        "import asyncio, sys\nfrom pathlib import Path\n"
        "from metrale_orch.cache import CacheSettings, open_cache\n"
        f"c = open_cache(CacheSettings(local_dir=Path({str(settings.local_dir)!r})))\n"
        "print('waiting', flush=True)\n"
        "async def main():\n"
        f"    async with c.key_lock({key!r}):\n"
        f"        print('hit' if c.get({key!r}) else 'miss', flush=True)\n"
        "asyncio.run(main())\n"
    )
    cache = open_cache(settings)

    async def hold() -> None:
        async with cache.key_lock(key):
            proc = subprocess.Popen(
                [sys.executable, "-c", child], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "waiting"
            await asyncio.sleep(0.3)  # let the child wait on the lock (not a timing assertion)
            cache.put(key, {"m": b"compiled once"}, META)
            holder.append(proc)

    holder: list[subprocess.Popen[str]] = []
    asyncio.run(hold())
    (proc,) = holder
    out, _ = proc.communicate(timeout=60)
    assert out.strip() == "hit"
