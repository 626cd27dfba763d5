"""Build one target (SPEC 3.2-3.4, 4.1): stage it, key each module, obtain, install.

:func:`build_target` stages the target, keys each module
(:mod:`~metrale_orch.steps.keys`), takes it from the per-process memo or the
cache, otherwise compiles it (:func:`~metrale_orch.steps.compile.run_compile`, under
the cache's key lock) and publishes it, then installs the artefacts
atomically, bakes ``target_defaults.json``/``.h`` and writes ``manifest.json``
last (:mod:`~metrale_orch.steps.install`). Once staged, before any compile, it writes
the target's part of the compilation database (:mod:`~metrale_orch.steps.compdb`);
:func:`stage_target` does only that much (``metrale-orch compdb``). A memoised or cached artefact is
taken only when every file its compile read still has the content it had.
Each step is recorded as a span of the build profile
(:mod:`~metrale_orch.steps.profile`), returned in ``TargetResult.spans``. One module's
lookup, compile and store are :mod:`~metrale_orch.steps.pipeline`; the tree files a
target reaches beyond its layout, :mod:`~metrale_orch.steps.tree_reach`.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from collections.abc import Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from metrale_orch.cache import Cache, cache_key
from metrale_orch.canonical import canonical_json
from metrale_orch.config import Config
from metrale_orch.fsutil import FileState, file_digest
from metrale_orch.paths import STATE_DIR, TMP_DIR, stage_dir, target_dir
from metrale_orch.steps.compdb import (
    Difference,
    TargetCommands,
    editor_differences,
    part_path,
    target_commands,
    write_part,
)
from metrale_orch.steps.compile import BuildContext
from metrale_orch.steps.deps import (
    external_stamps,
)
from metrale_orch.steps.dropped import (
    Drop,
    Exemptions,
    drop_warnings,
    scan_drops,
    shadow_exemptions,
)
from metrale_orch.steps.errors import (
    BuildConfigError,
    StageError,
)
from metrale_orch.steps.hip_mirror import scan_hip_compat
from metrale_orch.steps.includes import (
    EdgeMemo,
    Includes,
    effective_flags,
    include_dirs,
    scan_includes,
)
from metrale_orch.steps.install import install
from metrale_orch.steps.keyrecord import plan_record
from metrale_orch.steps.keys import checkout_of, module_parts
from metrale_orch.steps.pipeline import ModuleObtained, pipeline_from_memo, run_pipeline
from metrale_orch.steps.plan import config_docs, plan_target
from metrale_orch.steps.plan_values import ModulePlan, PlanMemo, TargetPlan
from metrale_orch.steps.profile import SpanRecorder
from metrale_orch.steps.results import KeyedModule, KeyedTarget, TargetResult
from metrale_orch.steps.scratch import sweep_tmp
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.staging import (
    SourceBytes,
    check_contained,
    stage,
)
from metrale_orch.steps.subshell import check_compile_paths
from metrale_orch.steps.tree_reach import (
    beyond_stamps,
    layer_dirs_of,
    module_layer_includes,
    reach_beyond,
    reaching_tree,
)
from metrale_orch.toolchain.argv import overridden_environment, toolchain_environ
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.probe import find_toolchain
from metrale_orch.tree import Layout, Target, discover, read_manifest_warnings
from metrale_orch.tree.beyond import TREE_DIR, Beyond

__all__ = ["build_target", "key_target", "stage_target"]

_log = logging.getLogger("metrale_orch.steps")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prepared:
    """A target planned and staged: everything its module pipelines share."""

    layout: Layout
    plan: TargetPlan
    memo: PlanMemo
    ctx: BuildContext
    beyond: Beyond
    exempt: Exemptions
    drops: tuple[Drop, ...]
    #: The caller's variables the toolchain's ``env_set`` overrides, one warning each.
    env_warnings: tuple[str, ...]
    includes: Mapping[str, Includes]
    #: The task's other file dependencies -> their digest when this build read them.
    others: Mapping[Path, str]


def build_target(
    root: Path,
    target: Target | Layout,
    *,
    config: Config,
    cache: Cache | None = None,
    environ: Mapping[str, str],
    log: logging.Logger | None = None,
    toolchains: Mapping[str, Toolchain] | None = None,
    session: BuildSession | None = None,
) -> TargetResult:
    """Stage, compile (or restore) and install one target; write its manifest last.

    The modules' pipelines (lookup, compile, store) run in parallel on ``session``
    (its executor runs at most ``jobs`` compiles at once); without a session the
    build gets a private one of ``config.jobs``. Compiler failures do not raise:
    they are logged and returned in ``TargetResult.failures`` (nothing is installed
    then: the last good build stays) while the other modules go on; so, with
    ``config.require_hits``, is a module that every cache tier misses
    (:class:`MissRefused`: not compiled). Raises
    ``LayoutError`` for a tree error, :class:`ToolchainMissing` when the compiler is not
    installed, :class:`ToolchainError` / :class:`BuildConfigError` / ``DefaultsError`` for bad
    settings, :class:`UnsafePathError` (before any compile) for a path the compiler's
    sub-shell would misread, :class:`~metrale_orch.steps.staging.ContainmentError` for
    an input outside ``kernels/``, :class:`StageError` when the build dir cannot be
    written, and :class:`~metrale_orch.executor.ActionStopped` when the session was
    stopped.
    """
    own = session is None
    if session is None:
        session = BuildSession.local(jobs=config.jobs, build_dir=Path(config.build_dir))
    try:
        return _build(Path(root), target, config, cache, environ, log or _log, toolchains, session)
    finally:
        if own:
            session.close()


def stage_target(
    root: Path,
    target: Target | Layout,
    *,
    config: Config,
    environ: Mapping[str, str],
    log: logging.Logger | None = None,
    toolchains: Mapping[str, Toolchain] | None = None,
) -> tuple[TargetCommands, tuple[Difference, ...]]:
    """Plan and stage one target exactly as its build does, without compiling, and return
    its compile commands (:mod:`~metrale_orch.steps.compdb`), also written as its part of
    the compilation database, with the includes an editor of its tree files resolves
    otherwise than its compiles (:func:`~metrale_orch.steps.compdb.editor_differences`).
    The target's artefact directory is created (empty when it was never built), so that
    each command runs as it is. Raises what :func:`build_target` raises before its first
    compile."""
    root = Path(root)
    build_dir = Path(config.build_dir)
    layout = target if isinstance(target, Layout) else discover(root, target)
    if toolchains is None:
        toolchains = load_toolchains(root)
    session = BuildSession.local(jobs=1, build_dir=build_dir)
    try:
        rec = SpanRecorder(str(layout.target))
        prep = _prepare(root, layout, config, None, environ, log or _log, toolchains, session, rec)
    finally:
        session.close()
    commands = _write_commands(root, build_dir, prep)
    dest = target_dir(build_dir, *_parts(layout.target))
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(str(layout.target), str(dest), f"cannot create it: {exc}") from None
    differences = [
        d
        for module in prep.plan.modules
        for d in editor_differences(
            root,
            module,
            staged=prep.ctx.staged,
            includes=prep.includes,
            dirs=_search_dirs(prep, module),
        )
    ]
    return commands, tuple(differences)


def key_target(
    root: Path,
    target: Target | Layout,
    *,
    config: Config,
    environ: Mapping[str, str],
    toolchains: Mapping[str, Toolchain] | None = None,
) -> KeyedTarget:
    """Plan and stage one target as its build does and key each module, without compiling
    (the toolchain is probed, as every build does). Raises what :func:`build_target` raises
    before its first compile."""
    root = Path(root)
    layout = target if isinstance(target, Layout) else discover(root, target)
    if toolchains is None:
        toolchains = load_toolchains(root)
    session = BuildSession.local(jobs=1, build_dir=Path(config.build_dir))
    try:
        rec = SpanRecorder(str(layout.target))
        prep = _prepare(root, layout, config, None, environ, _log, toolchains, session, rec)
        keyed = _key_all(prep, config.cache_namespace, session, rec)
    finally:
        session.close()
    return KeyedTarget(
        plan=prep.plan,
        staged=prep.ctx.staged,
        roots=prep.ctx.roots,
        modules=tuple(keyed),
    )


def _search_dirs(prep: _Prepared, module: ModulePlan) -> tuple[str, ...]:
    """The stage-relative directories a module's compile searches (its ``-I``s, the
    layer directory under ``.tree/`` when it reaches one)."""
    plan, ctx = prep.plan, prep.ctx
    dirs = include_dirs(module.cwd, *ctx.words.get(module.cwd, (plan.flags, ())))
    layer = ctx.layer_includes.get(module.staged)
    if layer:
        dirs = (*dirs, posixpath.normpath(posixpath.join(module.cwd, layer)))
    return dirs


def _write_commands(root: Path, build_dir: Path, prep: _Prepared) -> TargetCommands:
    """The target's compile commands, written as its part of the compilation database
    (raises :class:`StageError` when the part cannot be written)."""
    ctx = prep.ctx
    commands = target_commands(
        root, build_dir, prep.plan, program=str(ctx.program), layer_includes=ctx.layer_includes
    )
    try:
        write_part(build_dir, commands)
    except OSError as exc:
        where = str(part_path(build_dir, prep.plan.target))
        raise StageError(str(prep.plan.target), where, f"cannot write it: {exc}") from None
    return commands


def _build(
    root: Path,
    target: Target | Layout,
    config: Config,
    cache: Cache | None,
    environ: Mapping[str, str],
    log: logging.Logger,
    toolchains: Mapping[str, Toolchain] | None,
    session: BuildSession,
) -> TargetResult:
    start = time.perf_counter()
    with session.preparing():
        layout = target if isinstance(target, Layout) else discover(root, target)
    rec = SpanRecorder(str(layout.target))
    with rec.span("build") as totals:
        if toolchains is None:
            toolchains = load_toolchains(root)
        with session.preparing():
            prep = _prepare(root, layout, config, cache, environ, log, toolchains, session, rec)
            _write_commands(root, Path(config.build_dir), prep)
            keyed = _key_all(prep, config.cache_namespace, session, rec)
        obtained = _obtain_all(prep, keyed, session, rec)
        with session.finishing(), rec.span("install") as install_args:
            outputs = {o.result.artefact: o.data for o in obtained if o.data is not None}
            failures = tuple(o.failure for o in obtained if o.failure is not None)
            # A failed build installs nothing: the last good build stays, whole.
            manifest_rel, installed = "", dict[Path, FileState]()
            if not failures:
                manifest_rel, installed = install(
                    root,
                    prep.plan,
                    layout,
                    [o.result for o in obtained],
                    outputs,
                    build_dir=Path(config.build_dir),
                    dropped=prep.drops,
                    same=session.same_bytes,
                )
            install_args["bytes"] = sum(len(d) for d in outputs.values())
        counts = {"compiled": 0, "local": 0, "remote": 0, "memo": 0, "run": 0, "failed": 0}
        for o in obtained:
            counts[o.outcome] += 1
        totals.update(
            modules=len(obtained),
            compiled=counts["compiled"],
            local=counts["local"],
            remote=counts["remote"],
            shared=counts["memo"] + counts["run"],
            failed=counts["failed"],
        )
    log.info(
        "%s: %d module(s): %s%s",
        layout.target,
        len(obtained),
        ", ".join(f"{k} {v}" for k, v in counts.items() if v),
        " (FAILED)" if failures else "",
    )
    return _target_result(
        root, prep, obtained, counts, toolchains, installed, manifest_rel, session, rec, start
    )


def _prepare(
    root: Path,
    layout: Layout,
    config: Config,
    cache: Cache | None,
    environ: Mapping[str, str],
    log: logging.Logger,
    toolchains: Mapping[str, Toolchain],
    session: BuildSession,
    rec: SpanRecorder,
) -> _Prepared:
    """Plan the target (SPEC 3.2), check what it reaches, stage it (SPEC 3.3)."""
    build_dir = Path(config.build_dir)
    with rec.span("plan"):
        tc = select_toolchain(layout.hardware, toolchains)
        # What the compiler runs in, keyed and logged: the toolchain's env_set wins.
        env_warnings = tuple(overridden_environment(tc, environ))
        environ = toolchain_environ(tc, environ)
        found = find_toolchain(
            tc,
            environ,
            state_dir=build_dir / STATE_DIR,
            arch=layout.hardware.arch or "",
            memo=session.probes,
        )
        memo = PlanMemo(root)
        compat = scan_hip_compat(root, config.hip_compat_dir) if tc.dialect == "hip" else None
        check_compile_paths(
            build_dir=build_dir,
            environ=environ,
            toolkit=found.roots,
            host_compiler_env=tc.host_compiler_env,
            compat_dir=None if compat is None else compat.dir,
        )
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
        read = SourceBytes()  # the walk's reads, staged as they were read
        beyond = reach_beyond(root, layout, compat, read)
        exempt = shadow_exemptions((memo.rel(p), doc) for p, doc in config_docs(layout))
        if exempt.problems:
            raise BuildConfigError(*exempt.problems[0])
        # What the task's other file dependencies (manifests, toolchain file) held when
        # this build read them; compared again at the end (saved state = what was built).
        sources = set(layout.inputs())
        others = {p: _digest_or_empty(p) for p in plan.file_deps if p not in sources}
        tmp_root = build_dir / TMP_DIR
        if session.first_sweep(os.fspath(tmp_root)):
            sweep_tmp(tmp_root, log)
        layer_includes = module_layer_includes(root, layout) if beyond.files else {}
    with rec.span("stage"):
        staged = stage(
            layout,
            stage_dir(build_dir, *_parts(layout.target)),
            beyond.files,
            dirs=[f"{TREE_DIR}/{d}" for d in layer_dirs_of(root, layout)] if beyond.files else (),
            same=session.same_bytes,
            read=read,
        )
        del read  # the staged files' bytes: not kept while the target is prepared
        # SPEC 3.3.2: what leaf forks drop from their common namesakes, read from the stage
        # with each root's own -I directories (a leaf module's are its compile's).
        argv_of = {m.source: m.argv for m in plan.modules}
        drops = scan_drops(
            layout,
            staged,
            {m.stem: m.name for m in plan.modules},
            dirs=lambda cwd, entry: include_dirs(cwd, argv_of.get(entry.source, plan.flags)),
        )
        includes = scan_includes(staged, session.includes_memo)
        if layer_includes:
            # Only the modules that reach a mirrored file get the extra -I (and a key that
            # says so): the others keep sharing their keys with the same module of others.
            layer_includes = reaching_tree(plan, staged, includes, layer_includes)
        ctx = BuildContext(
            plan=plan,
            staged=staged,
            root=root,
            checkout=checkout_of(plan, staged),
            program=found.program,
            roots=found.roots,
            system_dirs=found.system_dirs,
            cache=cache,
            environ=environ,
            tmp_root=tmp_root,
            log=log,
            session=session,
            layer_includes=layer_includes,
            includes=includes,
            require_hits=config.require_hits,
            compile_timeout=config.compile_timeout,
            words={
                cwd: effective_flags(
                    plan,
                    os.path.abspath(staged.dir / cwd),
                    plan.switches.extra,
                )
                for cwd in {m.cwd for m in plan.modules}
            },
        )
    return _Prepared(
        layout=layout,
        plan=plan,
        memo=memo,
        ctx=ctx,
        beyond=beyond,
        exempt=exempt,
        drops=tuple(drops),
        env_warnings=env_warnings,
        includes=includes,
        others=others,
    )


def _key_all(
    prep: _Prepared, namespace: str, session: BuildSession, rec: SpanRecorder
) -> list[KeyedModule]:
    """Every module of the plan with its action key and the parts it hashed, in plan order."""
    ctx = prep.ctx
    keyed: list[KeyedModule] = []
    edges: EdgeMemo = {}  # one stage, one scan: the modules share their headers' includes
    for module in prep.plan.modules:
        with rec.span("key", module=module.name) as args:
            parts = module_parts(
                prep.plan,
                module,
                staged=ctx.staged,
                includes=prep.includes,
                words=ctx.words.get(module.cwd, (prep.plan.flags, ())),
                layer_include=ctx.layer_includes.get(module.staged, ""),
                checkout=prep.ctx.checkout,
                hasher=session.hasher,
                memo=edges,
            )
            key = cache_key(namespace, parts)
            args["key"] = key
        keyed.append(KeyedModule(module=module, key=key, parts=parts))
    return keyed


def _obtain_all(
    prep: _Prepared,
    keyed: list[KeyedModule],
    session: BuildSession,
    rec: SpanRecorder,
) -> list[ModuleObtained]:
    """Run the pipelines of the keyed modules on the session's event loop, in this context
    (the cache's per-task statistics follow); results in plan order.

    Every pipeline has ended when this returns or raises: an error other than a
    compile failure (a full disk, a stopped session) is raised after the others
    finished; an interrupt stops the session's compiles first."""
    ctx = prep.ctx
    expected = {k.key: session.expected_seconds(k.key, rec.target, k.module.name) for k in keyed}
    session.progress.add(len(keyed), sum(expected.values()))
    # Obtained earlier in the run: verified in this thread, after the others are under way
    # (no hand-off to the loop for most modules of a tree's later targets).
    here = [session.memo.holds(k.key, k.module.artefact) for k in keyed]
    futures: dict[int, Future[ModuleObtained]] = {}
    try:
        for i, k in enumerate(keyed):
            if not here[i]:
                futures[i] = session.submit(
                    run_pipeline(ctx, k.module, k.key, expected[k.key], rec, k.parts)
                )
        with session.finishing():
            for i, k in enumerate(keyed):
                if here[i]:
                    futures[i] = _from_memo(ctx, k, expected[k.key], rec, session)
        wait(futures.values())
    except BaseException:
        session.stop()
        wait(futures.values(), timeout=30)
        raise
    ordered = [futures[i] for i in range(len(keyed))]
    for future in ordered:
        exc = future.exception()
        if exc is not None:
            raise exc
    return [f.result() for f in ordered]


def _from_memo(
    ctx: BuildContext, k: KeyedModule, expected: float, rec: SpanRecorder, session: BuildSession
) -> Future[ModuleObtained]:
    """The module's pipeline from the run's memo in this thread, as a finished future, or
    on the loop when the memoised artefact no longer holds (its error raised later, after
    the target's other pipelines ended, as a pipeline's on the loop is)."""
    future: Future[ModuleObtained] = Future()
    try:
        got = pipeline_from_memo(ctx, k.module, k.key, expected, rec)
    except Exception as exc:
        future.set_exception(exc)
        return future
    if got is None:
        return session.submit(run_pipeline(ctx, k.module, k.key, expected, rec, k.parts))
    future.set_result(got)
    return future


def _target_result(
    root: Path,
    prep: _Prepared,
    obtained: list[ModuleObtained],
    counts: Mapping[str, int],
    toolchains: Mapping[str, Toolchain],
    installed: Mapping[Path, FileState],
    manifest_rel: str,
    session: BuildSession,
    rec: SpanRecorder,
    start: float,
) -> TargetResult:
    """What the build returns: outcomes, the states to save, warnings, spans."""
    memo, staged, layout = prep.memo, prep.ctx.staged, prep.layout
    built: dict[str, str] = {memo.rel.dep(p): d for p, d in staged.source_digests.items()}
    for path, before in prep.others.items():
        # Changed while this build ran: "" never matches, so the next run rebuilds.
        built[memo.rel.dep(path)] = before if _digest_or_empty(path) == before else ""
    build_keys = sorted({t.flags_key for t in toolchains.values()})
    read = [i for o in obtained for i in o.inputs]
    name = str(layout.target)
    return TargetResult(
        target=name,
        modules=tuple(o.result for o in obtained),
        failures=tuple(o.failure for o in obtained if o.failure is not None),
        cache_stats=MappingProxyType(dict(counts)),
        seconds=time.perf_counter() - start,
        manifest=manifest_rel,
        plan_record=canonical_json(plan_record(prep.plan)),
        warnings=(
            *read_manifest_warnings(root, layout, build_keys=build_keys),
            *drop_warnings(name, list(prep.drops), prep.exempt, root),
            *prep.env_warnings,
        ),
        inputs=MappingProxyType(dict(sorted(built.items()))),
        outputs=MappingProxyType({memo.rel.dep(p): st for p, st in sorted(installed.items())}),
        external=MappingProxyType(
            {
                **external_stamps(read, session.hasher),
                **beyond_stamps(root, prep.beyond, staged, session.hasher),
            }
        ),
        spans=rec.spans,
    )


def _digest_or_empty(path: Path) -> str:
    try:
        return file_digest(os.fspath(path))
    except OSError:
        return ""


def _parts(target: Target) -> tuple[str, str, str]:
    return target.hardware, target.model, target.quant
