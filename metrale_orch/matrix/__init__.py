"""The CI matrix: one GitHub Actions ``strategy.matrix`` row per hardware tree.

``metrale-orch matrix`` turns the kernel tree and ``ci/runners.toml`` into the
JSON object a workflow feeds to ``strategy.matrix``
(``{"include": [row, ...]}``). Each row names a hardware, the runner labels of
the runner class it runs on, its targets, the doit task selector that builds them, its
smoke task, and whether the hardware's toolchain is installed on that runner
class. A large hardware may be split into several rows ("shards") by target,
balanced by the kept compile seconds (module counts where there are none), and
``--shards N`` shares N rows in all among the hardware by their seconds
(:mod:`~metrale_orch.matrix.balance`).

A hardware builds on one runner class and smokes on another when the runner map
says so (:class:`Placement`): compiles need no GPU, so a CPU class compiles and
fills the shared cache, and the GPU class only smokes, from cache hits. Its build
rows then carry no smoke task, and :func:`plan_smoke_matrix` gives it one
smoke-only row on the smoke class, as it does for a hardware split into shards.

Invariants:

* :func:`plan_rows`, :func:`plan_matrix`, :func:`plan_smoke_matrix`,
  :func:`parse_runners`, :func:`parse_shards`, :func:`parse_shard_specs` and
  :func:`plan_shards` are pure functions of values; only :func:`load_runners`,
  :func:`scan_tree` and :func:`read_kept_seconds` read files; :func:`keep_seconds` writes one.
* Output is deterministic: rows sorted by (hardware, shard), targets sorted,
  shard assignment independent of input order (greedy LPT with total
  tie-breaks).
* Every target of a selected hardware appears in exactly one row.

The runner map and its format are :mod:`~metrale_orch.matrix.runners`; the rows,
:mod:`~metrale_orch.matrix.rows`; the split by time, :mod:`~metrale_orch.matrix.balance`;
the errors, :mod:`~metrale_orch.matrix.errors`.
"""

from metrale_orch.matrix.errors import (
    MatrixError,
    NoMatch,
    RunnersError,
    ShardSpecError,
    UnmappedHardware,
)
from metrale_orch.matrix.rows import (
    HardwareInfo,
    MatrixRow,
    RowOptions,
    TargetLoad,
    keep_seconds,
    parse_shard_specs,
    parse_shards,
    plan_matrix,
    plan_rows,
    plan_shards,
    plan_smoke_matrix,
    scan_tree,
    unmapped_hardware,
)
from metrale_orch.matrix.runners import (
    DEFAULT_RUNNERS_FILE,
    Placement,
    RunnerClass,
    Runners,
    load_runners,
    parse_runners,
)
from metrale_orch.steps.times import read_kept_seconds

__all__ = [
    "DEFAULT_RUNNERS_FILE",
    "HardwareInfo",
    "MatrixError",
    "MatrixRow",
    "NoMatch",
    "Placement",
    "RowOptions",
    "RunnerClass",
    "Runners",
    "RunnersError",
    "ShardSpecError",
    "TargetLoad",
    "UnmappedHardware",
    "keep_seconds",
    "load_runners",
    "parse_runners",
    "parse_shard_specs",
    "parse_shards",
    "plan_matrix",
    "plan_rows",
    "plan_shards",
    "plan_smoke_matrix",
    "read_kept_seconds",
    "scan_tree",
    "unmapped_hardware",
]
