"""The ``build`` sub-tasks of the graph as values, with their own file dependencies and
signature parts (pure): what the doit adapter turns into task dicts in one place
(:func:`metrale_orch.tasks.dicts.task_dict`), the task cache stores, and the views read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import bytes_digest
from metrale_orch.paths import rel_posix

if TYPE_CHECKING:
    from metrale_orch.steps.plan_values import TargetPlan
    from metrale_orch.tree import Layout, LayoutError

__all__ = ["BuildSpec", "SpecKind", "plan_build_spec", "signature_parts"]

#: The kinds of ``build`` sub-task: built, skipped (toolchain missing), failing.
SpecKind = Literal["build", "skip", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildSpec:
    """One ``build`` sub-task with what it came from (for ``metrale-orch status/why/rdeps``)."""

    target: str
    #: "build", "skip" (toolchain missing) or "error" (tree, config or plan error).
    kind: SpecKind
    #: The skip reason or error message; "" for a build.
    message: str = ""
    #: A build's file dependencies as doit holds them (root-relative, unique, sorted).
    file_dep: tuple[str, ...] = ()
    #: A build's signature, one digest per part (:func:`signature_parts`).
    parts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: A build's manifest path (root-relative): its output, gone when the build is.
    manifest: str = ""
    #: A skip's target was named exactly on the command line (the skip then fails).
    explicit: bool = False
    #: An error's ``doit clean`` removes the target's outputs (False: no target of the tree).
    clean: bool = True
    #: The compile plan of a build, else None (also None for a spec from the task cache).
    plan: TargetPlan | None = None
    #: The resolved layout of a build, else None.
    layout: Layout | None = None
    #: What resolution gave: the Layout, the LayoutError, or None (tree-wide failure).
    resolved: Layout | LayoutError | None = None


def plan_build_spec(*, root: Path, target: str, plan: TargetPlan, manifest: Path) -> BuildSpec:
    """The spec of a target that builds by ``plan`` (pure), from its finished parts: the
    plan's ``file_dep_rels`` are doit's spelling already (root-relative, unique, sorted)
    and its ``signature_json`` the canonical text of some signature parts."""
    return BuildSpec(
        target=target,
        kind="build",
        file_dep=tuple(plan.file_dep_rels),
        parts=signature_parts(plan.signature, plan.signature_json),
        manifest=rel_posix(manifest, root),
        plan=plan,
    )


def signature_parts(
    signature: Mapping[str, object], encoded: Mapping[str, str] | None = None
) -> dict[str, str]:
    """One short digest per top-level part of a plan's signature (pure).

    Each part is encoded as canonical JSON (:func:`~metrale_orch.canonical.canonical_json`:
    sorted keys, no spaces; values that JSON cannot hold are encoded by ``str``), so
    equal signatures give equal digests in every process and checkout. ``encoded``
    gives the canonical text of some parts already made (a plan's
    ``signature_json``: the same text, built from memoised pieces).
    """
    out: dict[str, str] = {}
    for key in sorted(signature):
        text = encoded.get(key) if encoded else None
        if text is None:
            text = canonical_json(signature[key])
        out[str(key)] = bytes_digest(text.encode("utf-8"))
    return out
