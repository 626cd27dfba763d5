"""``why-miss``: why each module of a target misses a cache tier, by the part of its key.

:func:`explain_misses` plans, stages and keys the target as its build does
(:func:`~metrale_orch.steps.target.key_target`: nothing is compiled; the toolchain is
probed, as every build does), then looks each module's key up in one tier, reading entry
headers only (:class:`~metrale_orch.cache.records.TierHeads`):

- ``hit``: the tier holds the key, and every file its compile read still has the
  content it had (what a build checks before it serves an entry);
- ``stale``: the tier holds the key, but a file its compile read changed since
  (a system header, a toolkit file): a build compiles again; each such file is named;
- ``untrusted``: the tier holds the key, but no key of ``cache_trusted_keys`` (for the
  local tier: nor this user's) signed it, so a build does not serve it; the reason is named;
- ``miss``: the tier has no entry of the key. Among the stored entries of the same module
  (same hardware, and the same module name or source file), the one whose record of its
  key's parts (:mod:`~metrale_orch.steps.keyrecord`) differs from the current one in the
  fewest parts is named, with each difference; or none is, when the tier holds no recorded
  entry of the module.

What the build does is never changed: the tier is read, not written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from metrale_orch.cache import CacheSettings
from metrale_orch.cache.records import Records, TierHeads
from metrale_orch.config import Config
from metrale_orch.errors import UsageError
from metrale_orch.steps.deps import FileHasher, Input, changed_inputs
from metrale_orch.steps.keyrecord import (
    Change,
    Stored,
    key_record,
    nearest,
    staged_sources,
)
from metrale_orch.steps.results import KeyedModule, KeyedTarget
from metrale_orch.steps.target import key_target
from metrale_orch.tree import Target

__all__ = ["ModuleMiss", "Outcome", "WhyMiss", "explain_misses", "parse_target"]

#: How a module's key fares in the tier (see the module docstring).
Outcome = Literal["hit", "stale", "untrusted", "miss"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleMiss:
    """One module's key against the tier, and why it misses."""

    module: str
    key: str
    outcome: Outcome
    #: The nearest stored entry of the module (a miss): its key, "" for none.
    nearest: str = ""
    #: The target that stored the nearest entry.
    nearest_target: str = ""
    #: What differs (a miss: from the nearest entry; stale: the files read that changed).
    changes: tuple[Change, ...] = ()

    def to_dict(self) -> dict[str, object]:
        doc: dict[str, object] = {"module": self.module, "key": self.key, "outcome": self.outcome}
        if self.outcome == "miss":
            doc["nearest"] = (
                {"key": self.nearest, "target": self.nearest_target} if self.nearest else None
            )
        if self.outcome != "hit":
            doc["changes"] = [c.to_dict() for c in self.changes]
        return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class WhyMiss:
    """The modules of one target against one tier."""

    target: str
    #: The tier in words (``local cache <dir>``, ``remote cache <url>``).
    tier: str
    modules: tuple[ModuleMiss, ...]
    #: Entries of the tier without a record of their key's parts (stored before records
    #: were kept); read only when a module misses.
    unrecorded: int = 0
    warnings: tuple[str, ...] = field(default=())

    @property
    def misses(self) -> int:
        """Modules that a build would compile (``miss`` or ``stale``)."""
        return sum(m.outcome != "hit" for m in self.modules)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "tier": self.tier,
            "modules": [m.to_dict() for m in self.modules],
            "misses": self.misses,
            "unrecorded": self.unrecorded,
        }


def explain_misses(
    root: Path,
    target: str,
    *,
    config: Config,
    environ: Mapping[str, str],
    module: str | None = None,
    remote: bool = False,
) -> WhyMiss:
    """Why each module of ``target`` (``hw/model/quant``; or only ``module``, by name, stem
    or entry file) misses the local tier, or with ``remote`` the remote one.

    Raises :class:`~metrale_orch.errors.UsageError` for a malformed target or an unknown
    module, what :func:`~metrale_orch.steps.target.key_target` raises (a tree or
    configuration error, a missing compiler), and
    :class:`~metrale_orch.cache.records.TierUnreadable` for a remote tier that is not
    configured, is a REAPI action cache, or fails.
    """
    root = Path(root)
    keyed = key_target(root, parse_target(target), config=config, environ=environ)
    chosen = _chosen(keyed, module)
    heads = TierHeads(CacheSettings.from_config(config), remote=remote)
    try:
        hasher = FileHasher()
        records: list[Records] = []  # read once, at the first module without an entry
        explained = []
        for km in chosen:
            tree = staged_sources(keyed.staged.files, root, km.module.cwd)
            current = key_record(
                km.parts,
                namespace=config.cache_namespace,
                target=str(keyed.plan.target),
                hardware=keyed.plan.hardware,
                module=km.module.name,
                source=km.module.source_rel,
                tree=tree,
            )
            explained.append(_explain(keyed, km, current, tree, heads, records, hasher))
        return WhyMiss(
            target=str(keyed.plan.target),
            tier=heads.name,
            modules=tuple(sorted(explained, key=lambda m: m.module)),
            unrecorded=records[0].unrecorded if records else 0,
            warnings=tuple(heads.warnings),
        )
    finally:
        heads.close()


def parse_target(text: str) -> Target:
    """``hw/model/quant`` (pure); raises :class:`~metrale_orch.errors.UsageError` for any
    other shape."""
    try:
        return Target.parse(text)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _chosen(keyed: KeyedTarget, module: str | None) -> tuple[KeyedModule, ...]:
    """The modules asked for: all, or the one named (by name, stem or entry file)."""
    if module is None:
        return keyed.modules
    for field_name in ("name", "stem", "entry"):
        found = tuple(km for km in keyed.modules if getattr(km.module, field_name) == module)
        if found:
            return found
    names = ", ".join(sorted(km.module.name for km in keyed.modules)) or "(none)"
    raise UsageError(f"{keyed.plan.target} has no module {module!r}; its modules: {names}")


def _explain(
    keyed: KeyedTarget,
    km: KeyedModule,
    current: Mapping[str, object],
    tree: Callable[[str], str],
    heads: TierHeads,
    records: list[Records],
    hasher: FileHasher,
) -> ModuleMiss:
    """One module: its own entry when the tier holds one, else the nearest of the module."""
    name = km.module.name
    entry = heads.entry(km.key)
    if entry is not None and entry.refused:
        untrusted = Change(part="signature", text=f"not served: {entry.refused}")
        return ModuleMiss(module=name, key=km.key, outcome="untrusted", changes=(untrusted,))
    if entry is not None:
        changed = changed_inputs(
            entry.meta.get("inputs"),
            module_cwd=km.module.cwd,
            staged=keyed.staged.hashes,
            roots=keyed.roots,
            hasher=hasher,
        )
        if not changed:
            return ModuleMiss(module=name, key=km.key, outcome="hit")
        read = {_read_change(i, km.module.entry, tree) for i in changed}
        changes = tuple(sorted(read, key=lambda c: c.text))
        return ModuleMiss(module=name, key=km.key, outcome="stale", changes=changes)
    if not records:
        records.append(heads.records(_wanted(keyed)))
    stored = [Stored(key=k, record=r) for k, r in records[0].found.items() if k != km.key]
    found = nearest(current, stored)
    if found is None:
        return ModuleMiss(module=name, key=km.key, outcome="miss")
    near, changes = found
    return ModuleMiss(
        module=name,
        key=km.key,
        outcome="miss",
        nearest=near.key,
        nearest_target=str(near.record.get("target", "")),
        changes=changes,
    )


def _wanted(keyed: KeyedTarget) -> Callable[[bytes], bool]:
    """A test of an entry's raw header: it may hold a record of one of ``keyed``'s modules
    (same hardware; a module's name or source), as the header's canonical JSON spells
    them. Only a filter before parsing: :func:`~metrale_orch.steps.keyrecord.same_module`
    decides."""

    def field(name: str, value: str) -> bytes:
        return f'"{name}":{json.dumps(value, ensure_ascii=False)}'.encode()

    hardware = field("hardware", keyed.plan.hardware)
    names = [field("module", km.module.name) for km in keyed.modules]
    names += [field("source", km.module.source_rel) for km in keyed.modules]
    return lambda head: hardware in head and any(n in head for n in names)


def _read_change(item: Input, entry: str, tree: Callable[[str], str]) -> Change:
    """A file the entry's compile read whose content changed, in words (``entry``: the
    module's entry file; ``tree``: a stage path's tree file)."""
    kind, path = item.kind, item.path
    if kind == "stage":
        shown = tree(path) or path
        part: Literal["source", "header"] = "source" if path == entry else "header"
        return Change(part=part, text=f"{part} {shown} changed since the entry was compiled")
    if kind == "record":
        return Change(part="input", text="the entry records no files read (it is never served)")
    what = {"system": "system header", "abs": "file"}.get(kind, "toolkit file")
    return Change(part="input", text=f"{what} {path} changed since the entry was compiled")
