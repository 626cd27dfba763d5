"""Target serving defaults: ``kernels/<hw>/HARDWARE.toml [defaults]`` and ``METRALE_*``.

A hardware tree declares the serving levers its targets ship with; the build
bakes the declaration into every artefact of that hardware
(:func:`render_defaults_json`, :func:`render_defaults_header`), and a serving
process resolves it against ``METRALE_*`` environment variables
(:func:`resolve`, :func:`resolved`) and logs the result as one line
(:func:`format_levers`, :func:`summary_line`).

Everything is derived from one declarative table, :data:`LEVERS`: a row names
the lever, its type, baseline, variables and resolution rule, and where it
prints in the summary line. Parsing, resolution, the summary line, the JSON
views, the baked header and the generated docs all walk that table. A tree
may add rows of its own in ``kernels/LEVERS.toml`` (:func:`read_tree_levers`,
SPEC 2.5); they behave exactly like the built-in rows and come after them.

Invariants:

- Resolution is a pure function of (declaration, variable lookup); a value is
  tagged :attr:`Source.ENV` exactly when an environment variable decided it.
- :func:`resolved` keeps its first completed resolution for the life of the
  process (:func:`reset_resolved` is the hook for tests).
- The override grammar follows the reference system exactly: values are
  trimmed of Unicode ``White_Space``, lower-cased in ASCII only, and a u32 is
  an optional ``+`` and ASCII digits within ``0..=4294967295``.
- A declaration without tree levers is a plain :class:`TargetDefaults` (one
  field per built-in lever); one with tree levers is a :class:`TreeDefaults`,
  which adds them, in file order, with their values (likewise
  :class:`TargetLevers` and :class:`TreeLevers`).

The package imports nothing else of the package except :mod:`metrale_orch.errors`.
Its modules, bottom up: :mod:`~.grammar` (the override grammar), :mod:`~.errors`,
:mod:`~.levers` (the table), :mod:`~.tree_levers` (``kernels/LEVERS.toml``),
:mod:`~.declaration` (``[defaults]``), :mod:`~.resolution` (resolve, the summary
line), :mod:`~.process` (the process-wide cache), :mod:`~.render` (the baked
files) and :mod:`~.docs`.
"""

from __future__ import annotations

from metrale_orch.defaults.declaration import (
    TargetDefaults,
    TreeDefaults,
    baseline,
    defaults_from_json,
    parse_defaults,
    read_defaults,
)
from metrale_orch.defaults.docs import (
    render_docs,
    write_docs,
)
from metrale_orch.defaults.errors import (
    LEVERS_TOML,
    AlreadyResolvedError,
    DefaultsError,
    DefaultsValueError,
    LeverDeclarationError,
    UnknownHardwareError,
    UnknownLeverError,
)
from metrale_orch.defaults.grammar import (
    DENSE_GEMV_BATCHM_MAX_M,
    Resolved,
    Source,
    SplitkPolicy,
    resolve_batchm_max,
    resolve_max_m,
    resolve_points,
    resolve_policy,
    resolve_toggle,
)
from metrale_orch.defaults.levers import (
    BASELINE_BATCHM_MAX,
    LEVERS,
    Kind,
    Lever,
    Rule,
)
from metrale_orch.defaults.process import (
    declare,
    declared,
    reset_resolved,
    resolved,
    summary_line,
)
from metrale_orch.defaults.render import (
    render_defaults_header,
    render_defaults_json,
)
from metrale_orch.defaults.resolution import (
    TargetLevers,
    TreeLevers,
    format_levers,
    resolve,
)
from metrale_orch.defaults.tree_levers import (
    DeclaredLevers,
    parse_tree_levers,
    read_tree_levers,
)

__all__ = [
    "BASELINE_BATCHM_MAX",
    "DENSE_GEMV_BATCHM_MAX_M",
    "LEVERS",
    "LEVERS_TOML",
    "AlreadyResolvedError",
    "DeclaredLevers",
    "DefaultsError",
    "DefaultsValueError",
    "Kind",
    "Lever",
    "LeverDeclarationError",
    "Resolved",
    "Rule",
    "Source",
    "SplitkPolicy",
    "TargetDefaults",
    "TargetLevers",
    "TreeDefaults",
    "TreeLevers",
    "UnknownHardwareError",
    "UnknownLeverError",
    "baseline",
    "declare",
    "declared",
    "defaults_from_json",
    "format_levers",
    "parse_defaults",
    "parse_tree_levers",
    "read_defaults",
    "read_tree_levers",
    "render_defaults_header",
    "render_defaults_json",
    "render_docs",
    "reset_resolved",
    "resolve",
    "resolve_batchm_max",
    "resolve_max_m",
    "resolve_points",
    "resolve_policy",
    "resolve_toggle",
    "resolved",
    "summary_line",
    "write_docs",
]
