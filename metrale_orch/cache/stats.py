"""Cache statistics: :class:`CacheStats` counters, their summary line and their JSON file.

The counters are plain integers (and the seconds saved); the file is written
atomically with sorted keys and read back strictly (:class:`CacheStatsError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from metrale_orch.cache.errors import CacheStatsError
from metrale_orch.canonical import readable_json
from metrale_orch.fsutil import write_atomic

__all__ = ["CacheStats", "read_stats", "write_stats"]


_COUNTERS = (
    "local_hits",
    "remote_hits",
    "shared",
    "misses",
    "cache_off",
    "rejected",
    "errors",
    "timeouts",
    "corrupt",
    "puts",
    "uploads",
    "bytes_up",
    "bytes_down",
    "remote_disabled",
    "remote_executed",
    "action_cache_hits",
    "ran_here",
    "verified",
    "unsigned",
    "untrusted",
)


@dataclass(slots=True, kw_only=True)
class CacheStats:
    """Counters of one process (or, added up, one run). Mutable; ``Cache.stats`` is live."""

    local_hits: int = 0
    remote_hits: int = 0
    #: Lookups another target of the run answered: an artefact it compiled or fetched
    #: (the build session's memo), or a cache entry this run stored (another worker
    #: process's compile). Neither a hit nor a miss: no cache tier served it.
    shared: int = 0
    misses: int = 0
    #: Misses with ``cache_mode`` off: no tier was asked, every module compiles.
    cache_off: int = 0
    #: Misses where an entry verified but ``accept`` refused it (stale for the current inputs).
    rejected: int = 0
    #: Failed store calls (remote errors, unreadable local files).
    errors: int = 0
    #: Remote calls that ran past their deadline.
    timeouts: int = 0
    #: Objects that failed verification (never returned).
    corrupt: int = 0
    #: Objects this process published to the local tier.
    puts: int = 0
    #: Objects this process published to the remote tier.
    uploads: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    #: Compile time recorded in the objects that hit.
    seconds_saved: float = 0.0
    #: Processes whose remote was switched off (breaker, missing extra).
    remote_disabled: int = 0
    #: Compile actions a remote engine ran, answered from its action cache, and ran here
    #: instead (remote execution: a reason each, counted in the build's summary).
    remote_executed: int = 0
    action_cache_hits: int = 0
    ran_here: int = 0
    #: Entries whose signature a trusted key made (``cache_trusted_keys`` set), and those
    #: refused for it (each also a miss): not signed, or signed otherwise (a key not
    #: trusted, a forged or truncated signature).
    verified: int = 0
    unsigned: int = 0
    untrusted: int = 0

    def to_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {name: getattr(self, name) for name in _COUNTERS}
        out["seconds_saved"] = round(self.seconds_saved, 3)
        return dict(sorted(out.items()))

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> CacheStats:
        """Inverse of :meth:`to_dict`; missing counters are 0. Raises ``ValueError``."""
        kwargs: dict[str, int] = {}
        for name in _COUNTERS:
            value = doc.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
            kwargs[name] = value
        saved = doc.get("seconds_saved", 0.0)
        if isinstance(saved, bool) or not isinstance(saved, int | float) or saved < 0:
            raise ValueError(f"seconds_saved must be a non-negative number, got {saved!r}")
        return cls(seconds_saved=float(saved), **kwargs)

    def __add__(self, other: CacheStats) -> CacheStats:
        if not isinstance(other, CacheStats):
            return NotImplemented
        return CacheStats(
            seconds_saved=self.seconds_saved + other.seconds_saved,
            **{name: getattr(self, name) + getattr(other, name) for name in _COUNTERS},
        )

    def copy(self) -> CacheStats:
        return CacheStats(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def lookups(self) -> int:
        """Every module lookup, counted once: hits, shared in the run, misses."""
        return self.local_hits + self.remote_hits + self.shared + self.misses

    def summary_line(self) -> str:
        """One line, e.g. ``cache: 12 local hits, 3 remote hits, 40 shared, 2 misses; ...``
        (``shared`` only when some lookup was: the four add up to :attr:`lookups`, with
        the cache off too, when the line ends ``; cache off``)."""
        parts = [
            f"{self.local_hits} local hit{_s(self.local_hits)}",
            f"{self.remote_hits} remote hit{_s(self.remote_hits)}",
            *([f"{self.shared} shared"] if self.shared else []),
            f"{self.misses} miss{'es' if self.misses != 1 else ''}",
        ]
        if self.rejected:
            parts.append(f"{self.rejected} rejected as stale")
        if self.unsigned or self.untrusted:
            parts.append(
                f"{self.unsigned + self.untrusted} refused as not signed by a trusted key "
                f"({self.unsigned} unsigned, {self.untrusted} untrusted)"
            )
        trouble = [
            f"{n} {label}"
            for n, label in (
                (self.errors, "errors" if self.errors != 1 else "error"),
                (self.timeouts, "timeouts" if self.timeouts != 1 else "timeout"),
                (self.corrupt, "corrupt"),
            )
            if n
        ]
        moved = f"{_human(self.bytes_down)} down, {_human(self.bytes_up)} up"
        line = "cache: " + ", ".join(parts)
        if trouble:
            line += " (" + ", ".join(trouble) + ")"
        line += f"; {moved}; {self.seconds_saved:.1f} s of compiling saved"
        if self.remote_disabled:
            line += "; remote off"
        if self.cache_off:
            line += "; cache off"
        return line

    def signature_line(self) -> str:
        """``signatures: 40 verified, 2 unsigned, 1 untrusted``; "" when nothing was checked."""
        if not (self.verified or self.unsigned or self.untrusted):
            return ""
        return (
            f"signatures: {self.verified} verified, {self.unsigned} unsigned, "
            f"{self.untrusted} untrusted"
        )

    def execution_line(self) -> str:
        """Where the compile actions ran, e.g. ``remote execution: 48 ran remotely (12 from
        the action cache), 3 ran here``; "" without remote execution."""
        remote = self.remote_executed + self.action_cache_hits
        if not remote and not self.ran_here:
            return ""
        line = f"remote execution: {remote} ran remotely"
        if self.action_cache_hits:
            line += f" ({self.action_cache_hits} from the action cache)"
        return line + f", {self.ran_here} ran here"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def write_stats(path: Path, stats: CacheStats) -> None:
    """Write ``stats`` as JSON to ``path`` atomically (temp file + rename)."""
    write_atomic(path, (readable_json(stats.to_dict()) + "\n").encode())


def read_stats(path: Path) -> CacheStats:
    """Read a file written by :func:`write_stats`.

    Raises ``FileNotFoundError`` if absent and :class:`CacheStatsError` if malformed.
    """
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return CacheStats.from_dict(doc)
    except (ValueError, TypeError) as exc:
        raise CacheStatsError(path, f"not a cache statistics file: {exc}") from None
