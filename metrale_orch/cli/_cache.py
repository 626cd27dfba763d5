"""``metrale-orch cache stats|gc|verify``: look after the content-addressed cache.

- ``stats [--json]``: the last build's cache statistics (``<build>/cache-stats.json``)
  and what the local tier holds.
- ``gc --max-size SIZE``: drop least-recently-used local objects down to SIZE
  (``500M``, ``2G``, bytes), and every entry that can never be served (a
  directory, FIFO, symlink or device at an object path, an oversized object);
  safe while builds run. Exit 1 if something could not be listed or removed.
- ``verify``: re-hash every local object, remove bad ones; with ``cache_trusted_keys``
  check every signature too (an entry no trusted key signed is listed, kept); exit 1 if
  any was bad or untrusted.
- ``keygen PATH [--label L]``: write an Ed25519 private key to PATH (mode 0600, never
  over a file) and print its public key line for ``cache_trusted_keys``.

Both report what they find in the cache (FIFOs, symlinks, directories,
unreadable or huge files) as lines, never as an internal error. Each command imports
the cache package when it runs: the other commands (``check``, what pre-commit hooks
run) need none of its tiers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.canonical import readable_json
from metrale_orch.config import Config, source_label
from metrale_orch.errors import UsageError, printable

if TYPE_CHECKING:
    from metrale_orch.cache import BadObject, CacheStats
    from metrale_orch.cache.signing import Trust
    from metrale_orch.cli import Context

STATS_FILE = "cache-stats.json"
#: Problem lines shown before "... and N more".
_MAX_LINES = 20


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

    keygen = csub.add_parser(
        "keygen", help="write a signing key pair; print the public key for cache_trusted_keys"
    )
    keygen.add_argument("path", metavar="PATH", help="where the private key goes (a new file)")
    keygen.add_argument("--label", default="", help="a name shown after the key (e.g. ci-2026)")
    keygen.set_defaults(run=run_keygen)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def run_stats(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.cache import read_stats, summarize_local  # see the module docstring

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
        print(readable_json(doc), file=ctx.out)
        return 0
    if last is None:
        print(f"last run: no statistics yet ({STATS_FILE} is written by a build)", file=ctx.out)
    else:
        print(f"last run: {last.summary_line()}", file=ctx.out)
        if last.execution_line():
            print(f"last run: {last.execution_line()}", file=ctx.out)
        if last.signature_line():
            print(f"last run: {last.signature_line()}", file=ctx.out)
    print(f"local: {local.objects} objects, {_mib(local.bytes)} in {local.directory}", file=ctx.out)
    print(f"remote: {config.cache or '(none)'}  mode: {config.cache_mode}", file=ctx.out)
    print(f"signatures: {_trust_words(config)}", file=ctx.out)
    return 0


def _trust_words(config: Config) -> str:
    n = len(config.cache_trusted_keys)
    served = (
        f"remote entries served only when one of {n} trusted key{'s' if n != 1 else ''} signed them"
        if n
        else "not checked (no cache_trusted_keys)"
    )
    signer = "signing with cache_signing_key" if config.cache_signing_key else "not signing"
    return f"{served}; {signer}"


def _local_trust(config: Config) -> Trust | None:
    """What ``cache verify`` checks local signatures against (None: no trusted keys)."""
    if not config.cache_trusted_keys:
        return None
    from metrale_orch.cache.signing import Signing  # see the module docstring

    return Signing(
        trusted_keys=config.cache_trusted_keys,
        signing_key=config.cache_signing_key,
        signing_key_where=source_label(config, "cache_signing_key"),
        local_key=config.local_key,
    ).local_trust()


def _print_lines(lines: list[str], ctx: Context) -> None:
    for line in lines[:_MAX_LINES]:
        print(printable(line), file=ctx.out)
    if len(lines) > _MAX_LINES:
        print(f"... and {len(lines) - _MAX_LINES} more (--json lists them all)", file=ctx.out)


def run_gc(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.cache import gc_local, parse_size  # see the module docstring

    config = ctx.config()
    limit = parse_size(args.max_size)
    result = gc_local(config.local_cache, limit)
    code = 1 if result.problems else 0
    if args.json:
        print(readable_json(result.to_dict()), file=ctx.out)
        return code
    _print_lines(list(result.problems), ctx)
    if result.unusable_removed:
        n = result.unusable_removed
        print(
            f"removed {n} unusable entr{'y' if n == 1 else 'ies'} "
            "(not a regular file, or over the size limit)",
            file=ctx.out,
        )
    print(
        printable(
            f"removed {result.removed} objects ({_mib(result.removed_bytes)}); "
            f"{config.local_cache} now holds {result.objects_after} objects, "
            f"{_mib(result.bytes_after)} (limit {_mib(limit)})"
        ),
        file=ctx.out,
    )
    return code


def _bad_line(bad: BadObject) -> str:
    if bad.removed:
        return f"bad object {bad.key}: {bad.reason} (removed)"
    return (
        f"bad object {bad.key}: {bad.reason} (cannot remove {bad.path}: {bad.error}; "
        "remove it by hand)"
    )


def run_verify(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.cache import verify_local  # see the module docstring

    config = ctx.config()
    result = verify_local(config.local_cache, trust=_local_trust(config))
    code = 1 if result.bad or result.problems or result.untrusted else 0
    if args.json:
        print(readable_json(result.to_dict()), file=ctx.out)
        return code
    _print_lines([_bad_line(b) for b in result.bad], ctx)
    _print_lines(list(result.problems), ctx)
    _print_lines(
        [f"not trusted {key}: {why} (kept; a build replaces it)" for key, why in result.untrusted],
        ctx,
    )
    line = f"checked {result.checked} objects in {config.local_cache}: {result.ok} ok"
    if result.checked_signatures:
        line += f" (signed by a trusted key), {len(result.untrusted)} not trusted"
    print(printable(f"{line}, {len(result.bad)} bad"), file=ctx.out)
    return code


def run_keygen(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.cache.signing import write_key_pair  # see the module docstring

    path = Path(args.path)
    try:
        public = write_key_pair(path, args.label.strip())
    except FileExistsError:
        raise UsageError(
            f"{path} exists; keygen never overwrites a key: choose a new path"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the key ({exc.strerror or exc})") from None
    print(
        f"wrote the private key to {path} (mode 0600): keep it secret, never commit it.",
        file=ctx.out,
    )
    print(
        "CI signs with it: set METRALE_ORCH_CACHE_SIGNING_KEY to the file's text (a CI "
        "secret) or cache_signing_key to its path.",
        file=ctx.out,
    )
    print("readers trust it: add this line to pyproject.toml [tool.metrale-orch]:", file=ctx.out)
    print(f'cache_trusted_keys = ["{public.line()}"]', file=ctx.out)
    return 0
