"""The SPEC 1.7 JSON view of resolved layouts (``metrale-orch layout --json``, ``dump``).

Every path in the view is relative to the project root, in POSIX spelling;
keys are sorted, so the same tree always dumps the same bytes. ``dump(root)`` is exactly
SPEC 1.7. Only when asked (``names_of``: the build's ``[modules]`` renames, which the tree
does not compute) does a resolved target's view also carry ``module_names`` ({stem: name})
or, for a bad ``[modules]`` table, ``module_names_error``; its SPEC 1.7 fields stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from metrale_orch.errors import MetraleError
from metrale_orch.tree.errors import LayoutError
from metrale_orch.tree.resolve import resolve_all
from metrale_orch.tree.values import Entry, Layout

__all__ = ["Json", "NamesOf", "dump", "layout_to_dict"]

#: A JSON value, as :func:`json.dumps` takes it.
Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"
#: A layout's installed module names (stem -> name); raises a package error when it cannot.
NamesOf: TypeAlias = Callable[[Layout], Mapping[str, str]]


def layout_to_dict(
    layout: Layout, root: Path | str, names_of: NamesOf | None = None
) -> dict[str, Json]:
    """The SPEC 1.7 JSON view of one layout, every path relative to ``root``; with
    ``names_of``, also ``module_names`` or ``module_names_error``."""
    root = Path(root)

    def r(path: Path) -> str:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            return path.as_posix()

    def entries(m: Mapping[str, Entry]) -> dict[str, Json]:
        return {n: [r(e.source), e.layer, e.used] for n, e in sorted(m.items())}

    view: dict[str, Json] = {
        "source_model": layout.source_model,
        "layers": [[lay.role.value, lay.tier.value, r(lay.dir)] for lay in layout.layers],
        "leaf": entries(layout.leaf),
        "common": entries(layout.common),
        "leaf_subdirs": {n: r(p) for n, p in sorted(layout.leaf_subdirs.items())},
        "common_subdirs": {n: r(p) for n, p in sorted(layout.common_subdirs.items())},
        "configs": [r(p) for p in layout.configs()],
        "modules": {stem: r(e.source) for stem, e in layout.modules()},
        "shadows": [
            [s.role.value, s.name, r(s.winner), r(s.loser), s.reason] for s in layout.shadows
        ],
    }
    if names_of is not None:
        try:
            view["module_names"] = dict(sorted(names_of(layout).items()))
        except MetraleError as exc:
            view["module_names_error"] = str(exc)
    return dict(sorted(view.items()))


def dump(root: Path | str, names_of: NamesOf | None = None) -> dict[str, Json]:
    """Every walked target keyed ``hw/model/quant``: its layout view or ``{"error": message}``
    (SPEC 1.7 exactly without ``names_of``; see :func:`layout_to_dict` with it)."""
    out: dict[str, Json] = {}
    for target, result in resolve_all(root):
        if isinstance(result, LayoutError):
            out[str(target)] = {"error": str(result)}
        else:
            out[str(target)] = layout_to_dict(result, root, names_of)
    return dict(sorted(out.items()))
