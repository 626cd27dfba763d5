"""What a build task returns to doit: its small value, or a failure carrying one.

Pure helpers of the build action (:mod:`metrale_orch.tasks.building`), which makes the
values (:class:`~metrale_orch.tasks.values.BuildValues`), and the reporter, which adds
them up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from doit.exceptions import TaskFailed

from metrale_orch.paths import BUILD_TASK
from metrale_orch.tasks.values import BuildValues, Outcome

if TYPE_CHECKING:
    from metrale_orch.cache import CacheStats
    from metrale_orch.steps.results import TargetResult

__all__ = [
    "BuildFailed",
    "failure_text",
    "nonzero_counters",
    "summarise_result",
]


class BuildFailed(TaskFailed):  # type: ignore[misc]
    """A ``TaskFailed`` that also carries the task's values (cache statistics, outcome).

    doit saves no values for a failed task; the reporter reads them from here.
    """

    def __init__(self, msg: str, values: BuildValues | None = None) -> None:
        super().__init__(msg)
        self.values = BuildValues() if values is None else values


def summarise_result(result: TargetResult) -> tuple[Outcome, dict[str, int]]:
    """A built target's outcome and module counts, as its values hold them (pure).

    ``outcome``: ``built`` (at least one module compiled in this run, by this target or
    by another that shared it), ``cached`` (every module restored from a cache, by this
    target or by another that shared it), ``failed``. ``modules``: how many were
    compiled, local or remote hits, ``shared`` (another target of the run obtained
    them: never counted as hits), failed.
    """
    counts: dict[str, int] = {}
    outcome: Outcome
    for m in result.modules:
        name = "shared" if m.shared else str(m.outcome) or "unknown"
        counts[name] = counts.get(name, 0) + 1
    if result.failed:
        outcome = "failed"
    elif result.modules and all(
        m.outcome in ("local", "remote") and m.shared != "compiled" for m in result.modules
    ):
        outcome = "cached"
    else:
        outcome = "built"
    return outcome, dict(sorted(counts.items()))


def nonzero_counters(stats: CacheStats) -> dict[str, int | float]:
    """A task's cache statistics without the zero counters: the value is saved with the
    task in doit's database and read back on every run, so it stays small
    (``CacheStats.from_dict`` reads a missing counter as 0)."""
    return {k: v for k, v in stats.to_dict().items() if v}


def failure_text(target: str, result: TargetResult) -> str:
    """The one-line failure of a target whose build failed."""
    describe = getattr(result, "failure_text", None)
    if callable(describe):
        return str(describe())
    errors = getattr(result, "errors", None)
    if errors:
        return f"{BUILD_TASK}:{target}: " + "\n".join(str(e) for e in errors)
    return f"{BUILD_TASK}:{target}: failed (see the build log)"
