"""The build plan of one target (pure): what is compiled, with which flags, into what.

:func:`plan_target` turns a resolved :class:`~metrale_orch.tree.Layout` into a
:class:`TargetPlan`: the arch, the merged flags (own HARDWARE.toml ``[build]``
then each KERNEL.toml in ``configs()`` order, exact duplicates dropped keeping
the first), the modules with their ``[modules]`` renames, each module's
machine-independent compile argv, the baked defaults, the file dependencies
and a JSON signature of everything file dependencies cannot see. It reads only
the already-parsed manifests (``*.doc``) and, once per :class:`PlanMemo`,
``kernels/LEVERS.toml``. Plans made with a memo equal those made without.

The plan's values and the memo live in :mod:`metrale_orch.steps.plan_values`, the
parts of its signature in :mod:`metrale_orch.steps.signature`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from metrale_orch.cache_schema import CACHE_SCHEMA
from metrale_orch.canonical import canonical_list
from metrale_orch.defaults import (
    DeclaredLevers,
    TargetDefaults,
)
from metrale_orch.defaults.levers import JsonValue
from metrale_orch.steps.errors import BuildConfigError
from metrale_orch.steps.hip_mirror import MIRROR_DIR, HipCompat, hip_identity, mirrored_source
from metrale_orch.steps.plan_values import ModuleKey, ModulePlan, PlanMemo, RootRel, TargetPlan
from metrale_orch.steps.signature import PlanSignature, layout_signature, toolchain_signature
from metrale_orch.steps.staging import role_dir
from metrale_orch.toolchain.argv import (
    Switches,
    compile_argv,
    env_switches,
    link_argv,
)
from metrale_orch.toolchain.definitions import Toolchain, select_toolchain
from metrale_orch.tree import Entry, Hardware, Layout, Role

__all__ = [
    "PLAN_SCHEMA",
    "check_plan",
    "config_docs",
    "merge_flags",
    "module_names",
    "plan_target",
]

#: Version of the plan/key layout defined here; part of every key and signature.
PLAN_SCHEMA = 2
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


def config_docs(layout: Layout) -> list[tuple[Path, Mapping[str, object]]]:
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
    return _merge_flags(layout, config_docs(layout), flags_key, RootRel(Path(root)))


def _merge_flags(
    layout: Layout,
    docs: Sequence[tuple[Path, Mapping[str, object]]],
    flags_key: str,
    rel: RootRel,
) -> tuple[str, ...]:
    seen: set[str] = set()
    flags: list[str] = []
    for path, doc in ((layout.hardware.path, layout.hardware.doc), *docs):
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
    return _module_names(config_docs(layout), layout.modules(), RootRel(Path(root)))


def _module_names(
    docs: Sequence[tuple[Path, Mapping[str, object]]],
    modules: Sequence[tuple[str, Entry]],
    rel: RootRel,
) -> Mapping[str, str]:
    renames: dict[str, tuple[str, str]] = {}
    for path, doc in docs:
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
    (:func:`~metrale_orch.toolchain.probe.probe_toolchain`); ``environ`` supplies the
    toolchain's environment allow-list values; ``memo`` shares work between
    the plans of one resolution pass (see :class:`PlanMemo`); ``hip_compat`` is
    the project's HIP compat directory
    (:func:`~metrale_orch.steps.hip_mirror.scan_hip_compat`), read by the targets of a
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
    got = _settings(layout, toolchains, memo, environ or {}, hip_compat)
    toolchain, arch, flags, env, compat = got.toolchain, got.arch, got.flags, got.env, got.compat
    if compat is not None:
        identity = hip_identity(identity, compat)
    steps = _ArgvSteps(
        memo=memo,
        toolchain=toolchain,
        arch=arch,
        flags=flags,
        switches=got.switches,
        compat=compat,
    )
    token = memo.plain_token(toolchain, arch, flags) if steps.plain else None
    # The compile's cwd by role (leaf, common): the same for every module of the target.
    cwds = (role_dir(layout, Role.LEAF), role_dir(layout, Role.COMMON))
    planned = [
        _plan_module(layout, stem, entry, got.names[stem], steps, rel, token, cwds)
        for stem, entry in got.modules
    ]
    modules = [m for m, _text in planned]
    keyed = _keyed_file_deps(layout, toolchain, compat, got.tree_levers, rel.dep)
    signature = {
        "schema": PLAN_SCHEMA,
        "cache_schema": CACHE_SCHEMA,
        "target": str(layout.target),
        "arch": arch,
        "toolchain": toolchain_signature(toolchain, identity),
        "env": dict(env),
        "flags": list(flags),
        "layout": layout_signature(layout, rel),
        "defaults": got.defaults_doc,
        "levers": got.tree_levers.to_dict(),
    }
    return TargetPlan(
        target=layout.target,
        hardware=layout.hardware.name,
        arch=arch,
        toolchain=toolchain,
        identity=identity,
        flags=flags,
        modules=tuple(modules),
        defaults=got.defaults,
        env=env,
        file_deps=tuple(p for _, p in keyed),
        signature=PlanSignature(signature, tuple(modules)),
        file_dep_rels=tuple(dict.fromkeys(r for r, _ in keyed)),
        hip_compat=compat,
        signature_json=MappingProxyType(
            {"modules": canonical_list([text for _m, text in planned])}
        ),
    )


def check_plan(
    root: Path,
    layout: Layout,
    toolchains: Mapping[str, Toolchain],
    *,
    environ: Mapping[str, str] | None = None,
    memo: PlanMemo | None = None,
    hip_compat: HipCompat | None = None,
) -> None:
    """Raise what :func:`plan_target` raises for ``layout`` (same arguments, but no
    identity), without planning its modules: ``check``'s view of a plan.

    Every setting a plan is made of is checked before its first module (by
    ``_settings``, which both run); a module's plan follows from them and from the
    toolchain's templates, checked when the toolchain was loaded.
    """
    root = Path(root)
    if memo is None or memo.root != root:
        memo = PlanMemo(root)
    _settings(layout, toolchains, memo, environ or {}, hip_compat)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    """What a target's plan is made of, each setting checked."""

    toolchain: Toolchain
    arch: str
    flags: tuple[str, ...]
    modules: tuple[tuple[str, Entry], ...]
    #: stem -> module name (``[modules]`` renames)
    names: Mapping[str, str]
    defaults: TargetDefaults
    defaults_doc: dict[str, JsonValue]
    env: Mapping[str, str]
    switches: Switches
    compat: HipCompat | None
    tree_levers: DeclaredLevers


def _settings(
    layout: Layout,
    toolchains: Mapping[str, Toolchain],
    memo: PlanMemo,
    environ: Mapping[str, str],
    hip_compat: HipCompat | None,
) -> _Settings:
    """The settings of ``layout``'s plan, checked in the build's order; raises
    :class:`ToolchainError`, :class:`BuildConfigError` or ``DefaultsError``."""
    rel = memo.rel
    hw = layout.hardware
    toolchain = select_toolchain(hw, toolchains)
    arch = _required_arch(hw, rel)
    docs = config_docs(layout)
    flags = _merge_flags(layout, docs, toolchain.flags_key, rel)
    layout_modules = layout.modules()
    names = _module_names(docs, layout_modules, rel)
    defaults, defaults_doc = memo.defaults(hw)
    keyed_env = memo.env(toolchain, environ)
    switches = env_switches(toolchain, environ)
    return _Settings(
        toolchain=toolchain,
        arch=arch,
        flags=flags,
        modules=layout_modules,
        names=names,
        defaults=defaults,
        defaults_doc=defaults_doc,
        env=_planned_env(keyed_env, switches),
        switches=switches,
        compat=_hip_compat_of(toolchain, layout, hip_compat),
        tree_levers=memo.tree_levers(),
    )


def _required_arch(hw: Hardware, rel: RootRel) -> str:
    """``[hardware] arch`` of the own HARDWARE.toml; a build cannot go without one."""
    if not hw.arch:
        raise BuildConfigError(
            rel(hw.path), "[hardware] arch", 'is required to build (e.g. arch = "sm_90a")'
        )
    return hw.arch


def _planned_env(env: Mapping[str, str], switches: Switches) -> Mapping[str, str]:
    """The toolchain's allow-listed environment with the switches that are set, sorted."""
    if not switches.env:
        return env
    return MappingProxyType(dict(sorted({**env, **switches.env}.items())))


def _hip_compat_of(
    toolchain: Toolchain, layout: Layout, hip_compat: HipCompat | None
) -> HipCompat | None:
    """The HIP compat directory a ``hip``-dialect toolchain's target reads (None for others).

    Raises :class:`BuildConfigError` for an unusable compat directory, or a model whose
    directory name is the HIP mirror's.
    """
    if toolchain.dialect != "hip":
        return None
    compat = hip_compat or HipCompat()
    if compat.problem:
        raise BuildConfigError("configuration", "hip_compat_dir", compat.problem)
    if layout.source_model == MIRROR_DIR:
        raise BuildConfigError(
            f"kernels/{layout.hardware.name}/{layout.source_model}",
            "(directory)",
            f"a model named {MIRROR_DIR!r} would share the HIP mirror's stage directory; "
            "rename the model directory",
        )
    return compat


@dataclass(frozen=True, slots=True, kw_only=True)
class _ArgvSteps:
    """What every module's compile argv of one target shares."""

    memo: PlanMemo
    toolchain: Toolchain
    arch: str
    flags: tuple[str, ...]
    switches: Switches
    compat: HipCompat | None

    @property
    def plain(self) -> bool:
        """One compile step of the entry as named (memoisable): no switches, link or HIP."""
        return not (self.switches.env or self.toolchain.link_argv or self.compat is not None)


def _plan_module(
    layout: Layout,
    stem: str,
    entry: Entry,
    name: str,
    steps: _ArgvSteps,
    rel: RootRel,
    token: int | None,
    cwds: tuple[str, str],
) -> tuple[ModulePlan, str]:
    """The plan of one module (where it is staged and how it is compiled) and the
    canonical JSON of its signature entry (:meth:`PlanMemo.module_json`).

    ``token``: the memo's plain token of the target's (toolchain, arch, flags) when its
    argv is the plain compile step; ``cwds``: the target's leaf and common directories."""
    role = layout.role_of(entry)
    common = role is Role.COMMON
    cwd = cwds[common]
    memo = steps.memo
    if token is not None:
        short = (token, stem, name, common, entry.name, entry.source, cwd)
        got = memo._plain.get(short)
        if got is not None:
            return got
    artefact = f"{name}.{steps.toolchain.extension}"
    argv = _module_argv(steps, cwd, entry.name, name, artefact)
    # Every field of the plan, but source_rel and staged, which follow from them.
    key = (stem, name, role.value, entry.name, entry.source, cwd, artefact, argv)
    plan = memo.module(key, lambda: _new_module_plan(key, rel))
    made = (plan, memo.module_json(plan))
    if token is not None:
        memo._plain[short] = made
    return made


def _new_module_plan(key: ModuleKey, rel: RootRel) -> ModulePlan:
    stem, name, role, entry, source, cwd, artefact, argv = key
    return ModulePlan(
        stem=stem,
        name=name,
        role=role,
        entry=entry,
        source=source,
        source_rel=rel(source),
        staged=f"{cwd}/{entry}",
        cwd=cwd,
        artefact=artefact,
        argv=argv,
    )


def _module_argv(
    steps: _ArgvSteps, cwd: str, entry_name: str, name: str, artefact: str
) -> tuple[str, ...]:
    """The module's compile argv with the program's name and the artefact's."""
    toolchain = steps.toolchain
    if steps.plain:
        return steps.memo.argv(toolchain, steps.arch, steps.flags, entry_name, artefact)
    # As run_compile runs it: the mirrored source (HIP), the switches, and a second
    # step after "&&".
    compat = steps.compat
    inter = f"{name}.{toolchain.intermediate_extension}" if toolchain.link_argv else ""
    argv = compile_argv(
        toolchain,
        arch=steps.arch,
        flags=steps.flags,
        include=".",
        source=entry_name if compat is None else mirrored_source(cwd, entry_name),
        output=artefact,
        intermediate=inter,
        switches=steps.switches,
        compat_include=compat.spelled if compat is not None else "",
    )
    if inter:
        link = link_argv(toolchain, arch=steps.arch, intermediate=inter, output=artefact)
        argv = (*argv, "&&", *link)
    return argv


def _keyed_file_deps(
    layout: Layout,
    toolchain: Toolchain,
    compat: HipCompat | None,
    tree_levers: DeclaredLevers,
    dep_of: Callable[[Path], str],
) -> list[tuple[str, Path]]:
    """(doit spelling, path) of every file the build depends on, sorted by spelling."""
    deps: set[Path] = set(layout.input_set())
    deps.update(layout.hardware_manifests)
    deps.update(layout.model_manifests)
    if toolchain.file is not None:
        deps.add(toolchain.file)
    if compat is not None:
        deps.update(compat.paths)
    if tree_levers.file is not None:
        deps.add(tree_levers.file)
    return sorted([(dep_of(p), p) for p in deps])
