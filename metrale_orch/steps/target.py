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
(:mod:`~metrale_orch.steps.profile`), returned in ``TargetResult.spans``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import posixpath
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import xxhash

from metrale_orch.cache import RUN_META, Cache
from metrale_orch.config import Config
from metrale_orch.fsutil import FileState, file_digest
from metrale_orch.manifest import ModuleOutcome
from metrale_orch.paths import STATE_DIR, TMP_DIR, stage_dir, target_dir
from metrale_orch.steps.compdb import (
    Difference,
    TargetCommands,
    editor_differences,
    part_path,
    target_commands,
    write_part,
)
from metrale_orch.steps.compile import BuildContext, run_compile, sweep_tmp
from metrale_orch.steps.deps import (
    FileHasher,
    external_stamps,
    hashed_state,
    inputs_match,
    unknown_state,
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
    CompileError,
    ContainmentError,
    MissRefused,
    ModuleFailure,
    StageError,
)
from metrale_orch.steps.hip_mirror import HipCompat, scan_hip_compat
from metrale_orch.steps.includes import (
    EdgeMemo,
    Includes,
    effective_flags,
    include_dirs,
    resolve_closure,
    scan_includes,
)
from metrale_orch.steps.install import install
from metrale_orch.steps.keys import checkout_of, module_key
from metrale_orch.steps.memo import Obtained, Origin
from metrale_orch.steps.plan import ModulePlan, PlanMemo, TargetPlan, config_docs, plan_target
from metrale_orch.steps.profile import SpanRecorder
from metrale_orch.steps.results import ModuleResult, TargetResult
from metrale_orch.steps.session import BuildSession
from metrale_orch.steps.staging import (
    StagedTarget,
    beyond_layout,
    check_contained,
    layer_dir,
    role_dir,
    stage,
    uncontained,
)
from metrale_orch.steps.subshell import check_compile_paths
from metrale_orch.toolchain.argv import env_switches, overridden_environment, toolchain_environ
from metrale_orch.toolchain.definitions import Toolchain, load_toolchains, select_toolchain
from metrale_orch.toolchain.probe import find_toolchain
from metrale_orch.tree import Layout, Target, discover, read_manifest_warnings
from metrale_orch.tree.beyond import TREE_DIR, Beyond, layer_include

__all__ = ["build_target", "stage_target"]

_log = logging.getLogger("metrale_orch.steps")

#: How :func:`_obtain` got an artefact: this process's memo, a cache entry this run stored
#: (another worker process compiled it), a cache tier, or the compiler. The first two are
#: shared in the run: another target obtained the artefact, no cache served it.
Obtainment = Literal["memo", "run", "local", "remote", "compiled"]
_SHARED: frozenset[str] = frozenset(("memo", "run"))


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


@dataclass(frozen=True, slots=True, kw_only=True)
class _Obtained:
    """One module's pipeline result: its record, bytes, the inputs its compile read."""

    result: ModuleResult
    data: bytes | None
    inputs: tuple[tuple[str, str, str], ...]
    outcome: Obtainment | Literal["failed"]
    failure: ModuleFailure | None = None


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
    they are logged and returned in ``TargetResult.failures`` (no manifest is
    written then) while the other modules go on; so, with ``config.require_hits``, is a
    module that every cache tier misses (:class:`MissRefused`: not compiled). Raises
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
            manifest_rel, installed = install(
                root,
                prep.plan,
                layout,
                [o.result for o in obtained],
                outputs,
                failed=bool(failures),
                build_dir=Path(config.build_dir),
                dropped=prep.drops,
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
        beyond = _beyond_layout(root, layout, compat)
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
        layer_includes = _layer_includes(root, layout) if beyond.files else {}
    with rec.span("stage"):
        staged = stage(
            layout,
            stage_dir(build_dir, *_parts(layout.target)),
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
        includes = scan_includes(staged, session.includes_memo)
        if layer_includes:
            # Only the modules that reach a mirrored file get the extra -I (and a key that
            # says so): the others keep sharing their keys with the same module of others.
            layer_includes = _reaching_tree(plan, staged, includes, layer_includes)
        ctx = BuildContext(
            plan=plan,
            staged=staged,
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
                    env_switches(plan.toolchain, plan.env).extra,
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
) -> list[tuple[ModulePlan, str]]:
    """Every module of the plan with its action key, in plan order."""
    ctx = prep.ctx
    keyed: list[tuple[ModulePlan, str]] = []
    edges: EdgeMemo = {}  # one stage, one scan: the modules share their headers' includes
    for module in prep.plan.modules:
        with rec.span("key", module=module.name) as args:
            key = module_key(
                namespace,
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
            args["key"] = key
        keyed.append((module, key))
    return keyed


def _obtain_all(
    prep: _Prepared, keyed: list[tuple[ModulePlan, str]], session: BuildSession, rec: SpanRecorder
) -> list[_Obtained]:
    """Run the pipelines of the keyed modules on the session's threads, in this context
    (the cache's per-task statistics follow); results in plan order.

    Every pipeline has ended when this returns or raises: an error other than a
    compile failure (a full disk, a stopped session) is raised after the others
    finished; an interrupt stops the session's compiles first."""
    ctx = prep.ctx
    expected = {key: session.expected_seconds(key, rec.target, m.name) for m, key in keyed}
    session.progress.add(len(keyed), sum(expected.values()))
    runs = [
        # A context each: the cache's per-task statistics follow it onto the threads.
        functools.partial(
            contextvars.copy_context().run, _pipeline, ctx, module, key, expected[key], rec
        )
        for module, key in keyed
    ]
    # Obtained earlier in the run: verified in this thread, after the others are under way
    # (no thread handoff for most modules of a tree's later targets; the same pipeline).
    here = [session.memo.holds(key, m.artefact) for m, key in keyed]
    futures: dict[int, Future[_Obtained]] = {}
    try:
        for i, (_module, key) in enumerate(keyed):
            if not here[i]:
                futures[i] = session.submit_pipeline(key, runs[i])
        with session.finishing():
            for i in range(len(keyed)):
                if here[i]:
                    futures[i] = _ran_here(runs[i])
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


def _ran_here(run: Callable[[], _Obtained]) -> Future[_Obtained]:
    """``run`` called in this thread, as a finished future (its error raised later, after
    the target's other pipelines ended, as a pipeline's on a session thread is)."""
    future: Future[_Obtained] = Future()
    try:
        future.set_result(run())
    except Exception as exc:
        future.set_exception(exc)
    return future


def _pipeline(
    ctx: BuildContext, module: ModulePlan, key: str, expected: float, rec: SpanRecorder
) -> _Obtained:
    """One module: from the memo or the cache, else compiled (on a session thread);
    ``expected`` is its compile's seconds in the last build (0 when unknown)."""
    t0 = time.perf_counter()
    progress = ctx.session.progress
    outcome: Obtainment | Literal["failed"] = "failed"
    origin: Origin = "compiled"
    failure: ModuleFailure | None = None
    try:
        data, outcome, inputs, origin = _obtain(ctx, module, key, rec, expected)
    except (CompileError, MissRefused) as exc:
        failure = exc
        ctx.log.error("%s", exc)
        data, inputs = None, ()
    finally:
        progress.finished("shared" if outcome in _SHARED else outcome, expected)
    shared = outcome in _SHARED
    result = ModuleResult(
        name=module.name,
        stem=module.stem,
        source=module.source_rel,
        artefact=module.artefact,
        key=key,
        # The manifest says where the bytes were found (a shared artefact: "local").
        outcome="local" if shared else outcome,  # type: ignore[arg-type]  # not shared
        xxh3="" if data is None else xxhash.xxh3_128_hexdigest(data),
        seconds=time.perf_counter() - t0,
        shared=origin if shared else "",
    )
    return _Obtained(result=result, data=data, inputs=inputs, outcome=outcome, failure=failure)


def _recorded(outcome: Obtainment | Literal["failed"]) -> ModuleOutcome:
    """The manifest's outcome: where the bytes were found (a shared artefact: "local",
    the first target's; ``ModuleResult.shared`` says it was shared)."""
    if outcome == "memo" or outcome == "run":
        return "local"
    return outcome


def _target_result(
    root: Path,
    prep: _Prepared,
    obtained: list[_Obtained],
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
                **_beyond_stamps(root, prep.beyond, staged, session.hasher),
            }
        ),
        spans=rec.spans,
    )


def _digest_or_empty(path: Path) -> str:
    try:
        return file_digest(os.fspath(path))
    except OSError:
        return ""


def _beyond_layout(root: Path, layout: Layout, compat: HipCompat | None) -> Beyond:
    """SPEC 3.3.1: the tree files this target's compiles reach beyond its layout (to be
    staged under ``.tree/``). Raises the first escaping include (naming the file and line)
    and :class:`~metrale_orch.steps.staging.ContainmentError` for a file reached through a
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


def _beyond_stamps(
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


def _obtain(
    ctx: BuildContext, module: ModulePlan, key: str, rec: SpanRecorder, expected: float
) -> tuple[bytes, Obtainment, tuple[tuple[str, str, str], ...], Origin]:
    """The artefact bytes of ``module``, how they were obtained (memo|run|local|remote|
    compiled), the inputs its compile read, and how the run first got them (compiled, or
    from a tier: a shared artefact's first target's; the outcome itself otherwise).

    A memoised or cached artefact is taken only when every file its compile
    read still has the content it had (:func:`metrale_orch.steps.deps.inputs_match`);
    otherwise the module is compiled and the new entry replaces the local one.
    One pipeline per key at a time in this session, and one per key across processes
    while a cache is open (its key lock): a target whose module shares a key with one
    in flight waits for that result and verifies it. Records the ``lookup`` span
    (which includes that wait; its ``source`` is ``memo``, ``run`` or ``cache`` for an
    artefact found), then ``compile`` and ``store`` on a miss, in ``rec``. A lookup shared
    in the run (memo, run) is counted by the cache as ``shared``, never as a hit.
    Raises :class:`CompileError` when the compiler fails, and :class:`MissRefused` instead
    of compiling when ``ctx.require_hits`` is set.
    """
    session = ctx.session

    def still_valid(inputs: object) -> bool:
        return inputs_match(
            inputs,
            module_cwd=module.cwd,
            staged=ctx.staged.hashes,
            roots=ctx.roots,
            hasher=session.hasher,
        )

    with session.memo.claim(key), contextlib.ExitStack() as held:
        with rec.span("lookup", module=module.name, key=key) as args:
            got = session.memo.get(key, module.artefact)
            if got is not None and still_valid([list(i) for i in got.inputs]):
                args.update(outcome="local", source="memo", bytes=len(got.data))
                if ctx.cache is not None:
                    ctx.cache.count_shared()
                return got.data, "memo", got.inputs, got.origin
            if ctx.cache is not None:
                held.enter_context(ctx.cache.key_lock(key))  # until stored, see above
            hit, rejected = _cache_lookup(ctx, module, key, still_valid)
            if hit is not None:
                data, tier, _inputs, _origin = hit
                if tier == "run":  # another worker process of this run compiled it
                    args.update(outcome="local", source="run", bytes=len(data))
                else:
                    args.update(outcome=tier, source="cache", bytes=len(data))
                return hit
            args["outcome"] = "miss"
            if ctx.require_hits:
                args["outcome"] = "refused"
                raise MissRefused(
                    str(ctx.plan.target),
                    module.name,
                    module.source_rel,
                    key,
                    "no tier, as there is no cache" if ctx.cache is None else ctx.cache.tiers(),
                    rejected,
                )
        data, inputs = _compile_and_store(ctx, module, key, rec, expected, rejected)
        return data, "compiled", inputs, "compiled"


def _cache_lookup(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    still_valid: Callable[[object], bool],
) -> tuple[tuple[bytes, Obtainment, tuple[tuple[str, str, str], ...], Origin] | None, bool]:
    """The cached artefact of ``key`` whose recorded inputs still hold, as :func:`_obtain`
    returns it (or None), and whether an entry was rejected for other inputs."""
    cache = ctx.cache
    if cache is None:
        return None, False
    rejected = False

    def accept(meta: Mapping[str, object]) -> bool:
        nonlocal rejected
        ok = still_valid(meta.get("inputs"))
        rejected = rejected or not ok
        return ok

    hit = cache.get(key, accept=accept, run=ctx.session.run)
    if hit is not None and module.artefact in hit.outputs:
        data = bytes(hit.outputs[module.artefact])
        origin: Origin = "remote" if hit.tier == "remote" else "local"
        # An entry this run stored (another worker process compiled it) is shared.
        tier: Obtainment = "run" if hit.shared else origin
        if hit.shared:
            origin = "compiled"
        inputs = _as_inputs(hit.meta.get("inputs"))
        ctx.session.memo.put(key, module.artefact, Obtained(data, inputs, origin))
        ctx.log.info("%s: %s from the %s cache (%s)", ctx.plan.target, module.name, hit.tier, key)
        return (data, tier, inputs, origin), rejected
    if rejected:
        ctx.log.info(
            "%s: %s: the cached entry %s was compiled from other inputs; recompiling",
            ctx.plan.target,
            module.name,
            key,
        )
    return None, rejected


def _compile_and_store(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    rec: SpanRecorder,
    expected: float,
    replace: bool,
) -> tuple[bytes, tuple[tuple[str, str, str], ...]]:
    """Compile ``module`` (``compile`` span), publish it to the cache (``store``) and the
    session's memo. Raises :class:`CompileError`."""
    plan = ctx.plan
    with rec.span("compile", module=module.name, key=key) as args:
        args["outcome"] = "failed"
        data, seconds, inputs, ran = run_compile(ctx, module, expected=expected)
        # The span also holds the wait for an executor slot ("wait"); "seconds" is the
        # compiler's own time.
        args.update(
            outcome="compiled",
            bytes=len(data),
            seconds=round(seconds, 6),
            wait=round(ran.waited, 6),
        )
        if ran.where:
            args["where"] = ran.where
    for name, (begin, end) in ran.stages.items():  # the remote engine's, as it reported
        rec.add_between(
            "remote",
            int(begin * 1e9),
            int(end * 1e9),
            module=module.name,
            stage=name,
            key=key,
        )
    if ctx.cache is not None:
        with rec.span("store", module=module.name, bytes=len(data), key=key):
            ctx.cache.put(
                key,
                {module.artefact: data},
                {
                    "command": list(module.argv),
                    "toolchain": {"name": plan.toolchain.name, "identity": plan.identity},
                    "producer": f"metrale-orch {plan.target} {module.name}",
                    "compile_seconds": round(seconds, 6),
                    "inputs": [list(i) for i in inputs],
                    RUN_META: ctx.session.run,
                },
                replace=replace,
            )
    ctx.session.memo.put(key, module.artefact, Obtained(data, inputs, "compiled"))
    return data, inputs


def _as_inputs(value: object) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        (str(i[0]), str(i[1]), str(i[2])) for i in value if isinstance(i, list) and len(i) == 3
    )


def _parts(target: Target) -> tuple[str, str, str]:
    return target.hardware, target.model, target.quant
