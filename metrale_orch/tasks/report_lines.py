"""The lines a build prints (pure): the summary, a target's modules, refusals, remote runs.

:class:`~metrale_orch.tasks.reporter.BuildReporter` writes them; each is a function of
counts, so tests and the reporter agree on the words (see the reporter's docstring for
where each line appears).

A finished target's line counts its modules compiled, restored ``from cache`` (its own
local and remote hits) and ``shared`` (obtained by another target of the run, which
compiled or fetched them): the ``cache:`` line counts each module of every target once
in the same words (local hits, remote hits, shared, misses). A target is ``built`` when
its modules were compiled in this run (by it or by a target it shares them with), ``from
cache`` when every one came from a cache tier.

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
    "format_summary",
    "remote_totals",
]


def format_summary(counts: dict[str, int], seconds: float) -> str:
    """The final summary line (pure)."""
    parts = [
        f"{counts.get('built', 0)} built",
        f"{counts.get('cached', 0)} from cache",
        f"{counts.get('uptodate', 0)} up to date",
        f"{counts.get('skipped', 0)} skipped",
        f"{counts.get('failed', 0)} failed",
    ]
    if counts.get("ignored"):
        parts.append(f"{counts['ignored']} ignored")
    return f"build: {', '.join(parts)} in {seconds:.1f} s"


def format_modules(counts: Mapping[str, object]) -> str:
    """A finished target's modules (pure), e.g. ``9 module(s), 2 compiled, 3 from cache,
    4 shared``: ``from cache`` are its local and remote hits, ``shared`` the modules
    another target of the run obtained (each said only when there is one)."""
    compiled, hits, shared = (
        sum(int(v) for k, v in counts.items() if k in names and isinstance(v, int))
        for names in (("compiled",), ("local", "remote"), ("shared",))
    )
    line = f"{compiled + hits + shared} module(s), {compiled} compiled"
    if hits:
        line += f", {hits} from cache"
    if shared:
        line += f", {shared} shared"
    return line


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
