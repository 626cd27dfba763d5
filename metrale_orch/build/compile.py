"""Build steps of one target: plan it (pure), then stage, compile, cache and install it.

:func:`plan_target` turns a resolved :class:`~metrale_orch.tree.Layout` into a
:class:`TargetPlan`: the arch, the merged flags (own HARDWARE.toml ``[build]``
then each KERNEL.toml in ``configs()`` order, exact duplicates dropped keeping
the first), the modules with their ``[modules]`` renames, each module's
machine-independent compile argv, the baked defaults, the file dependencies
and a JSON signature of everything file dependencies cannot see. It reads only
the already-parsed manifests (``*.doc``).

:func:`build_target` does the work (SPEC 3.2-3.4, 4.1): stage the target, key
each module, take it from the per-process memo or the cache, otherwise
compile it (under the cache's key lock) and publish it, then install the
artefacts atomically, bake ``target_defaults.json``/``.h`` and write
``manifest.json`` last.

**Action keys.** A module's key hashes (through :func:`metrale_orch.cache.cache_key`):
the toolchain name and identity, the arch, the argv with the program *name*
and paths relative to the module's role directory (its cwd), the values of
the toolchain's environment allow-list, the module's entry and artefact name,
and the content hash of every file of its *include closure*. The closure is
found textually: every ``#include "..."``, ``#include <...>`` and
``__has_include(...)`` line of every file reached, whatever ``#if`` branch it
sits in (the source is never preprocessed). A quoted name resolves from the
including file's directory, then from the ``-I`` directories (the role
directory and relative ``-I`` flags); an angled name from the ``-I``
directories. Only staged files can resolve; an unresolved name is a system or
toolkit header (covered by the toolchain identity). A computed include
(``#include MACRO``) makes the closure every staged file. Closure paths enter
the key relative to the module's cwd, so the same module in two models or two
checkouts shares one key, while an unrelated file changes no key.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import shlex
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import xxhash

from metrale_orch import cache as cache_mod
from metrale_orch.build.deps import (
    FileHasher,
    external_stamps,
    flag_files,
    inputs_match,
    parse_depfile,
    record_inputs,
)
from metrale_orch.build.dropped import Drop, drop_warnings, scan_drops, shadow_exemptions
from metrale_orch.build.hip_mirror import (
    MIRROR_DIR,
    HipCompat,
    hip_identity,
    mirror_files,
    mirrored_source,
    scan_hip_compat,
    unmirror,
    write_mirror,
)
from metrale_orch.build.staging import (
    ContainmentError,
    StagedTarget,
    StageError,
    beyond_layout,
    check_contained,
    layer_dir,
    role_dir,
    stage,
    uncontained,
)
from metrale_orch.build.toolchains import (
    BuildError,
    Toolchain,
    ToolchainError,
    ToolchainMissing,
    compile_argv,
    env_switches,
    find_toolchain,
    keyed_environment,
    link_argv,
    load_toolchains,
    select_toolchain,
)
from metrale_orch.config import Config
from metrale_orch.defaults import (
    DeclaredLevers,
    TargetDefaults,
    parse_defaults,
    read_tree_levers,
    render_defaults_header,
    render_defaults_json,
)
from metrale_orch.fsutil import file_digest, write_if_changed
from metrale_orch.proc import ProcessError, format_argv, run_process
from metrale_orch.tree import Hardware, Layout, Target, discover, read_manifest_warnings
from metrale_orch.tree.beyond import DIRECTIVE, SPLICE_RE, TREE_DIR, Beyond, layer_include

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA",
    "PLAN_SCHEMA",
    "ArtefactCache",
    "BuildConfigError",
    "BuildError",
    "CompileError",
    "Includes",
    "ModulePlan",
    "ModuleResult",
    "PlanMemo",
    "StageError",
    "TargetPlan",
    "TargetResult",
    "ToolchainError",
    "ToolchainMissing",
    "build_target",
    "embeds_paths",
    "include_dirs",
    "manifest_dict",
    "merge_flags",
    "module_key_parts",
    "module_names",
    "out_dir",
    "parse_includes",
    "plan_target",
    "pre_includes",
    "reset_build_memo",
    "resolve_closure",
    "run_compile",
    "scan_includes",
    "stage_dir",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = 1
DEFAULTS_JSON = "target_defaults.json"
DEFAULTS_HEADER = "target_defaults.h"
#: Version of the plan/key layout defined here; part of every key and signature.
PLAN_SCHEMA = 2
#: Seconds one compile may take before it is killed and reported.
COMPILE_TIMEOUT = 900.0
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")

_log = logging.getLogger("metrale_orch.build")


# ------------------------------------------------------------------------------------ errors


class BuildConfigError(BuildError):
    """A build setting in a manifest is wrong; names the file and the key."""

    exit_code = 2

    def __init__(self, path: str, key: str, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        super().__init__(f"{path}: {key}: {problem}")


class CompileError(BuildError):
    """The compiler failed on one module (or wrote no output)."""

    def __init__(
        self,
        *,
        target: str,
        module: str,
        argv: Sequence[str],
        returncode: int | None,
        output: str,
        reason: str = "",
        source: str = "",
    ) -> None:
        self.target = target
        self.module = module
        #: The module's source in the tree (root-relative), when known: the compiler's
        #: messages name the staged copy in the role directory.
        self.source = source
        self.argv = tuple(argv)
        self.returncode = returncode
        self.output = output
        self.reason = reason or (
            f"exited with status {returncode}" if returncode is not None else "did not finish"
        )
        where = f" ({source})" if source else ""
        text = (
            f"{target}: module {module}{where}: the compiler {self.reason}\n  $ {format_argv(argv)}"
        )
        if output.strip():
            text += "\n" + output.rstrip()
        super().__init__(text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "module": self.module,
            "source": self.source,
            "command": format_argv(self.argv),
            "exit_code": self.returncode,
            "reason": self.reason,
            "output": self.output,
        }


# ------------------------------------------------------------------------------------ plan


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
    signature: Mapping[str, Any]
    #: ``file_deps`` as doit's ``file_dep`` spells them: root-relative POSIX text for a
    #: file under the root (else the path as given), unique, sorted.
    file_dep_rels: tuple[str, ...] = ()
    #: The project's HIP compat directory, for a toolchain of the ``hip`` dialect.
    hip_compat: HipCompat | None = None

    @property
    def toolchain_name(self) -> str:
        return self.toolchain.name


def _rel_slow(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        pass
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


class _RootRel:
    """Root-relative spellings of paths under one root, by string work (no ``Path`` math).

    ``__call__`` is :func:`_rel`; :meth:`dep` is ``metrale_orch.tasks.dicts.rel_posix``
    (what doit's ``file_dep`` holds). Both equal their slow definitions.
    """

    __slots__ = ("_dep_prefix", "_n", "_prefix", "root")

    def __init__(self, root: Path) -> None:
        self.root = root
        text = os.fspath(root)
        self._prefix = text if text.endswith(os.sep) else text + os.sep
        self._n = len(self._prefix)
        self._dep_prefix = root.as_posix().rstrip("/") + "/"

    def __call__(self, path: Path) -> str:
        text = os.fspath(path)
        if text.startswith(self._prefix) and len(text) > self._n:
            text = text[self._n :]
            return text if os.sep == "/" else text.replace(os.sep, "/")
        return _rel_slow(path, self.root)

    def dep(self, path: Path) -> str:
        text = os.fspath(path)
        if os.sep != "/":
            text = text.replace(os.sep, "/")
        if text.startswith("/") and text.startswith(self._dep_prefix):
            return text[len(self._dep_prefix) :]
        return text


def _rel(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` as POSIX text (resolving both if needed)."""
    text = os.fspath(path)
    prefix = os.fspath(root)
    if not prefix.endswith(os.sep):
        prefix += os.sep
    if text.startswith(prefix) and len(text) > len(prefix):
        text = text[len(prefix) :]
        return text if os.sep == "/" else text.replace(os.sep, "/")
    return _rel_slow(path, root)


class PlanMemo:
    """What the plans of one resolution pass share, so each is computed once.

    Root-relative spellings, compile argvs (a module of one entry name, arch,
    flags and toolchain recurs across models and quants), the tree's own levers
    (``kernels/LEVERS.toml``, read once) and each hardware's parsed and
    rendered defaults. Plans made with a memo equal those made without. Use
    one memo per tree snapshot (manifests are told apart by the identity of
    their parsed documents, which the memo keeps alive); not thread-safe.
    """

    __slots__ = ("_argvs", "_defaults", "_envs", "_keep", "_levers", "rel", "root")

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.rel = _RootRel(self.root)
        self._envs: dict[tuple[int, int], Mapping[str, str]] = {}
        self._argvs: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self._defaults: dict[tuple[str, int], tuple[TargetDefaults, dict[str, Any]]] = {}
        self._levers: DeclaredLevers | None = None
        #: Objects whose id() keys an entry above, kept alive so no id is reused.
        self._keep: dict[int, object] = {}

    def argv(
        self, toolchain: Toolchain, arch: str, flags: tuple[str, ...], source: str, output: str
    ) -> tuple[str, ...]:
        """:func:`~metrale_orch.build.toolchains.compile_argv` with the program name, memoised."""
        key = (id(toolchain), arch, flags, source, output)
        got = self._argvs.get(key)
        if got is None:
            got = compile_argv(
                toolchain, arch=arch, flags=flags, include=".", source=source, output=output
            )
            self._keep[id(toolchain)] = toolchain
            self._argvs[key] = got
        return got

    def env(self, toolchain: Toolchain, environ: Mapping[str, str]) -> Mapping[str, str]:
        """:func:`~metrale_orch.build.toolchains.keyed_environment`, memoised."""
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

    def defaults(self, hw: Hardware) -> tuple[TargetDefaults, dict[str, Any]]:
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


def _config_docs(layout: Layout) -> list[tuple[Path, Mapping[str, Any]]]:
    """(path, parsed doc) of ``configs()``, least specific first."""
    return [
        (layer.manifest.path, layer.manifest.doc)
        for layer in reversed(layout.layers)
        if layer.manifest is not None
    ]


def merge_flags(layout: Layout, flags_key: str, root: Path) -> tuple[str, ...]:
    """``[build] <flags_key>`` of the own HARDWARE.toml, then of each KERNEL.toml in
    ``configs()`` order; exact duplicates dropped keeping the first (pure).

    Raises :class:`BuildConfigError` naming the file and key for a ``[build]``
    that is not a table, a value that is not an array, or a non-string flag.
    """
    return _merge_flags(layout, _config_docs(layout), flags_key, _RootRel(Path(root)))


def _merge_flags(
    layout: Layout,
    config_docs: Sequence[tuple[Path, Mapping[str, Any]]],
    flags_key: str,
    rel: _RootRel,
) -> tuple[str, ...]:
    seen: set[str] = set()
    flags: list[str] = []
    for path, doc in ((layout.hardware.path, layout.hardware.doc), *config_docs):
        build = doc.get("build")
        if build is None:
            continue
        if not isinstance(build, Mapping):
            raise BuildConfigError(rel(path), "[build]", "must be a table")
        value = build.get(flags_key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise BuildConfigError(
                rel(path),
                f"[build] {flags_key}",
                'must be an array of strings, e.g. ["-lineinfo"]',
            )
        for i, flag in enumerate(value):
            if not isinstance(flag, str):
                raise BuildConfigError(
                    rel(path),
                    f"[build] {flags_key}[{i}]",
                    f"must be a string, got {type(flag).__name__} {flag!r}; quote it",
                )
            if flag not in seen:
                seen.add(flag)
                flags.append(flag)
    return tuple(flags)


def module_names(layout: Layout, root: Path) -> Mapping[str, str]:
    """stem -> module name: ``[modules] <stem> = "<name>"`` merged across ``configs()``,
    more specific winning; stems without a rename keep their name (pure).

    Raises :class:`BuildConfigError` for a bad ``[modules]`` table or value, or
    two modules ending up with one name.
    """
    return _module_names(_config_docs(layout), layout.modules(), _RootRel(Path(root)))


def _module_names(
    config_docs: Sequence[tuple[Path, Mapping[str, Any]]],
    modules: Sequence[tuple[str, Any]],
    rel: _RootRel,
) -> Mapping[str, str]:
    renames: dict[str, tuple[str, str]] = {}
    for path, doc in config_docs:
        table = doc.get("modules")
        if table is None:
            continue
        where = rel(path)
        if not isinstance(table, Mapping):
            raise BuildConfigError(where, "[modules]", 'must be a table of stem = "name"')
        for stem, name in table.items():
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                raise BuildConfigError(
                    where,
                    f"[modules] {stem}",
                    f"must be a module name (letters, digits, '_', '.', '+', '-'), got {name!r}",
                )
            renames[stem] = (name, where)
    if not renames:
        names = {stem: stem for stem, _entry in modules}
        if len(names) == len(modules):
            return MappingProxyType(names)
    names = {}
    owner: dict[str, tuple[str, str]] = {}
    for stem, _entry in modules:
        name, where = renames.get(stem, (stem, ""))
        if name in owner:
            other, other_where = owner[name]
            at, key = (where, stem) if where else (other_where, other)
            raise BuildConfigError(
                at,
                f"[modules] {key}",
                f"modules {other!r} and {stem!r} would both be named {name!r}; rename one",
            )
        owner[name] = (stem, where)
        names[stem] = name
    return MappingProxyType(names)


def plan_target(
    root: Path,
    layout: Layout,
    toolchains: Mapping[str, Toolchain],
    *,
    identity: str,
    environ: Mapping[str, str] | None = None,
    memo: PlanMemo | None = None,
    hip_compat: HipCompat | None = None,
) -> TargetPlan:
    """The build plan of ``layout`` (pure given its inputs: reads only ``layout.*.doc`` and,
    once per memo, ``kernels/LEVERS.toml``, a file dependency of every target).

    ``identity`` is the selected toolchain's probed identity
    (:func:`~metrale_orch.build.toolchains.probe_identity`); ``environ`` supplies the
    toolchain's environment allow-list values; ``memo`` shares work between
    the plans of one resolution pass (see :class:`PlanMemo`); ``hip_compat`` is
    the project's HIP compat directory
    (:func:`~metrale_orch.build.hip_mirror.scan_hip_compat`), read by the targets of a
    ``hip``-dialect toolchain: its files are their file dependencies and, with
    the mirror's rules, part of their identity. The environment switches of the
    toolchain (``METRALE_KERNEL_NO_STRICT``, ``METRALE_EXTRA_NVCC_FLAGS``) enter
    the argv and ``env`` of the targets they change. Raises
    :class:`ToolchainError`, :class:`BuildConfigError` or ``DefaultsError`` for
    a wrong setting.
    """
    root = Path(root)
    if memo is None or memo.root != root:
        memo = PlanMemo(root)
    rel = memo.rel
    env_in = environ or {}
    hw = layout.hardware
    toolchain = select_toolchain(hw, toolchains)
    if not hw.arch:
        raise BuildConfigError(
            rel(hw.path), "[hardware] arch", 'is required to build (e.g. arch = "sm_90a")'
        )
    arch = hw.arch
    config_docs = _config_docs(layout)
    flags = _merge_flags(layout, config_docs, toolchain.flags_key, rel)
    layout_modules = layout.modules()
    names = _module_names(config_docs, layout_modules, rel)
    defaults, defaults_doc = memo.defaults(hw)
    env = memo.env(toolchain, env_in)
    switches = env_switches(toolchain, env_in)
    if switches.env:
        env = MappingProxyType(dict(sorted({**env, **switches.env}.items())))
    compat: HipCompat | None = None
    if toolchain.dialect == "hip":
        compat = hip_compat or HipCompat()
        if compat.problem:
            raise BuildConfigError("configuration", "hip_compat_dir", compat.problem)
        if layout.source_model == MIRROR_DIR:
            raise BuildConfigError(
                f"kernels/{hw.name}/{layout.source_model}",
                "(directory)",
                f"a model named {MIRROR_DIR!r} would share the HIP mirror's stage directory; "
                "rename the model directory",
            )
        identity = hip_identity(identity, compat)
    plain = not (switches.env or toolchain.link_argv or compat is not None)
    ext = toolchain.extension
    modules: list[ModulePlan] = []
    for stem, entry in layout_modules:
        role = layout.role_of(entry)
        cwd = role_dir(layout, role)
        name = names[stem]
        artefact = f"{name}.{ext}"
        if plain:
            argv = memo.argv(toolchain, arch, flags, entry.name, artefact)
        else:
            # As run_compile runs it, with the program's name and the artefact's: the
            # mirrored source (HIP), the switches, and a second step after "&&".
            inter = f"{name}.{toolchain.intermediate_extension}" if toolchain.link_argv else ""
            argv = compile_argv(
                toolchain,
                arch=arch,
                flags=flags,
                include=".",
                source=entry.name if compat is None else mirrored_source(cwd, entry.name),
                output=artefact,
                intermediate=inter,
                switches=switches,
                compat_include=compat.spelled if compat is not None else "",
            )
            if inter:
                link = link_argv(toolchain, arch=arch, intermediate=inter, output=artefact)
                argv = (*argv, "&&", *link)
        modules.append(
            ModulePlan(
                stem=stem,
                name=name,
                role=role.value,
                entry=entry.name,
                source=entry.source,
                source_rel=rel(entry.source),
                staged=f"{cwd}/{entry.name}",
                cwd=cwd,
                artefact=artefact,
                argv=argv,
            )
        )
    deps: set[Path] = set(layout.inputs())
    deps.update(layout.hardware_manifests)
    deps.update(layout.model_manifests)
    if toolchain.file is not None:
        deps.add(toolchain.file)
    if compat is not None:
        deps.update(compat.paths)
    tree_levers = memo.tree_levers()
    if tree_levers.file is not None:
        deps.add(tree_levers.file)
    dep_of = rel.dep
    keyed = sorted([(dep_of(p), p) for p in deps])
    signature = {
        "schema": PLAN_SCHEMA,
        "cache_schema": cache_mod.SCHEMA,
        "target": str(layout.target),
        "arch": arch,
        "toolchain": {
            "name": toolchain.name,
            "identity": identity,
            "argv": list(toolchain.argv),
            "link_argv": list(toolchain.link_argv),
            "output": toolchain.output,
            "extension": ext,
        },
        "env": dict(env),
        "flags": list(flags),
        "layout": {
            "source_model": layout.source_model,
            "leaf": {n: rel(e.source) for n, e in layout.leaf.items()},
            "common": {n: rel(e.source) for n, e in layout.common.items()},
            "leaf_subdirs": {n: rel(p) for n, p in layout.leaf_subdirs.items()},
            "common_subdirs": {n: rel(p) for n, p in layout.common_subdirs.items()},
            "shadows": [_shadow_dict(s, rel) for s in layout.shadows],
        },
        "modules": [
            {"stem": m.stem, "name": m.name, "staged": m.staged, "argv": list(m.argv)}
            for m in modules
        ],
        "defaults": defaults_doc,
        "levers": tree_levers.to_dict(),
    }
    return TargetPlan(
        target=layout.target,
        hardware=hw.name,
        arch=arch,
        toolchain=toolchain,
        identity=identity,
        flags=flags,
        modules=tuple(modules),
        defaults=defaults,
        env=env,
        file_deps=tuple(p for _, p in keyed),
        signature=MappingProxyType(signature),
        file_dep_rels=tuple(dict.fromkeys(r for r, _ in keyed)),
        hip_compat=compat,
    )


def _shadow_dict(shadow: Any, root: Path | _RootRel) -> dict[str, str]:
    rel = root if isinstance(root, _RootRel) else _RootRel(Path(root))
    return {
        "role": shadow.role.value,
        "name": shadow.name,
        "winner": rel(shadow.winner),
        "loser": rel(shadow.loser),
        "reason": shadow.reason,
    }


def stage_dir(build_dir: Path, target: Target) -> Path:
    """``<build>/stage/<hw>/<model>/<quant>``."""
    return Path(build_dir) / "stage" / target.hardware / target.model / target.quant


def out_dir(build_dir: Path, target: Target) -> Path:
    """``<build>/<hw>/<model>/<quant>``: the target's artefacts and manifest."""
    return Path(build_dir) / target.hardware / target.model / target.quant


# ------------------------------------------------------------------------------------ includes

_INCLUDE_RE = re.compile(
    DIRECTIVE + rb'(?:"(?P<q>[^"\n]+)"|<(?P<a>[^>\n]+)>|(?P<c>[A-Za-z_]))', re.MULTILINE
)
_HAS_INCLUDE_RE = re.compile(
    rb'__has_include(?:_next)?\s*\(\s*(?:"(?P<q>[^"\n]+)"|<(?P<a>[^>\n]+)>)'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Includes:
    """The include names one file mentions (textually, every branch)."""

    quoted: tuple[str, ...] = ()
    angled: tuple[str, ...] = ()
    computed: bool = False


def parse_includes(data: bytes) -> Includes:
    """Every include directive of a file, in any ``#if`` branch (pure).

    Line splices are joined first; ``%:`` digraphs, form feeds and ``/* */``
    comments around the ``#`` are understood. Directives are matched per line, so
    a ``//``-commented one is skipped while one inside a ``/* */`` block counts
    (more, never less). This is the key's fast first guess: a hit is verified
    against what the compiler itself read (:mod:`metrale_orch.build.deps`).
    """
    if b"\\" in data:
        data = SPLICE_RE.sub(b"", data)
    quoted: list[str] = []
    angled: list[str] = []
    computed = False
    for regex in (_INCLUDE_RE, _HAS_INCLUDE_RE):
        for m in regex.finditer(data):
            groups = m.groupdict()
            if groups.get("q"):
                quoted.append(groups["q"].decode("utf-8", "replace"))
            elif groups.get("a"):
                angled.append(groups["a"].decode("utf-8", "replace"))
            elif groups.get("c"):
                computed = True
    return Includes(
        quoted=tuple(dict.fromkeys(quoted)), angled=tuple(dict.fromkeys(angled)), computed=computed
    )


def include_dirs(cwd: str, flags: Sequence[str], after: Sequence[str] = ()) -> tuple[str, ...]:
    """Stage-relative include directories of a compile in ``cwd``, in the compiler's
    search order (pure): ``-iquote`` ones, the ``-I`` ones of ``flags`` (which precede the
    role directory on the command line), the role directory itself (``-I.``), the ``-I``
    ones of ``after`` (flags placed after it), then ``-isystem`` and ``-idirafter`` ones.
    Absolute directories lie outside the stage and are skipped (files read there are
    recorded and verified by content).
    """
    both = [*flags, *after]

    def rel(values: Iterator[str]) -> list[str]:
        out: list[str] = []
        for value in values:
            for part in value.split(","):
                if part and not part.startswith("/"):
                    out.append(posixpath.normpath(posixpath.join(cwd, part)))
        return out

    dirs = [
        *rel(_flag_values(both, ("-iquote",))),
        *rel(_flag_values(flags, ("-I", "--include-path"))),
        cwd,
        *rel(_flag_values(after, ("-I", "--include-path"))),
        *rel(_flag_values(both, ("-isystem", "--system-include"))),
        *rel(_flag_values(both, ("-idirafter",))),
    ]
    return tuple(dict.fromkeys(dirs))


#: Options whose value names the host compiler (a program or its directory).
_CCBIN_FLAGS = ("-ccbin", "--compiler-bindir")


def effective_flags(
    plan: TargetPlan, cwd_abs: str, switches_extra: Sequence[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the words the compiler sees before the role directory's ``-I.``, those after it)
    (I/O: reads options files): ``NVCC_PREPEND_FLAGS``, the target's flags with every
    options file expanded in place (nested ones too), then ``$METRALE_EXTRA_NVCC_FLAGS``
    and ``NVCC_APPEND_FLAGS``; ``-Xcompiler=a,b`` contributes ``a`` and ``b``. What the
    key's include scan must search, beyond ``plan.flags`` alone."""
    env = plan.env

    def split(text: str) -> list[str]:
        try:
            return shlex.split(text)
        except ValueError:
            return text.split()

    before = [*split(env.get("NVCC_PREPEND_FLAGS", "")), *plan.flags]
    after = [*switches_extra, *split(env.get("NVCC_APPEND_FLAGS", ""))]
    return (
        tuple(_expand_words(before, cwd_abs, split)),
        tuple(_expand_words(after, cwd_abs, split)),
    )


def _expand_words(
    words: Sequence[str], cwd_abs: str, split: Callable[[str], list[str]], depth: int = 0
) -> Iterator[str]:
    it = iter(words)
    for word in it:
        yield word
        value = None
        if word in ("--options-file", "-optf"):
            value = next(it, None)
            if value is not None:
                yield value
        elif word.startswith(("--options-file=", "-optf=")):
            value = word.split("=", 1)[1]
        elif word.startswith("-Xcompiler="):
            yield from word[len("-Xcompiler=") :].split(",")
        if value is None or depth >= 8:
            continue
        for name in value.split(","):
            path = name if name.startswith("/") else os.path.join(cwd_abs, name)
            try:
                text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
            except OSError:
                continue
            yield from _expand_words(split(text), cwd_abs, split, depth + 1)


def read_files_of(words: Sequence[str]) -> tuple[str, ...]:
    """Files the compiler reads because of ``words`` (pure; as written): options files,
    ``-include``/``-imacros`` files, ``@response`` files, and the host compiler a
    ``-ccbin`` names."""
    out = list(flag_files(words))
    it = iter(words)
    for word in it:
        if word.startswith("@") and len(word) > 1:
            out.append(word[1:])
        for name in _CCBIN_FLAGS:
            if word == name:
                nxt = next(it, None)
                if nxt:
                    out.append(nxt)
            elif word.startswith(name + "="):
                out.append(word[len(name) + 1 :])
    return tuple(dict.fromkeys(out))


def pre_includes(flags: Sequence[str]) -> tuple[str, ...]:
    """Files flags make the compiler read: ``-include``/``--pre-include``, ``-imacros``,
    ``--options-file``/``-optf`` (pure; as written)."""
    return tuple(flag_files(flags))


def _flag_values(flags: Sequence[str], names: tuple[str, ...]) -> Iterator[str]:
    it = iter(flags)
    for flag in it:
        for name in names:
            if flag == name:
                nxt = next(it, None)
                if nxt is not None:
                    yield nxt
                break
            if flag.startswith(name + "="):
                yield flag[len(name) + 1 :]
                break
            if name in ("-I", "-isystem", "-iquote", "-idirafter") and flag.startswith(name):
                yield flag[len(name) :]
                break


def _inside(path: str) -> bool:
    return path not in (".", "") and not path.startswith("../") and path != ".."


def resolve_closure(
    roots: Sequence[str],
    *,
    staged: Mapping[str, str],
    includes_of: Mapping[str, Includes],
    dirs: Sequence[str],
) -> tuple[str, ...]:
    """The stage-relative files reachable from ``roots`` (pure; sorted).

    ``staged`` maps every staged path to its hash; ``includes_of`` gives each
    staged file's include names. A computed include anywhere makes the
    closure every staged file.
    """
    seen: set[str] = set()
    todo = [r for r in roots if r in staged]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        inc = includes_of.get(path, Includes())
        if inc.computed:
            return tuple(sorted(staged))
        here = posixpath.dirname(path)
        for name, search in (
            *((q, (here, *dirs)) for q in inc.quoted),
            *((a, tuple(dirs)) for a in inc.angled),
        ):
            if name.startswith("/"):
                continue
            for base in search:
                cand = posixpath.normpath(posixpath.join(base, name))
                if _inside(cand) and cand in staged:
                    if cand not in seen:
                        todo.append(cand)
                    break
    return tuple(sorted(seen))


def scan_includes(
    stage: StagedTarget, memo: dict[str, Includes] | None = None
) -> dict[str, Includes]:
    """Parse the include lines of every staged file (reads the stage)."""
    out: dict[str, Includes] = {}
    memo = {} if memo is None else memo
    for rel, digest in stage.hashes.items():
        got = memo.get(digest)
        if got is None:
            try:
                got = parse_includes((stage.dir / rel).read_bytes())
            except OSError as exc:
                raise StageError(
                    str(stage.dir), rel, f"cannot read the staged file: {exc}"
                ) from None
            memo[digest] = got
        out[rel] = got
    return out


#: Flags that embed absolute source paths in the artefact (line info, debug info).
_PATH_EMBEDDING_FLAGS = frozenset(
    {"-lineinfo", "--generate-line-info", "-G", "--device-debug", "-g", "--debug"}
)


def embeds_paths(flags: Sequence[str]) -> bool:
    """Whether ``flags`` make the artefact name the compiled files' absolute paths (pure)."""
    return any(f in _PATH_EMBEDDING_FLAGS or f.startswith(("-g", "-Xcompiler=-g")) for f in flags)


def _embeds_paths(plan: TargetPlan, staged: StagedTarget) -> bool:
    """Whether this target's compiles embed paths: through its flags, the flag variables
    the compiler reads (``NVCC_APPEND_FLAGS`` ...), or an options file's content."""
    words: list[str] = []
    for value in plan.env.values():
        words.extend(value.split())
    for cwd in {m.cwd for m in plan.modules}:
        before, after = effective_flags(plan, os.path.abspath(staged.dir / cwd))
        words.extend((*before, *after))
    return embeds_paths(words)


def module_key_parts(
    plan: TargetPlan,
    module: ModulePlan,
    closure: Sequence[str],
    hashes: Mapping[str, str],
    *,
    flag_inputs: Sequence[Sequence[str]] = (),
    checkout: str = "",
) -> dict[str, Any]:
    """The parts hashed into a module's action key (pure; see the module docstring).

    ``flag_inputs`` are ``[path, hash]`` of files named by flags that lie outside
    the stage; ``checkout`` is the absolute stage path when the flags embed
    paths (the entry is then specific to this checkout), else "".
    """
    parts: dict[str, Any] = {
        "plan_schema": PLAN_SCHEMA,
        "toolchain": plan.toolchain.name,
        "identity": plan.identity,
        "arch": plan.arch,
        "argv": list(module.argv),
        "env": dict(plan.env),
        "module": {"entry": module.entry, "artefact": module.artefact},
        "inputs": sorted([posixpath.relpath(p, module.cwd), hashes[p]] for p in closure),
    }
    if flag_inputs:
        parts["flag_inputs"] = sorted([str(p), str(h)] for p, h in flag_inputs)
    if checkout:
        parts["checkout"] = checkout
    return parts


# ------------------------------------------------------------------------------------ results


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleResult:
    """How one module was obtained in this run."""

    name: str
    stem: str
    source: str
    artefact: str
    key: str
    #: compiled | local | remote | failed
    outcome: str
    xxh3: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stem": self.stem,
            "source": self.source,
            "artefact": self.artefact,
            "key": self.key,
            "outcome": self.outcome,
            "xxh3": self.xxh3,
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetResult:
    """The outcome of :func:`build_target`; ``to_dict()`` is what a doit worker returns."""

    target: str
    modules: tuple[ModuleResult, ...]
    failures: tuple[CompileError, ...] = ()
    #: Per-target counts: compiled, local, remote, failed (+ memo: reused in-process).
    cache_stats: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    seconds: float = 0.0
    #: Root-relative path of the manifest written, or "" when the build failed.
    manifest: str = ""
    warnings: tuple[str, ...] = ()
    #: The task's file dependencies (doit's spelling) -> xxh3-64 of the content this
    #: build used ("" for a file that changed while it ran): the state to save.
    inputs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Installed files (root-relative) -> [mtime_ns, size, xxh3-64]: checked by the next run.
    outputs: Mapping[str, list[Any]] = field(default_factory=lambda: MappingProxyType({}))
    #: Files read outside the tree, the toolkit and the system include directories
    #: (``-I/abs``, ``CPATH``, an absolute include) -> [mtime_ns, size, xxh3-128]: they
    #: make the target stale when they change.
    external: Mapping[str, list[Any]] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def errors(self) -> tuple[CompileError, ...]:
        return self.failures

    def failure_text(self) -> str:
        """Every compiler failure: target, module, command line and output."""
        return "\n".join(str(f) for f in self.failures)

    def to_dict(self) -> dict[str, Any]:
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
        }


# ------------------------------------------------------------------------------------ memo


@dataclass(frozen=True, slots=True)
class _Obtained:
    """An artefact and the inputs its compile read (``[kind, path, hash]``)."""

    data: bytes
    inputs: tuple[tuple[str, str, str], ...]


class _Memo:
    """Per-process: artefacts compiled or fetched by key, and one in-flight owner per key.

    Bounded by bytes (oldest dropped first); the cache is the durable store. A
    memoised artefact is reused only when its recorded inputs still match, like
    a cache entry (two targets may share a key while a file the scan missed
    differs between their stages).
    """

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, str], _Obtained] = OrderedDict()
        self._size = 0
        self._max = max_bytes
        self._claims: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[None]:
        with self._lock:
            lock = self._claims.setdefault(key, threading.Lock())
        with lock:
            yield

    def get(self, key: str, artefact: str) -> _Obtained | None:
        with self._lock:
            got = self._data.get((key, artefact))
            if got is not None:
                self._data.move_to_end((key, artefact))
            return got

    def put(self, key: str, artefact: str, obtained: _Obtained) -> None:
        size = len(obtained.data)
        with self._lock:
            if size > self._max:
                return
            old = self._data.pop((key, artefact), None)
            if old is not None:
                self._size -= len(old.data)
            self._data[(key, artefact)] = obtained
            self._size += size
            while self._size > self._max:
                _, dropped = self._data.popitem(last=False)
                self._size -= len(dropped.data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._claims.clear()
            self._size = 0


_MEMO = _Memo()
#: Content hashes of files outside the stage (toolkit and system headers), per process.
_HASHER = FileHasher()
_TMP_SWEPT: set[str] = set()


def reset_build_memo() -> None:
    """Forget the artefacts and file hashes this process built, fetched or read (tests)."""
    _MEMO.clear()
    _HASHER.clear()
    _TMP_SWEPT.clear()


class ArtefactCache(Protocol):
    """What the build needs of :class:`metrale_orch.cache.Cache`."""

    def get(
        self, key: str, *, accept: Callable[[Mapping[str, Any]], bool] | None = None
    ) -> cache_mod.Hit | None: ...

    def put(
        self,
        key: str,
        outputs: Mapping[str, bytes],
        meta: Mapping[str, Any],
        *,
        replace: bool = False,
    ) -> None: ...

    def key_lock(
        self, key: str, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


# ------------------------------------------------------------------------------------ build


@dataclass(frozen=True, slots=True, kw_only=True)
class _Context:
    """What every module of one target's build shares."""

    plan: TargetPlan
    staged: StagedTarget
    program: Path
    roots: tuple[str, ...]
    system_dirs: tuple[str, ...]
    cache: ArtefactCache | None
    environ: Mapping[str, str]
    tmp_root: Path
    log: logging.Logger
    #: Module working directory -> :func:`effective_flags` there.
    words: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    #: Staged source of a module -> the ``-I`` that makes ``.tree/<its layer directory>``
    #: its layer directory (only when the target reaches files beyond its layout).
    layer_includes: Mapping[str, str] = field(default_factory=dict)


def build_target(
    root: Path,
    target: Target | Layout,
    *,
    config: Config,
    cache: ArtefactCache | None = None,
    environ: Mapping[str, str],
    log: logging.Logger | None = None,
    toolchains: Mapping[str, Toolchain] | None = None,
) -> TargetResult:
    """Stage, compile (or restore) and install one target; write its manifest last.

    Compiler failures do not raise: they are logged and returned in
    ``TargetResult.failures`` (no manifest is written then) while the other
    modules go on. Raises ``LayoutError`` for a tree error,
    :class:`ToolchainMissing` when the compiler is not installed,
    :class:`ToolchainError` / :class:`BuildConfigError` / ``DefaultsError`` for
    bad settings, :class:`~metrale_orch.build.staging.ContainmentError` for an input
    outside ``kernels/`` and :class:`StageError` when the build dir cannot be
    written.
    """
    start = time.perf_counter()
    root = Path(root)
    log = log or _log
    layout = target if isinstance(target, Layout) else discover(root, target)
    name = str(layout.target)
    if toolchains is None:
        toolchains = load_toolchains(root)
    build_dir = Path(config.build_dir)
    tc = select_toolchain(layout.hardware, toolchains)
    found = find_toolchain(
        tc, environ, state_dir=build_dir / ".state", arch=layout.hardware.arch or ""
    )
    memo = PlanMemo(root)
    compat = scan_hip_compat(root, config.hip_compat_dir) if tc.dialect == "hip" else None
    plan = plan_target(
        root,
        layout,
        toolchains,
        identity=found.identity,
        environ=environ,
        memo=memo,
        hip_compat=compat,
    )
    check_contained(root, layout)
    beyond = _beyond_layout(root, layout, compat)
    exempt = shadow_exemptions((memo.rel(p), doc) for p, doc in _config_docs(layout))
    if exempt.problems:
        raise BuildConfigError(*exempt.problems[0])
    # What the task's other file dependencies (manifests, toolchain file) held when
    # this build read them; compared again at the end (saved state = what was built).
    sources = set(layout.inputs())
    others = {p: _digest_or_empty(p) for p in plan.file_deps if p not in sources}
    tmp_root = build_dir / ".tmp"
    _sweep_tmp(tmp_root, log)
    layer_includes = _layer_includes(root, layout) if beyond.files else {}
    staged = stage(
        layout,
        stage_dir(build_dir, layout.target),
        beyond.files,
        dirs=[f"{TREE_DIR}/{d}" for d in _layer_dirs(root, layout)] if beyond.files else (),
    )
    # SPEC 3.3.2: what leaf forks drop from their common namesakes, read from the stage
    # with each root's own -I directories (a leaf module's are its compile's).
    argv_of = {m.source: m.argv for m in plan.modules}
    drops = scan_drops(
        layout,
        staged,
        {m.stem: m.name for m in plan.modules},
        dirs=lambda cwd, entry: include_dirs(cwd, argv_of.get(entry.source, plan.flags)),
    )
    includes = scan_includes(staged)
    if layer_includes:
        # Only the modules that reach a mirrored file get the extra -I (and a key that says
        # so): the others keep sharing their keys with the same module of other targets.
        layer_includes = _reaching_tree(plan, staged, includes, layer_includes)
    ctx = _Context(
        plan=plan,
        staged=staged,
        program=found.program,
        roots=found.roots,
        system_dirs=found.system_dirs,
        cache=cache,
        environ=environ,
        tmp_root=tmp_root,
        log=log,
        layer_includes=layer_includes,
        words={
            cwd: effective_flags(
                plan,
                os.path.abspath(staged.dir / cwd),
                env_switches(plan.toolchain, plan.env).extra,
            )
            for cwd in {m.cwd for m in plan.modules}
        },
    )
    checkout = os.path.abspath(staged.dir) if _embeds_paths(plan, staged) else ""
    counts = {"compiled": 0, "local": 0, "remote": 0, "memo": 0, "failed": 0}
    results: list[ModuleResult] = []
    failures: list[CompileError] = []
    outputs: dict[str, bytes] = {}
    read: list[tuple[str, str, str]] = []
    for module in plan.modules:
        t0 = time.perf_counter()
        key = _module_key(config.cache_namespace, ctx, module, includes, checkout)
        try:
            data, outcome, inputs = _obtain(ctx, module, key)
        except CompileError as exc:
            failures.append(exc)
            counts["failed"] += 1
            log.error("%s", exc)
            results.append(
                ModuleResult(
                    name=module.name,
                    stem=module.stem,
                    source=module.source_rel,
                    artefact=module.artefact,
                    key=key,
                    outcome="failed",
                    seconds=time.perf_counter() - t0,
                )
            )
            continue
        counts[outcome] += 1
        outputs[module.artefact] = data
        read.extend(inputs)
        results.append(
            ModuleResult(
                name=module.name,
                stem=module.stem,
                source=module.source_rel,
                artefact=module.artefact,
                key=key,
                outcome="local" if outcome == "memo" else outcome,
                xxh3=xxhash.xxh3_128_hexdigest(data),
                seconds=time.perf_counter() - t0,
            )
        )
    manifest_rel, installed = _install(
        root,
        plan,
        layout,
        results,
        outputs,
        failed=bool(failures),
        build_dir=build_dir,
        dropped=drops,
    )
    log.info(
        "%s: %d module(s): %s%s",
        name,
        len(results),
        ", ".join(f"{k} {v}" for k, v in counts.items() if v),
        " (FAILED)" if failures else "",
    )
    built: dict[str, str] = {memo.rel.dep(p): d for p, d in staged.source_digests.items()}
    for path, before in others.items():
        # Changed while this build ran: "" never matches, so the next run rebuilds.
        built[memo.rel.dep(path)] = before if _digest_or_empty(path) == before else ""
    build_keys = sorted({t.flags_key for t in toolchains.values()})
    return TargetResult(
        target=name,
        modules=tuple(results),
        failures=tuple(failures),
        cache_stats=MappingProxyType(counts),
        seconds=time.perf_counter() - start,
        manifest=manifest_rel,
        warnings=(
            *read_manifest_warnings(root, layout, build_keys=build_keys),
            *drop_warnings(name, drops, exempt, root),
        ),
        inputs=MappingProxyType(dict(sorted(built.items()))),
        outputs=MappingProxyType({memo.rel.dep(p): st for p, st in sorted(installed.items())}),
        external=MappingProxyType(
            {**external_stamps(read, _HASHER), **_beyond_stamps(root, beyond, staged)}
        ),
    )


def _digest_or_empty(path: Path) -> str:
    try:
        return file_digest(os.fspath(path))
    except OSError:
        return ""


def _beyond_layout(root: Path, layout: Layout, compat: HipCompat | None) -> Beyond:
    """SPEC 3.3.1: the tree files this target's compiles reach beyond its layout (to be
    staged under ``.tree/``). Raises the first escaping include (naming the file and line)
    and :class:`~metrale_orch.build.staging.ContainmentError` for a file reached through a
    symlink."""
    allow = () if compat is None or compat.dir is None else (str(compat.dir),)
    beyond = beyond_layout(root, layout, allow=allow)
    if beyond.errors:
        raise beyond.errors[0]
    bad = uncontained(Path(root) / "kernels", beyond.files.values())
    if bad:
        path, problem = bad[0]
        shown = os.path.relpath(path, root).replace(os.sep, "/")
        raise ContainmentError(str(layout.target), shown, problem)
    return beyond


def _layer_includes(root: Path, layout: Layout) -> dict[str, str]:
    """Each module's staged source -> the ``-I`` of its layer directory under ``.tree/``."""
    out: dict[str, str] = {}
    for _stem, entry in layout.modules():
        cwd = role_dir(layout, layout.role_of(entry))
        out[f"{cwd}/{entry.name}"] = layer_include(cwd, layer_dir(root, layout, entry.layer))
    return out


def _layer_dirs(root: Path, layout: Layout) -> set[str]:
    return {layer_dir(root, layout, entry.layer) for _stem, entry in layout.modules()}


def _reaching_tree(
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
            *include_dirs(module.cwd, plan.flags, env_switches(plan.toolchain, plan.env).extra),
            posixpath.normpath(posixpath.join(module.cwd, inc)),
        )
        closure = resolve_closure(
            [module.staged], staged=staged.hashes, includes_of=includes, dirs=dirs
        )
        if any(p.startswith(prefix) for p in closure):
            out[module.staged] = inc
    return out


def _beyond_stamps(root: Path, beyond: Beyond, staged: StagedTarget) -> dict[str, list[Any]]:
    """``EXTERNAL_KEY`` entries of the files beyond the layout (root-relative): checked by
    every run, so an edit of a cross-model header makes the target stale even though the
    task's file dependencies (from generation) do not list it."""
    out: dict[str, list[Any]] = {}
    for rel, path in beyond.files.items():
        built = staged.hashes.get(f"{TREE_DIR}/{rel}", "")
        shown = os.path.relpath(path, root).replace(os.sep, "/")
        stamp = _HASHER.stamp(str(path)) if _HASHER.digest(str(path)) == built else None
        out[shown] = [-1, -1, built] if stamp is None else [stamp[0], stamp[1], built]
    return out


def _module_key(
    namespace: str,
    ctx: _Context,
    module: ModulePlan,
    includes: Mapping[str, Includes],
    checkout: str,
) -> str:
    """The action key of ``module``: its scanned closure over the stage (plus files named
    by flags) and everything in :func:`module_key_parts`."""
    plan, staged = ctx.plan, ctx.staged
    before, after = ctx.words.get(module.cwd, (plan.flags, ()))
    dirs = include_dirs(module.cwd, before, after)
    layer_inc = ctx.layer_includes.get(module.staged, "")
    if layer_inc:
        dirs = (*dirs, posixpath.normpath(posixpath.join(module.cwd, layer_inc)))
    roots = [module.staged]
    flag_inputs: list[tuple[str, str]] = []
    for path in read_files_of((*before, *after)):
        full = path if path.startswith("/") else os.path.join(ctx.staged.dir, module.cwd, path)
        if os.path.isdir(full):  # -ccbin may name the compiler's directory
            full = os.path.join(full, "gcc")
        rel = posixpath.normpath(posixpath.join(module.cwd, path))
        if not path.startswith("/") and rel in staged.hashes:
            roots.append(rel)
        else:
            flag_inputs.append((path, _HASHER.digest(os.path.abspath(full))))
    closure = resolve_closure(roots, staged=staged.hashes, includes_of=includes, dirs=dirs)
    parts = module_key_parts(
        plan, module, closure, staged.hashes, flag_inputs=flag_inputs, checkout=checkout
    )
    if layer_inc:  # run_compile adds it to the argv
        parts["layer_include"] = layer_inc
    return cache_mod.cache_key(namespace, parts)


def _obtain(
    ctx: _Context, module: ModulePlan, key: str
) -> tuple[bytes, str, tuple[tuple[str, str, str], ...]]:
    """The artefact bytes of ``module``, how they were obtained (memo|local|remote|compiled)
    and the inputs its compile read.

    A memoised or cached artefact is taken only when every file its compile
    read still has the content it had (:func:`metrale_orch.build.deps.inputs_match`);
    otherwise the module is compiled and the new entry replaces the local one.
    """
    plan, log = ctx.plan, ctx.log

    def still_valid(inputs: object) -> bool:
        return inputs_match(
            inputs,
            module_cwd=module.cwd,
            staged=ctx.staged.hashes,
            roots=ctx.roots,
            hasher=_HASHER,
        )

    with _MEMO.claim(key):
        got = _MEMO.get(key, module.artefact)
        if got is not None and still_valid([list(i) for i in got.inputs]):
            return got.data, "memo", got.inputs
        cache = ctx.cache
        lock = cache.key_lock(key) if cache is not None else contextlib.nullcontext()
        with lock:
            rejected = False

            def accept(meta: Mapping[str, Any]) -> bool:
                nonlocal rejected
                ok = still_valid(meta.get("inputs"))
                rejected = rejected or not ok
                return ok

            hit = cache.get(key, accept=accept) if cache is not None else None
            if hit is not None and module.artefact in hit.outputs:
                data = bytes(hit.outputs[module.artefact])
                inputs = _as_inputs(hit.meta.get("inputs"))
                _MEMO.put(key, module.artefact, _Obtained(data, inputs))
                log.info("%s: %s from the %s cache (%s)", plan.target, module.name, hit.tier, key)
                return data, hit.tier, inputs
            if rejected:
                log.info(
                    "%s: %s: the cached entry %s was compiled from other inputs; recompiling",
                    plan.target,
                    module.name,
                    key,
                )
            data, seconds, inputs = run_compile(ctx, module)
            if cache is not None:
                cache.put(
                    key,
                    {module.artefact: data},
                    {
                        "command": list(module.argv),
                        "toolchain": {"name": plan.toolchain.name, "identity": plan.identity},
                        "producer": f"metrale-orch {plan.target} {module.name}",
                        "compile_seconds": round(seconds, 6),
                        "inputs": [list(i) for i in inputs],
                    },
                    replace=rejected,
                )
            _MEMO.put(key, module.artefact, _Obtained(data, inputs))
            return data, "compiled", inputs


def _as_inputs(value: object) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        (str(i[0]), str(i[1]), str(i[2])) for i in value if isinstance(i, list) and len(i) == 3
    )


def _sweep_tmp(tmp_root: Path, log: logging.Logger) -> None:
    """Remove leftovers of killed compiles under ``tmp_root`` (once per process).

    A compile's directory is ``<module>.<pid>.<random>``; it is a leftover when
    that process no longer runs, or when it is older than a day.
    """
    key = os.fspath(tmp_root)
    if key in _TMP_SWEPT:
        return
    _TMP_SWEPT.add(key)
    try:
        entries = list(os.scandir(tmp_root))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        parts = entry.name.rsplit(".", 2)
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if pid == os.getpid() or (pid and _alive(pid) and age < 86400):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        log.info("removed the leftover %s of an interrupted compile", entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def run_compile(
    ctx: _Context, module: ModulePlan
) -> tuple[bytes, float, tuple[tuple[str, str, str], ...]]:
    """Compile one module in its staged role directory into a temporary directory.

    As the reference drives each compiler (SPEC 3.3): a ``hip``-dialect toolchain
    compiles the module's mirror (:mod:`metrale_orch.build.hip_mirror`, written under
    the stage) with the project's compat directory as ``-I``; a two-step
    toolchain (Metal) turns the first step's intermediate into the artefact;
    the toolchain's environment switches are those of the plan.

    Returns (artefact bytes, seconds, the inputs the compile read as
    ``(kind, path, hash)``: from the compiler's dependency list when the
    toolchain writes one (mirrored files named as the staged files they were
    made from), else the scanned closure, plus the files named by flags).
    Raises :class:`CompileError`, or :class:`StageError` when the temporary
    directory or the mirror cannot be written.
    """
    plan, staged, log = ctx.plan, ctx.staged, ctx.log
    target = str(plan.target)
    tc = plan.toolchain
    try:
        ctx.tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{module.name}.{os.getpid()}.", dir=ctx.tmp_root))
    except OSError as exc:
        raise StageError(
            target, str(ctx.tmp_root), f"cannot create a temporary directory: {exc}"
        ) from None
    cwd = staged.dir / module.cwd
    try:
        out = tmp / module.artefact
        depfile = tmp / "deps.d"
        switches = env_switches(tc, plan.env)
        compat = plan.hip_compat
        source = module.entry
        if compat is not None:
            try:
                write_mirror(staged.dir, mirror_files(staged.hashes, module.cwd), staged.hashes)
            except OSError as exc:
                raise StageError(
                    target, str(staged.dir / MIRROR_DIR), f"cannot write the HIP mirror: {exc}"
                ) from None
            source = mirrored_source(module.cwd, module.entry)
        intermediate = tmp / f"{module.name}.{tc.intermediate_extension}" if tc.link_argv else None
        argv = compile_argv(
            tc,
            program=str(ctx.program),
            arch=plan.arch,
            flags=plan.flags,
            include=".",
            source=source,
            output=str(out),
            intermediate="" if intermediate is None else str(intermediate),
            switches=switches,
            compat_include="" if compat is None or compat.dir is None else str(compat.dir),
        )
        layer_inc = ctx.layer_includes.get(module.staged, "")
        if layer_inc:  # SPEC 3.3.1: the module's layer directory, mirrored under .tree/
            argv = (*argv, f"-I{layer_inc}")
        if tc.depfile_args:
            # Relative to the cwd: no comma of the checkout's path can split -Xcompiler=.
            spelled = os.path.relpath(depfile, cwd)
            argv = (*argv, *(a.format_map({"depfile": spelled}) for a in tc.depfile_args))
        steps = [argv]
        if intermediate is not None:
            steps.append(
                link_argv(
                    tc,
                    program=str(ctx.program),
                    arch=plan.arch,
                    intermediate=str(intermediate),
                    output=str(out),
                )
            )
        seconds = 0.0
        texts: list[str] = []
        for step in steps:
            log.info(
                "%s: compile %s: (cd %s &&) %s", target, module.name, module.cwd, format_argv(step)
            )
            try:
                done = run_process(step, cwd=cwd, env=ctx.environ, timeout=COMPILE_TIMEOUT)
            except ProcessError as exc:
                raise CompileError(
                    target=target,
                    module=module.name,
                    argv=step,
                    returncode=exc.returncode,
                    output=exc.output,
                    reason=exc.reason,
                    source=module.source_rel,
                ) from None
            seconds += done.seconds
            texts.append((done.stdout + done.stderr).strip())
            if intermediate is not None and step is argv and not intermediate.is_file():
                raise CompileError(
                    target=target,
                    module=module.name,
                    argv=step,
                    returncode=done.returncode,
                    output=texts[-1],
                    reason=f"exited 0 but wrote no {intermediate.name}",
                    source=module.source_rel,
                )
        text = "\n".join(t for t in texts if t)
        if text:
            log.info("%s: %s: compiler output:\n%s", target, module.name, text)
        try:
            data = out.read_bytes()
        except OSError:
            data = b""
        if not data:
            raise CompileError(
                target=target,
                module=module.name,
                argv=steps[-1],
                returncode=done.returncode,
                output=text,
                reason=f"exited 0 but wrote no {module.artefact}",
                source=module.source_rel,
            )
        if tc.depfile_args:
            try:
                read = parse_depfile(depfile.read_text(encoding="utf-8", errors="surrogateescape"))
            except OSError:
                read = []
            if not read:
                raise CompileError(
                    target=target,
                    module=module.name,
                    argv=argv,
                    returncode=done.returncode,
                    output=text,
                    reason="exited 0 but wrote no dependency list (toolchain depfile_args)",
                    source=module.source_rel,
                )
            if compat is not None:
                read = unmirror(
                    read, stage_dir=os.path.abspath(staged.dir), cwd=os.path.abspath(cwd)
                )
        else:
            includes = scan_includes(staged)
            words = ctx.words.get(module.cwd, (plan.flags, ()))
            closure = resolve_closure(
                [module.staged],
                staged=staged.hashes,
                includes_of=includes,
                dirs=include_dirs(module.cwd, *words),
            )
            read = [posixpath.relpath(p, module.cwd) for p in closure]
        before, after = ctx.words.get(module.cwd, (plan.flags, switches.extra))
        files = [
            os.path.join(p, "gcc") if os.path.isdir(os.path.join(cwd, p)) else p
            for p in read_files_of((*before, *after))
        ]
        read = [*read, *files]
        recorded = record_inputs(
            read,
            stage_dir=os.path.abspath(staged.dir),
            cwd=os.path.abspath(cwd),
            module_cwd=module.cwd,
            staged=staged.hashes,
            roots=ctx.roots,
            hasher=_HASHER,
            system_dirs=ctx.system_dirs,
        )
        inputs = tuple((k, p, h) for k, p, h in recorded)
        return data, seconds, inputs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------ install


def manifest_dict(
    root: Path,
    plan: TargetPlan,
    layout: Layout,
    results: Sequence[ModuleResult],
    *,
    dropped: Sequence[Drop],
) -> dict[str, Any]:
    """The ``manifest.json`` document of SPEC 4.1 (pure); ``dropped``: the target's shadow
    drops (:func:`metrale_orch.build.dropped.shadow_drops`), listed whether exempted or not."""
    return {
        "schema": MANIFEST_SCHEMA,
        "target": str(plan.target),
        "arch": plan.arch,
        "toolchain": {"name": plan.toolchain.name, "identity": plan.identity},
        "flags": list(plan.flags),
        "modules": [
            {
                "name": r.name,
                "stem": r.stem,
                "source": r.source,
                "artefact": r.artefact,
                "xxh3": r.xxh3,
                "key": r.key,
                "outcome": r.outcome,
            }
            for r in results
        ],
        "shadows": [_shadow_dict(s, root) for s in layout.shadows],
        "shadowed_dropped": sorted([d.module, d.kernel] for d in dropped),
        "defaults": render_defaults_json(plan.defaults),
    }


def _install(
    root: Path,
    plan: TargetPlan,
    layout: Layout,
    results: Sequence[ModuleResult],
    outputs: Mapping[str, bytes],
    *,
    failed: bool,
    build_dir: Path,
    dropped: Sequence[Drop],
) -> tuple[str, dict[Path, list[Any]]]:
    """Install artefacts, defaults and (unless failed) the manifest; remove stale files.

    Returns the root-relative manifest path ("" when failed) and, per installed
    file, ``[mtime_ns, size, xxh3-64]`` of what was installed.

    Order keeps every manifest on disk truthful: the old manifest goes first
    when anything changes, the new one is written last.
    """
    target = str(plan.target)
    dest = out_dir(build_dir, plan.target)
    manifest_path = dest / MANIFEST_NAME
    new_manifest = b""
    if not failed:
        doc = manifest_dict(root, plan, layout, results, dropped=dropped)
        new_manifest = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        old = manifest_path.read_bytes() if manifest_path.is_file() else None
        if old is not None and old != new_manifest:
            manifest_path.unlink()
        defaults_json = json.dumps(render_defaults_json(plan.defaults), indent=2, sort_keys=True)
        files = {
            **{dest / artefact: data for artefact, data in sorted(outputs.items())},
            dest / DEFAULTS_JSON: (defaults_json + "\n").encode(),
            dest / DEFAULTS_HEADER: render_defaults_header(plan.defaults).encode(),
        }
        if not failed:
            files[manifest_path] = new_manifest  # last: it vouches for the others
        for path, data in files.items():
            write_if_changed(path, data)
        keep = {*outputs, DEFAULTS_JSON, DEFAULTS_HEADER}
        if not failed:
            keep.add(MANIFEST_NAME)
        for child in dest.iterdir():
            if child.name not in keep and (child.is_file() or child.is_symlink()):
                child.unlink()
    except OSError as exc:
        raise StageError(target, str(dest), f"cannot install the artefacts: {exc}") from None
    states: dict[Path, list[Any]] = {}
    for path, data in files.items():
        try:
            st = path.stat()
        except OSError as exc:
            raise StageError(target, str(path), f"cannot install the artefacts: {exc}") from None
        states[path] = [st.st_mtime_ns, st.st_size, xxhash.xxh3_64_hexdigest(data)]
    return ("" if failed else _rel(manifest_path, root)), states
