"""The parts of a plan's signature: what file dependencies cannot see, JSON-ready.

:func:`~metrale_orch.steps.plan.plan_target` records the toolchain, the resolved layout
map (root-relative, with its shadows) and each module (:class:`PlanSignature` builds the
modules' part on first access) in the plan's signature; a target's task and key digest it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from metrale_orch.steps.plan_values import ModulePlan, RootRel, module_signature
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.tree import Layout, Shadow

__all__ = ["PlanSignature", "layout_signature", "shadow_dict", "toolchain_signature"]


class PlanSignature(Mapping[str, object]):
    """A plan's signature (read-only): its parts, and ``modules`` (one
    :func:`module_signature` per module) built on first access.

    A generation never reads ``modules``: the task's digest of that part comes from the
    plan's ``signature_json`` (each module's text encoded once per memo), and building
    one dict per (target, module) pair cost a cold generation of the real-shaped tree
    ~20 ms of its ~120 ms of planning.
    """

    __slots__ = ("_modules", "_parts", "_planned")

    def __init__(self, parts: Mapping[str, object], modules: tuple[ModulePlan, ...]) -> None:
        self._parts = dict(parts)
        self._planned = modules
        self._modules: list[dict[str, object]] | None = None

    def __getitem__(self, key: str) -> object:
        if key == "modules":
            if self._modules is None:
                self._modules = [module_signature(m) for m in self._planned]
            return self._modules
        return self._parts[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._parts
        yield "modules"

    def __len__(self) -> int:
        return len(self._parts) + 1

    def __repr__(self) -> str:
        return f"PlanSignature({dict(self)!r})"


def toolchain_signature(toolchain: Toolchain, identity: str) -> dict[str, object]:
    """The toolchain as the plan's signature records it."""
    return {
        "name": toolchain.name,
        "identity": identity,
        "argv": list(toolchain.argv),
        "link_argv": list(toolchain.link_argv),
        "output": toolchain.output,
        "extension": toolchain.extension,
    }


def layout_signature(layout: Layout, rel: RootRel) -> dict[str, object]:
    """The resolved layout map (root-relative) as the plan's signature records it."""
    return {
        "source_model": layout.source_model,
        "leaf": {n: rel(e.source) for n, e in layout.leaf.items()},
        "common": {n: rel(e.source) for n, e in layout.common.items()},
        "leaf_subdirs": {n: rel(p) for n, p in layout.leaf_subdirs.items()},
        "common_subdirs": {n: rel(p) for n, p in layout.common_subdirs.items()},
        "shadows": [shadow_dict(s, rel) for s in layout.shadows],
    }


def shadow_dict(shadow: Shadow, root: Path | RootRel) -> dict[str, str]:
    """A shadow (which file won over which, and why) with root-relative paths."""
    rel = root if isinstance(root, RootRel) else RootRel(Path(root))
    return {
        "role": shadow.role.value,
        "name": shadow.name,
        "winner": rel(shadow.winner),
        "loser": rel(shadow.loser),
        "reason": shadow.reason,
    }
