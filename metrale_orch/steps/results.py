"""What one build of a target returns: per-module outcomes, failures, saved states.

:class:`TargetResult` is the value :func:`~metrale_orch.steps.target.build_target`
returns and, through ``to_dict()``, what a doit worker hands back (JSON-ready,
keys sorted where they cross the process boundary). :class:`KeyedTarget` is what
:func:`~metrale_orch.steps.target.key_target` returns: the keys alone, nothing compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Literal

from metrale_orch.fsutil import FileState
from metrale_orch.manifest import ManifestModule, ModuleOutcome
from metrale_orch.steps.errors import MissRefused, ModuleFailure
from metrale_orch.steps.memo import Origin
from metrale_orch.steps.plan_values import ModulePlan, TargetPlan
from metrale_orch.steps.profile import Span
from metrale_orch.steps.staging import StagedTarget

__all__ = ["KeyedModule", "KeyedTarget", "ModuleResult", "TargetResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleResult:
    """How one module was obtained in this run.

    ``outcome`` is what the manifest records: where the bytes were found. ``shared`` is
    set when another target of the run obtained them (this process's memo, or a cache
    entry this run stored): how that target got them (``compiled``, ``local``,
    ``remote``); such a module is shared, not a cache hit, whatever ``outcome`` says.
    """

    name: str
    stem: str
    source: str
    artefact: str
    key: str
    outcome: ModuleOutcome
    xxh3: str = ""
    seconds: float = 0.0
    shared: Origin | Literal[""] = ""

    def to_dict(self) -> dict[str, object]:
        """The fields in their order, ``seconds`` rounded to the microsecond."""
        return {**asdict(self), "seconds": round(self.seconds, 6)}

    def manifest_entry(self) -> ManifestModule:
        """This module as the manifest records it (a :class:`ManifestModule` holds a
        subset of these fields)."""
        return ManifestModule(**{f.name: getattr(self, f.name) for f in fields(ManifestModule)})


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetResult:
    """The outcome of :func:`build_target`; ``to_dict()`` is what a doit worker returns."""

    target: str
    modules: tuple[ModuleResult, ...]
    #: The modules that failed: a compiler error, or a miss ``require_hits`` refused.
    failures: tuple[ModuleFailure, ...] = ()
    #: Per-target counts: compiled, local, remote, failed, and the modules shared in the
    #: run (memo: reused in-process; run: a cache entry another worker process stored).
    cache_stats: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    seconds: float = 0.0
    #: Root-relative path of the manifest written, or "" when the build failed.
    manifest: str = ""
    #: The canonical JSON of the plan's record (:func:`~metrale_orch.steps.keyrecord.plan_record`).
    plan_record: str = ""
    warnings: tuple[str, ...] = ()
    #: The task's file dependencies (doit's spelling) -> xxh3-64 of the content this
    #: build used ("" for a file that changed while it ran): the state to save.
    inputs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Installed files (root-relative) -> [mtime_ns, size, xxh3-64]: checked by the next run.
    outputs: Mapping[str, FileState] = field(default_factory=lambda: MappingProxyType({}))
    #: Files read outside the tree, the toolkit and the system include directories
    #: (``-I/abs``, ``CPATH``, an absolute include) -> [mtime_ns, size, xxh3-128]: they
    #: make the target stale when they change.
    external: Mapping[str, FileState] = field(default_factory=lambda: MappingProxyType({}))
    #: Where this build's time went, step by step (:mod:`metrale_orch.steps.profile`).
    spans: tuple[Span, ...] = ()

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def refused(self) -> tuple[MissRefused, ...]:
        """The modules ``require_hits`` did not compile: every cache tier missed them."""
        return tuple(f for f in self.failures if isinstance(f, MissRefused))

    @property
    def errors(self) -> tuple[ModuleFailure, ...]:
        return self.failures

    def failure_text(self) -> str:
        """Every module failure: target, module, and the command line and output of a
        compiler error, or the key of a refused miss."""
        return "\n".join(str(f) for f in self.failures)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "failed": self.failed,
            "modules": [m.to_dict() for m in self.modules],
            "failures": [f.to_dict() for f in self.failures],
            "cache_stats": dict(sorted(self.cache_stats.items())),
            "seconds": round(self.seconds, 6),
            "manifest": self.manifest,
            "warnings": list(self.warnings),
            "inputs": dict(self.inputs),
            "outputs": {k: list(v) for k, v in self.outputs.items()},
            "external": {k: list(v) for k, v in self.external.items()},
            "spans": [s.to_dict() for s in self.spans],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedModule:
    """One module of a target, its action key and the parts the key hashed."""

    module: ModulePlan
    key: str
    parts: Mapping[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedTarget:
    """A target planned, staged and keyed (nothing compiled)."""

    plan: TargetPlan
    staged: StagedTarget
    #: The toolchain's probed toolkit directories (what ``toolkit<i>`` inputs are below).
    roots: tuple[str, ...]
    modules: tuple[KeyedModule, ...]
