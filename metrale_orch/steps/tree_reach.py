"""The tree files a target's compiles reach beyond its layout (SPEC 3.3.1), staged under ``.tree/``.

:func:`reach_beyond` finds them (an escaping include or a symlinked file is refused);
the layer directories and ``-I`` of the modules that reach them, and the
``EXTERNAL_KEY`` stamps that make an edit of such a file stale the target, follow.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from pathlib import Path

from metrale_orch.fsutil import FileState
from metrale_orch.steps.deps import (
    FileHasher,
    hashed_state,
    unknown_state,
)
from metrale_orch.steps.errors import (
    ContainmentError,
)
from metrale_orch.steps.hip_mirror import HipCompat
from metrale_orch.steps.includes import (
    Includes,
    include_dirs,
    resolve_closure,
)
from metrale_orch.steps.plan_values import TargetPlan
from metrale_orch.steps.staging import (
    StagedTarget,
    beyond_layout,
    layer_dir,
    role_dir,
    uncontained,
)
from metrale_orch.tree import Layout
from metrale_orch.tree.beyond import TREE_DIR, Beyond, layer_include

__all__ = [
    "beyond_stamps",
    "layer_dirs_of",
    "module_layer_includes",
    "reach_beyond",
    "reaching_tree",
]


def reach_beyond(
    root: Path,
    layout: Layout,
    compat: HipCompat | None,
    read: Callable[[Path], bytes] | None = None,
) -> Beyond:
    """SPEC 3.3.1: the tree files this target's compiles reach beyond its layout (to be
    staged under ``.tree/``), its sources read through ``read`` when given. Raises the
    first escaping include (naming the file and line) and
    :class:`~metrale_orch.steps.staging.ContainmentError` for a file reached through a
    symlink."""
    allow = () if compat is None or compat.dir is None else (str(compat.dir),)
    beyond = beyond_layout(root, layout, read, allow=allow)
    if beyond.errors:
        raise beyond.errors[0]
    bad = uncontained(Path(root) / "kernels", beyond.files.values())
    if bad:
        path, problem = bad[0]
        shown = os.path.relpath(path, root).replace(os.sep, "/")
        raise ContainmentError(str(layout.target), shown, problem)
    return beyond


def module_layer_includes(root: Path, layout: Layout) -> dict[str, str]:
    """Each module's staged source -> the ``-I`` of its layer directory under ``.tree/``."""
    out: dict[str, str] = {}
    for _stem, entry in layout.modules():
        cwd = role_dir(layout, layout.role_of(entry))
        out[f"{cwd}/{entry.name}"] = layer_include(cwd, layer_dir(root, layout, entry.layer))
    return out


def layer_dirs_of(root: Path, layout: Layout) -> set[str]:
    """The layer directories (under ``.tree/``) of the target's modules."""
    return {layer_dir(root, layout, entry.layer) for _stem, entry in layout.modules()}


def reaching_tree(
    plan: TargetPlan,
    staged: StagedTarget,
    includes: Mapping[str, Includes],
    layer_includes: Mapping[str, str],
) -> dict[str, str]:
    """``layer_includes`` restricted to the modules whose scanned include closure (with
    their layer directory on the path) reaches a file mirrored under ``.tree/``. A form
    the scan misses fails that compile ("no such file"), never a wrong hit."""
    out: dict[str, str] = {}
    prefix = TREE_DIR + "/"
    for module in plan.modules:
        inc = layer_includes.get(module.staged)
        if not inc:
            continue
        dirs = (
            *include_dirs(module.cwd, plan.flags, plan.switches.extra),
            posixpath.normpath(posixpath.join(module.cwd, inc)),
        )
        closure = resolve_closure(
            [module.staged], staged=staged.hashes, includes_of=includes, dirs=dirs
        )
        if any(p.startswith(prefix) for p in closure):
            out[module.staged] = inc
    return out


def beyond_stamps(
    root: Path, beyond: Beyond, staged: StagedTarget, hasher: FileHasher
) -> dict[str, FileState]:
    """``EXTERNAL_KEY`` entries of the files beyond the layout (root-relative): checked by
    every run, so an edit of a cross-model header makes the target stale even though the
    task's file dependencies (from generation) do not list it."""
    out: dict[str, FileState] = {}
    for rel, path in beyond.files.items():
        built = staged.hashes.get(f"{TREE_DIR}/{rel}", "")
        shown = os.path.relpath(path, root).replace(os.sep, "/")
        same = hasher.digest(str(path)) == built
        out[shown] = hashed_state(hasher, str(path), built) if same else unknown_state(built)
    return out
