"""The lines a build prints (pure): the summary, a target's modules, refusals, remote runs.

:class:`~metrale_orch.tasks.reporter.BuildReporter` writes them; each is a function of
counts, so tests and the reporter agree on the words (see the reporter's docstring for
where each line appears).

A finished target's line says what the summary counts it as (``built`` or ``from
cache``, the summary's own words) and then its modules in the ``cache:`` line's words:
``local hits``, ``remote hits``, ``shared`` (obtained by another target of the run, which
compiled or fetched them) and ``compiled`` (what the ``cache:`` line counts as misses, as
it does a target's ``failed`` modules: a target that failed compiling gets such a line
too, after its ``FAILED`` line).
A target is ``built`` when some module of it was compiled in this run (by it or by a
target it shares them with), ``from cache`` when none was: every one came from a cache
tier. So the target lines of each word add up to the summary's count, and their modules
to the ``cache:`` line's (docs/guarantees.md, "What the counts mean").

A skip reason is said in full on a run that built something, once per reason; on a
no-op run (no target ran) only its first clause, and where to read the rest
(:func:`format_skipped`).

With ``require_hits`` set, the modules it refused to compile (every cache tier
missed them) are counted on a line of their own after the summary
(:func:`format_refused`); each such target failed.

With ignored targets the line counts them too (``…, 1 failed, 2 ignored in …``,
only then, so the common line keeps its shape) and one more line names them and
how to undo the mark.
"""

from __future__ import annotations

from collections.abc import Mapping

from metrale_orch.paths import (
    BUILD_TASK,
)

__all__ = [
    "add_remote_counts",
    "brief",
    "format_interrupted",
    "format_modules",
    "format_refused",
    "format_remote",
    "format_skipped",
    "format_summary",
    "format_target",
    "remote_totals",
]


#: The summary's counts of targets, in its order: the reporter's key and the word said.
TARGET_WORDS = (
    ("built", "built"),
    ("cached", "from cache"),
    ("uptodate", "up to date"),
    ("skipped", "skipped"),
    ("failed", "failed"),
)

#: A finished target's module counts, in the ``cache:`` line's order: the value's keys
#: (:func:`~metrale_orch.tasks.outcomes.summarise_result`) and the word said.
_MODULE_WORDS = (
    ("local", "local hit", "local hits"),
    ("remote", "remote hit", "remote hits"),
    ("shared", "shared", "shared"),
    ("compiled", "compiled", "compiled"),
    ("failed", "failed", "failed"),
)

#: A skip reason said on a no-op run is cut to at most this many characters.
SHORT_REASON = 100


def format_summary(counts: dict[str, int], seconds: float) -> str:
    """The final summary line (pure)."""
    parts = [f"{counts.get(key, 0)} {word}" for key, word in TARGET_WORDS]
    if counts.get("ignored"):
        parts.append(f"{counts['ignored']} ignored")
    return f"build: {', '.join(parts)} in {seconds:.1f} s"


def format_target(name: str, outcome: str, modules: Mapping[str, object], seconds: object) -> str:
    """A finished target's line (pure), e.g. ``done build:hw/m/q: built in 3.1 s (10
    modules: 2 local hits, 4 shared, 4 compiled)``: ``outcome`` is the summary's key
    (``built``, ``cached``, ``failed``: after its ``FAILED`` line, for a target whose
    modules were looked up), ``modules`` the value's counts (each said only when there
    is one)."""
    word = dict(TARGET_WORDS).get(outcome, outcome)
    took = f" in {seconds:.1f} s" if isinstance(seconds, int | float) else ""
    return f"done {name}: {word}{took} ({format_modules(modules)})"


def format_modules(counts: Mapping[str, object]) -> str:
    """A finished target's modules (pure), e.g. ``9 modules: 3 local hits, 4 shared, 2
    compiled`` (see :data:`_MODULE_WORDS`)."""
    parts = []
    total = 0
    for key, one, many in _MODULE_WORDS:
        value = counts.get(key, 0)
        n = value if isinstance(value, int) else 0
        total += n
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    noun = "module" if total == 1 else "modules"
    return f"{total} {noun}: {', '.join(parts)}" if parts else f"{total} {noun}"


def format_skipped(reason: str, targets: list[str], *, full: bool) -> str:
    """The line of the targets skipped for one reason (pure): the reason in full, or
    (``full`` false: a no-op run) its first clause and where to read the rest."""
    said = reason if full else _first_clause(reason)
    line = f"skipped {len(targets)} target(s): {said} ({brief(targets)})"
    return line if said == reason else f"{line}; see `metrale-orch status`"


def _first_clause(reason: str) -> str:
    """The first line of ``reason`` up to its first ``: `` or ``; `` (what is wrong,
    before why and what to do), at most :data:`SHORT_REASON` characters (pure)."""
    head = reason.strip().splitlines()[0] if reason.strip() else reason
    for mark in (": ", "; "):
        head = head.split(mark, 1)[0]
    if len(head) > SHORT_REASON:
        head = head[: SHORT_REASON - 1].rstrip() + "…"
    return head


def format_refused(refused: Mapping[str, int]) -> str:
    """The ``require_hits`` line (pure): how many modules of which targets missed every
    cache tier and were not compiled; ``refused`` maps ``build:<target>`` to its count."""
    modules = sum(refused.values())
    targets = sorted(name.removeprefix(BUILD_TASK + ":") for name in refused)
    return (
        f"require_hits: {modules} module(s) of {len(targets)} target(s) not in the shared "
        f"cache, NOT compiled ({brief(targets)}): the build job for this hardware must run "
        "first and share the cache"
    )


def add_remote_counts(total: dict[str, object], counts: Mapping[str, object]) -> None:
    """Add one target's ``remote`` value (where its compile actions ran) to ``total``."""
    for name in ("remote", "action_cache"):
        value = counts.get(name, 0)
        if isinstance(value, int) and value:
            old = total.get(name, 0)
            total[name] = (old if isinstance(old, int) else 0) + value
    local = counts.get("local")
    if isinstance(local, dict) and local:
        mine = total.setdefault("local", {})
        assert isinstance(mine, dict)
        for reason, n in local.items():
            if isinstance(n, int):
                mine[str(reason)] = mine.get(str(reason), 0) + n


def remote_totals(total: Mapping[str, object]) -> tuple[int, int, int]:
    """(ran remotely, from the action cache, ran here) of :func:`add_remote_counts`'s total."""
    remote, cached = total.get("remote", 0), total.get("action_cache", 0)
    local = total.get("local")
    here = sum(n for n in local.values() if isinstance(n, int)) if isinstance(local, dict) else 0
    return (
        remote if isinstance(remote, int) else 0,
        cached if isinstance(cached, int) else 0,
        here,
    )


def format_remote(total: Mapping[str, object]) -> str:
    """The summary's remote execution line (pure), e.g. ``remote: 48 ran remotely (12 from
    the action cache), 3 ran here: no worker for platform … (3)``."""
    remote, cached, here = remote_totals(total)
    line = f"remote: {remote + cached} ran remotely"
    if cached:
        line += f" ({cached} from the action cache)"
    local = total.get("local")
    if isinstance(local, dict) and local:
        reasons = sorted(local.items(), key=lambda kv: (-int(kv[1]), str(kv[0])))
        shown = "; ".join(f"{reason} ({n})" for reason, n in reasons[:3])
        more = f"; {len(reasons) - 3} other reasons" if len(reasons) > 3 else ""
        line += f", {here} ran here: {shown}{more}"
    return line


def format_interrupted(finished: int) -> str:
    """The one line a run stopped by Ctrl-C or SIGTERM ends with (pure)."""
    noun = "target" if finished == 1 else "targets"
    return f"interrupted; {finished} {noun} finished and kept"


def brief(targets: list[str]) -> str:
    """``targets`` sorted, at most three named, then how many more."""
    shown = sorted(targets)
    if len(shown) <= 3:
        return ", ".join(shown)
    return f"{', '.join(shown[:3])}, … {len(shown) - 3} more"
