"""``metrale-orch cache stats|gc|verify``: look after the content-addressed cache.

- ``stats [--json]``: the last build's cache statistics (``<build>/cache-stats.json``)
  and what the local tier holds.
- ``gc --max-size SIZE``: drop least-recently-used local objects down to SIZE
  (``500M``, ``2G``, bytes); safe while builds run.
- ``verify``: re-hash every local object, remove bad ones; exit 1 if any was bad.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from metrale_orch.cache import (
    CacheStats,
    gc_local,
    parse_size,
    read_stats,
    summarize_local,
    verify_local,
)

if TYPE_CHECKING:
    from metrale_orch.cli import Context

STATS_FILE = "cache-stats.json"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cache stats|gc|verify`` to ``sub``."""
    cache = sub.add_parser("cache", help="inspect and tidy the build cache")
    csub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    stats = csub.add_parser("stats", help="last build's cache statistics and the local tier's size")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(run=run_stats)

    gc = csub.add_parser("gc", help="bound the local tier (least recently used go first)")
    gc.add_argument("--max-size", required=True, metavar="SIZE", help="e.g. 500M, 2G, or bytes")
    gc.add_argument("--json", action="store_true", help="print JSON")
    gc.set_defaults(run=run_gc)

    verify = csub.add_parser("verify", help="re-hash every local object; remove bad ones")
    verify.add_argument("--json", action="store_true", help="print JSON")
    verify.set_defaults(run=run_verify)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def run_stats(args: argparse.Namespace, ctx: Context) -> int:
    config = ctx.config()
    path = config.build_dir / STATS_FILE
    last: CacheStats | None
    try:
        last = read_stats(path)
    except FileNotFoundError:
        last = None
    local = summarize_local(config.local_cache)
    if args.json:
        doc = {
            "last_run": None if last is None else last.to_dict(),
            "local": local.to_dict(),
            "mode": config.cache_mode,
            "remote": config.cache,
        }
        print(json.dumps(doc, indent=2, sort_keys=True), file=ctx.out)
        return 0
    if last is None:
        print(f"last run: no statistics yet ({STATS_FILE} is written by a build)", file=ctx.out)
    else:
        print(f"last run: {last.summary_line()}", file=ctx.out)
    print(f"local: {local.objects} objects, {_mib(local.bytes)} in {local.directory}", file=ctx.out)
    print(f"remote: {config.cache or '(none)'}  mode: {config.cache_mode}", file=ctx.out)
    return 0


def run_gc(args: argparse.Namespace, ctx: Context) -> int:
    config = ctx.config()
    limit = parse_size(args.max_size)
    result = gc_local(config.local_cache, limit)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True), file=ctx.out)
        return 0
    print(
        f"removed {result.removed} objects ({_mib(result.removed_bytes)}); "
        f"{config.local_cache} now holds {result.objects_after} objects, "
        f"{_mib(result.bytes_after)} (limit {_mib(limit)})",
        file=ctx.out,
    )
    return 0


def run_verify(args: argparse.Namespace, ctx: Context) -> int:
    config = ctx.config()
    result = verify_local(config.local_cache)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True), file=ctx.out)
    else:
        for bad in result.bad:
            print(f"bad object {bad.key}: {bad.reason} (removed)", file=ctx.out)
        print(
            f"checked {result.checked} objects in {config.local_cache}: "
            f"{result.ok} ok, {len(result.bad)} bad",
            file=ctx.out,
        )
    return 1 if result.bad else 0
