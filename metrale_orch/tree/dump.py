"""The SPEC 1.7 JSON view of resolved layouts (``metrale-orch layout --json``, ``dump``).

Every path in the view is relative to the project root, in POSIX spelling;
keys are sorted, so the same tree always dumps the same bytes. Given each module's
installed name (the build's ``[modules]`` renames, which the tree does not compute), the
view adds ``module_names`` ({stem: name}) beside ``modules`` ({stem: source}).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeAlias

from metrale_orch.errors import MetraleError
from metrale_orch.tree.errors import LayoutError
from metrale_orch.tree.resolve import resolve_all
from metrale_orch.tree.values import Entry, Layout

__all__ = ["Json", "dump", "layout_to_dict"]

#: A JSON value, as :func:`json.dumps` takes it.
Json: TypeAlias = "str | int | float | bool | Sequence[Json] | Mapping[str, Json] | None"


def layout_to_dict(
    layout: Layout, root: Path | str, names: Mapping[str, str] | None = None
) -> dict[str, Json]:
    """The SPEC 1.7 JSON view of one layout, every path relative to ``root``; with
    ``names`` (stem -> installed name), also ``module_names`` (pure)."""
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
        **({} if names is None else {"module_names": dict(sorted(names.items()))}),
        "shadows": [
            [s.role.value, s.name, r(s.winner), r(s.loser), s.reason] for s in layout.shadows
        ],
    }
    return dict(sorted(view.items()))


def dump(
    root: Path | str, names_of: Callable[[Layout], Mapping[str, str]] | None = None
) -> dict[str, Json]:
    """Every walked target keyed ``hw/model/quant``: its layout view or ``{"error": message}``.

    ``names_of`` gives a layout's installed module names (``module_names`` in its view);
    a package error it raises (a bad ``[modules]`` table) is that target's error.
    """
    out = {str(target): _view(result, root, names_of) for target, result in resolve_all(root)}
    return dict(sorted(out.items()))


def _view(
    result: Layout | LayoutError,
    root: Path | str,
    names_of: Callable[[Layout], Mapping[str, str]] | None,
) -> Json:
    if isinstance(result, LayoutError):
        return {"error": str(result)}
    try:
        names = None if names_of is None else names_of(result)
    except MetraleError as exc:
        return {"error": str(exc)}
    return layout_to_dict(result, root, names)
