"""What a plan is made of: its values, the root-relative spellings, the plans' shared memo.

:class:`ModulePlan` and :class:`TargetPlan` are the frozen values
:func:`~metrale_orch.steps.plan.plan_target` returns; :class:`RootRel` spells paths
under one root by string work; :class:`PlanMemo` holds what the plans of one
resolution pass share (argvs, module plans, levers, defaults), so each is computed
once. Plans made with a memo equal those made without.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from metrale_orch.canonical import canonical_strings
from metrale_orch.defaults import (
    DeclaredLevers,
    TargetDefaults,
    parse_defaults,
    read_tree_levers,
    render_defaults_json,
)
from metrale_orch.defaults.levers import JsonValue
from metrale_orch.paths import root_relative
from metrale_orch.steps.hip_mirror import HipCompat
from metrale_orch.toolchain.argv import (
    Switches,
    compile_argv,
    env_switches,
    keyed_environment,
)
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.tree import Hardware, Target

__all__ = ["ModuleKey", "ModulePlan", "PlanMemo", "RootRel", "TargetPlan", "module_signature"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModulePlan:
    """One module of a target: what is compiled, where, into which artefact."""

    stem: str
    #: The stem after ``[modules]`` renames (the artefact's base name).
    name: str
    role: str
    #: The entry (file) name in its role directory.
    entry: str
    source: Path
    #: ``source`` relative to the root (POSIX): how manifests and errors name it.
    source_rel: str
    #: Staged path of the source, relative to the stage root (POSIX).
    staged: str
    #: The role directory relative to the stage root: the compile's cwd.
    cwd: str
    #: ``<name>.<ext>``
    artefact: str
    #: The compile argv, machine-independent: program name, cwd-relative paths,
    #: output = the artefact's file name.
    argv: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetPlan:
    """Everything a build of one target needs, decided before any file is touched."""

    target: Target
    hardware: str
    arch: str
    toolchain: Toolchain
    identity: str
    flags: tuple[str, ...]
    modules: tuple[ModulePlan, ...]
    defaults: TargetDefaults
    #: Environment allow-list values (name -> value) of the toolchain, sorted.
    env: Mapping[str, str]
    #: Files whose content decides the build: inputs, manifests read, toolchain file;
    #: ordered by their root-relative spelling.
    file_deps: tuple[Path, ...]
    #: JSON-ready: what file deps cannot see (layout map, flags, names, toolchain, defaults).
    signature: Mapping[str, object]
    #: ``file_deps`` as doit's ``file_dep`` spells them: root-relative POSIX text for a
    #: file under the root (else the path as given), unique, sorted.
    file_dep_rels: tuple[str, ...] = ()
    #: The project's HIP compat directory, for a toolchain of the ``hip`` dialect.
    hip_compat: HipCompat | None = None
    #: The canonical JSON text (:func:`~metrale_orch.canonical.canonical_json`) of some
    #: parts of ``signature``, made from pieces the plans of one memo share: the same
    #: text as encoding the part (``modules``: each module's piece is encoded once).
    signature_json: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: ``env_switches(toolchain, env)``, worked out once: every module's argv asks for it.
    switches: Switches = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "switches", env_switches(self.toolchain, self.env))

    @property
    def toolchain_name(self) -> str:
        return self.toolchain.name


#: A module plan's fields: stem, name, role, entry, source, cwd, artefact, argv.
ModuleKey = tuple[str, str, str, str, Path, str, str, tuple[str, ...]]


class RootRel:
    """Root-relative spellings of paths under one root, by string work (no ``Path`` math).

    ``__call__`` is :func:`~metrale_orch.paths.root_relative`; :meth:`dep` is
    :func:`~metrale_orch.paths.rel_posix`
    (what doit's ``file_dep`` holds). Both equal their slow definitions. Each path's
    spellings are kept (the targets of a pass share their file objects).
    """

    __slots__ = ("_dep_prefix", "_deps", "_n", "_prefix", "_rels", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        text = os.fspath(root)
        self._prefix = text if text.endswith(os.sep) else text + os.sep
        self._n = len(self._prefix)
        self._dep_prefix = root.as_posix().rstrip("/") + "/"
        self._rels: dict[Path, str] = {}
        self._deps: dict[Path, str] = {}

    def __call__(self, path: Path) -> str:
        got = self._rels.get(path)
        if got is None:
            text = os.fspath(path)
            if text.startswith(self._prefix) and len(text) > self._n:
                text = text[self._n :]
                got = text if os.sep == "/" else text.replace(os.sep, "/")
            else:
                got = root_relative(path, self.root)
            self._rels[path] = got
        return got

    def dep(self, path: Path) -> str:
        got = self._deps.get(path)
        if got is None:
            text = os.fspath(path)
            if os.sep != "/":
                text = text.replace(os.sep, "/")
            if text.startswith("/") and text.startswith(self._dep_prefix):
                text = text[len(self._dep_prefix) :]
            got = self._deps[path] = text
        return got


class PlanMemo:
    """What the plans of one resolution pass share, so each is computed once.

    Root-relative spellings, compile argvs and module plans (a module of one entry
    name, arch, flags and toolchain recurs across models and quants), the tree's own levers
    (``kernels/LEVERS.toml``, read once) and each hardware's parsed and
    rendered defaults. Plans made with a memo equal those made without. Use
    one memo per tree snapshot (manifests are told apart by the identity of
    their parsed documents, which the memo keeps alive); not thread-safe.
    """

    __slots__ = (
        "_argvs",
        "_defaults",
        "_envs",
        "_keep",
        "_levers",
        "_module_json",
        "_modules",
        "_plain",
        "_tokens",
        "rel",
        "root",
    )

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.rel = RootRel(self.root)
        self._envs: dict[tuple[int, int], Mapping[str, str]] = {}
        self._argvs: dict[tuple[int, str, tuple[str, ...], str, str], tuple[str, ...]] = {}
        self._defaults: dict[tuple[str, int], tuple[TargetDefaults, dict[str, JsonValue]]] = {}
        self._levers: DeclaredLevers | None = None
        self._modules: dict[ModuleKey, ModulePlan] = {}
        #: The module plans of targets whose argv is the plain compile step
        #: (``_ArgvSteps.plain``), by (plain token, stem, name, whether the role is common
        #: (one of two), entry, source, cwd): given the token's toolchain, arch and flags
        #: these fields decide the whole plan (kept with its signature entry's JSON).
        self._plain: dict[tuple[int, str, str, bool, str, Path, str], tuple[ModulePlan, str]] = {}
        #: (id(toolchain), arch, flags) -> a small number naming them (a plain token).
        self._tokens: dict[tuple[int, str, tuple[str, ...]], int] = {}
        #: id(module plan) -> the canonical JSON of its signature entry.
        self._module_json: dict[int, str] = {}
        #: Objects whose id() keys an entry above, kept alive so no id is reused.
        self._keep: dict[int, object] = {}

    def argv(
        self, toolchain: Toolchain, arch: str, flags: tuple[str, ...], source: str, output: str
    ) -> tuple[str, ...]:
        """:func:`~metrale_orch.toolchain.argv.compile_argv` with the program name, memoised."""
        key = (id(toolchain), arch, flags, source, output)
        got = self._argvs.get(key)
        if got is None:
            got = compile_argv(
                toolchain, arch=arch, flags=flags, include=".", source=source, output=output
            )
            self._keep[id(toolchain)] = toolchain
            self._argvs[key] = got
        return got

    def plain_token(self, toolchain: Toolchain, arch: str, flags: tuple[str, ...]) -> int:
        """A number standing for (toolchain, arch, flags) in this memo's plain-module keys."""
        key = (id(toolchain), arch, flags)
        got = self._tokens.get(key)
        if got is None:
            got = self._tokens[key] = len(self._tokens)
            self._keep[id(toolchain)] = toolchain
        return got

    def module(self, key: ModuleKey, make: Callable[[], ModulePlan]) -> ModulePlan:
        """The module plan of ``key`` (its fields), made once: a module recurs, plan and
        all, across the targets of one hardware."""
        got = self._modules.get(key)
        if got is None:
            got = self._modules[key] = make()
        return got

    def module_json(self, plan: ModulePlan) -> str:
        """The canonical JSON of ``plan``'s entry in a target's signature, encoded once
        per module plan (a frozen value, kept alive here so its id is not reused)."""
        got = self._module_json.get(id(plan))
        if got is None:
            got = canonical_strings(_module_fields(plan))
            self._keep[id(plan)] = plan
            self._module_json[id(plan)] = got
        return got

    def env(self, toolchain: Toolchain, environ: Mapping[str, str]) -> Mapping[str, str]:
        """:func:`~metrale_orch.toolchain.definitions.keyed_environment`, memoised."""
        key = (id(toolchain), id(environ))
        got = self._envs.get(key)
        if got is None:
            got = MappingProxyType(keyed_environment(toolchain, environ))
            self._keep[id(toolchain)] = toolchain
            self._keep[id(environ)] = environ
            self._envs[key] = got
        return got

    def tree_levers(self) -> DeclaredLevers:
        """``kernels/LEVERS.toml`` of the root, read and validated once.

        Raises:
            DefaultsError: the file is bad (:func:`~metrale_orch.defaults.read_tree_levers`).
        """
        if self._levers is None:
            self._levers = read_tree_levers(self.root / "kernels")
        return self._levers

    def defaults(self, hw: Hardware) -> tuple[TargetDefaults, dict[str, JsonValue]]:
        """The hardware's parsed defaults (with the tree's own levers) and a fresh copy
        of their JSON rendering."""
        key = (hw.name, id(hw.doc))
        got = self._defaults.get(key)
        if got is None:
            parsed = parse_defaults(hw.name, hw.doc, levers=self.tree_levers().levers)
            got = (parsed, dict(render_defaults_json(parsed)))
            self._keep[id(hw.doc)] = hw.doc
            self._defaults[key] = got
        return got[0], dict(got[1])


def module_signature(module: ModulePlan) -> dict[str, object]:
    """One module as a target's signature records it (a fresh dict)."""
    return {**_module_fields(module), "argv": list(module.argv)}


def _module_fields(module: ModulePlan) -> dict[str, str | Sequence[str]]:
    """:func:`module_signature`, the argv as the plan's tuple (for :func:`canonical_strings`)."""
    return {
        "stem": module.stem,
        "name": module.name,
        "staged": module.staged,
        "argv": module.argv,
    }
