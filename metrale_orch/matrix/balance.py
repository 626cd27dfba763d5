"""Build rows balanced by time: what each target costs, and how many rows each hardware gets.

A target's cost is its kept compile seconds (``<build_dir>/.state/target-times.json``,
:mod:`metrale_orch.steps.times`); a target never built costs its module count times the
tree's mean seconds per module; with no kept times at all, every target costs its
module count (at least 1: resolving, staging and the manifest cost something too).

``--shards N`` asks for N build rows in all. A row holds one hardware's targets only
(it runs on that hardware's runner class with its toolchain), so the rows are first
allocated to hardware (:func:`allocate_rows`: each one row at least, and as few rows as
keep every hardware's slowest row under the least bound the N rows can meet), then each
hardware's targets are split over its rows by greedy LPT (:func:`plan_lpt`).

Pure functions of values; floats are summed with :func:`math.fsum` and ties broken by
name, so the same times give the same rows whatever the input order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

__all__ = ["allocate_rows", "plan_costs", "plan_lpt", "row_cost", "slowest"]


def plan_costs(
    modules: Mapping[str, int], kept: Mapping[str, float]
) -> tuple[dict[str, float], bool]:
    """Each target's expected cost, and whether it is in seconds (pure).

    ``modules``: every target of the tree and its module count; ``kept``: the kept
    compile seconds by target (targets no longer in the tree, and times that are
    negative, NaN or infinite, are ignored). Without any kept time for a target of the
    tree the costs are module counts and the flag is False.
    """
    kept = {t: s for t, s in kept.items() if 0 <= s < math.inf}
    known = sorted(t for t in modules if t in kept)
    if not known:
        return {t: float(max(1, m)) for t, m in modules.items()}, False
    per_module = math.fsum(kept[t] for t in known) / max(1, sum(modules[t] for t in known))
    costs = {t: float(kept[t]) if t in kept else max(1, m) * per_module for t, m in modules.items()}
    return costs, True


def plan_lpt(costs: Mapping[str, float], count: int) -> tuple[tuple[str, ...], ...]:
    """Split the targets of ``costs`` into ``min(count, len(costs))`` non-empty rows.

    Greedy LPT: the costliest target first (ties by name), each into the row with the
    least cost so far (ties by fewer targets, then the lower index). Each row's targets
    are sorted, and the rows sorted by their first target. A row is never empty (a
    build row without targets would build everything).
    """
    n = min(count, len(costs))
    if n <= 1:
        return (tuple(sorted(costs)),) if costs else ()
    heap: list[tuple[float, int, int]] = [(0.0, 0, i) for i in range(n)]
    bins: list[list[str]] = [[] for _ in range(n)]
    for name in sorted(costs, key=lambda t: (-costs[t], t)):
        load, size, i = heapq.heappop(heap)
        bins[i].append(name)
        heapq.heappush(heap, (load + costs[name], size + 1, i))
    return tuple(sorted(tuple(sorted(b)) for b in bins if b))


def slowest(costs: Mapping[str, float], count: int) -> float:
    """The cost of the costliest row when ``costs`` is split into ``count`` rows."""
    return max((row_cost(costs, row) for row in plan_lpt(costs, count)), default=0.0)


def allocate_rows(
    costs: Mapping[str, Mapping[str, float]], total: int, fixed: Mapping[str, int]
) -> dict[str, int]:
    """How many rows each hardware gets: ``total`` in all, at most one per target (pure).

    ``costs``: each hardware's targets and their costs; ``fixed``: hardware whose row
    count is given (``--shards HW=N``), counted in ``total``. Every other hardware gets
    at least one row; the caller checks that ``total`` leaves room for that.

    First the least bound on the slowest row that the rows can meet: the smallest
    slowest-row cost ``M`` (of any hardware with any count) such that giving each
    hardware the fewest rows whose slowest is at most ``M`` takes no more than
    ``total``. The rows left over then go, one at a time, to the hardware whose
    slowest row is the slowest of those that more rows can make faster (else the most
    seconds per row), so that they shorten the other hardware's rows too.
    """
    free = sorted(hw for hw in costs if hw not in fixed)
    rows = total - sum(fixed.values())
    slow = _Slowest(costs)
    spare = rows - len(free)
    table = {hw: [slow(hw, k) for k in range(1, min(len(costs[hw]), 1 + spare) + 1)] for hw in free}

    def needed(bound: float) -> dict[str, int]:
        return {hw: next(k for k, s in enumerate(table[hw], 1) if s <= bound) for hw in free}

    floor = max((min(table[hw]) for hw in free), default=0.0)
    bounds = sorted({s for hw in free for s in table[hw] if s >= floor})
    low, high = 0, len(bounds) - 1  # needed(bounds[high]) fits: one row each at most
    while low < high:
        mid = (low + high) // 2
        if sum(needed(bounds[mid]).values()) <= rows:
            high = mid
        else:
            low = mid + 1
    counts = needed(bounds[low]) if bounds else {}

    def priority(hw: str) -> tuple[bool, float, float]:
        # Rows can make it faster while its slowest row is more than its costliest target.
        now = slow(hw, counts[hw])
        return (now > max(costs[hw].values()), now, math.fsum(costs[hw].values()) / counts[hw])

    for _ in range(rows - sum(counts.values())):
        open_ = [hw for hw in free if counts[hw] < len(costs[hw])]
        if not open_:
            break
        counts[max(open_, key=priority)] += 1
    return {**counts, **fixed}


class _Slowest:
    """:func:`slowest` of a hardware's targets with ``k`` rows, each computed once."""

    __slots__ = ("costs", "known")

    def __init__(self, costs: Mapping[str, Mapping[str, float]]) -> None:
        self.costs = costs
        self.known: dict[tuple[str, int], float] = {}

    def __call__(self, hw: str, k: int) -> float:
        if (hw, k) not in self.known:
            self.known[hw, k] = slowest(self.costs[hw], k)
        return self.known[hw, k]


def row_cost(costs: Mapping[str, float], targets: Sequence[str]) -> float:
    """The expected cost of a row holding ``targets``."""
    return math.fsum(costs[t] for t in targets)
