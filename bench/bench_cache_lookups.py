"""Cache lookups per second for small objects, per backend: memory, file, S3 (moto), GCS (emulator).

Each backend gets N small objects (1 KiB output); the benchmark times
remote hits (a fresh, empty local tier each round so every lookup goes to
the remote), remote misses, and local-tier hits as the reference floor. The
servers run in this process on 127.0.0.1 (ephemeral ports) and are stopped
at the end. Prints a table; writes nothing else (temporary dirs are removed).

    .venv/bin/python bench/bench_cache_lookups.py [--objects 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metrale_orch.cache import CacheSettings, cache_key, open_cache
from tests.support.servers import gcs_server, s3_server


@contextlib.contextmanager
def _backends(tmp: Path) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    with s3_server() as s3, gcs_server() as gcs:
        yield [
            ("memory", f"memory://bench-{uuid.uuid4().hex[:8]}/p", {}),
            ("file", f"file://{tmp}/remote", {}),
            ("s3 (moto)", s3.url("bench"), s3.storage_options),
            ("gcs (emulator)", gcs.url("bench"), gcs.storage_options),
        ]


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:10.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=200)
    args = parser.parse_args(argv)
    n = args.objects
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmpdir:
        tmp = Path(tmpdir)
        with _backends(tmp) as backends:
            for name, url, opts in backends:

                def settings(
                    local: str, url: str = url, opts: dict[str, Any] = opts
                ) -> CacheSettings:
                    return CacheSettings(
                        local_dir=tmp / f"{local}-{uuid.uuid4().hex[:6]}",
                        remote=url,
                        storage_options=opts,
                        timeout=10.0,
                    )

                keys = [cache_key("bench", {"i": i, "run": uuid.uuid4().hex}) for i in range(n)]
                with open_cache(settings("w")) as writer:
                    for key in keys:
                        # the GCS emulator drops a trailing b"\r": end with a fixed byte
                        writer.put(
                            key, {"m.ptx": os.urandom(1023) + b"."}, {"compile_seconds": 0.6}
                        )
                reader = open_cache(settings("r"))
                reader.get(cache_key("warm", {"x": 1}))  # open the store, build the client
                t = time.perf_counter()
                hits = sum(reader.get(k) is not None for k in keys)
                remote_hit = time.perf_counter() - t
                missing = [cache_key("bench-miss", {"i": i}) for i in range(n)]
                t = time.perf_counter()
                misses = sum(reader.get(k) is None for k in missing)
                remote_miss = time.perf_counter() - t
                t = time.perf_counter()
                local = sum(reader.get(k) is not None for k in keys)  # filled by the remote hits
                local_hit = time.perf_counter() - t
                reader.close()
                assert hits == misses == local == n, (name, hits, misses, local)
                rows.append(
                    (name, _rate(n, remote_hit), _rate(n, remote_miss), _rate(n, local_hit))
                )
    print(f"cache lookups per second, {n} objects of 1 KiB, one lookup at a time")
    header = ("backend", "remote hit/s*", "remote miss/s", "local hit/s")
    print(f"{header[0]:<16}{header[1]:>14}{header[2]:>14}{header[3]:>14}")
    for row in rows:
        print(f"{row[0]:<16}{row[1]:>14}{row[2]:>14}{row[3]:>14}")
    print("* a remote hit includes verifying it and filling the local tier (temp file + link)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
