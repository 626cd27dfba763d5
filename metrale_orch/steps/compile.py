"""Compile one module for real: in its staged role directory, into a temporary directory.

:func:`run_compile` renders the toolchain's argv for this machine (the
program's path; every other path relative to the module's working directory, which
no sub-shell of the compiler can misread: :mod:`~metrale_orch.steps.subshell`), runs it
through :func:`metrale_orch.proc.run_process`
and returns the artefact's bytes with the inputs the compile read (from the
compiler's dependency list, or the scanned closure). :class:`BuildContext` is
what every module of one target's build shares. Leftovers of killed compiles
are swept once per process.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.cache import Cache
from metrale_orch.paths import stage_relpath
from metrale_orch.steps.deps import Input, classify, parse_depfile, record_inputs
from metrale_orch.steps.errors import CompileError, StageError
from metrale_orch.steps.hip_mirror import (
    MIRROR_DIR,
    mirror_files,
    mirrored_source,
    unmirror,
    write_mirror,
)
from metrale_orch.steps.includes import (
    Includes,
    include_dirs,
    read_files_of,
    resolve_closure,
    scan_includes,
)
from metrale_orch.steps.plan_values import ModulePlan, TargetPlan
from metrale_orch.steps.remote_form import OUT_DIR, remote_form
from metrale_orch.steps.scratch import scratch_name
from metrale_orch.steps.staging import StagedTarget
from metrale_orch.toolchain.argv import (
    compile_argv,
    link_argv,
    set_environment_line,
)

if TYPE_CHECKING:
    from metrale_orch.steps.session import BuildSession
from metrale_orch.executor import Action, RemoteForm
from metrale_orch.executor.loop import offload
from metrale_orch.proc import ProcessError, format_argv

__all__ = ["BuildContext", "run_compile", "step_argv"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildContext:
    """What every module of one target's build shares."""

    plan: TargetPlan
    staged: StagedTarget
    #: The project root (tree files are named relative to it).
    root: Path
    #: The absolute stage path when the target's flags embed paths (its keys are then
    #: this checkout's), else "" (:func:`~metrale_orch.steps.keys.checkout_of`).
    checkout: str
    program: Path
    roots: tuple[str, ...]
    system_dirs: tuple[str, ...]
    cache: Cache | None
    environ: Mapping[str, str]
    tmp_root: Path
    log: logging.Logger
    #: The run's shared state: the executor, the memo, the file hasher.
    session: BuildSession
    #: Module working directory -> :func:`effective_flags` there.
    words: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    #: Staged source of a module -> the ``-I`` that makes ``.tree/<its layer directory>``
    #: its layer directory (only when the target reaches files beyond its layout).
    layer_includes: Mapping[str, str] = field(default_factory=dict)
    #: Staged file -> its include lines (scanned once per target, not once per module).
    includes: Mapping[str, Includes] = field(default_factory=dict)
    #: ``require_hits``: a module every cache tier misses fails (:class:`MissRefused`)
    #: instead of compiling.
    require_hits: bool = False
    #: ``compile_timeout``: seconds one compile step may run, here or remotely.
    compile_timeout: float
    #: Held while a module writes the stage's HIP mirror (the target's modules compile
    #: in parallel; the mirror and its record are one directory).
    mirror_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Directory -> its real path, as far as this target's modules asked (:meth:`real`).
    realpaths: dict[str, str] = field(default_factory=dict)

    def real(self, directory: Path) -> str:
        """``os.path.realpath(directory)``, remembered for this target's build: its
        modules render their steps in the same few directories."""
        key = os.fspath(directory)
        found = self.realpaths.get(key)
        if found is None:
            found = self.realpaths[key] = os.path.realpath(key)
        return found


def _relative(path: Path, cwd: str) -> str:
    """``path`` as the compiler gets it: relative to its working directory ``cwd`` (a
    real path). nvcc passes paths on through ``sh -c`` and splits option values at
    commas; relative, no character of the checkout's path reaches it. Both sides are
    resolved, so a symlinked build directory cannot make ``..`` lead elsewhere."""
    return os.path.relpath(os.path.realpath(path), cwd)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    """Where a compile ran, when an executor could send it elsewhere (the profile's)."""

    #: :attr:`~metrale_orch.proc.Completed.where`: "" (here), "remote", ...
    where: str = ""
    #: The remote engine's stages: name -> (start, end) in ``time.time()`` seconds.
    stages: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: Seconds the steps waited for an executor slot before their compiler started:
    #: the part of the executor's time that is not the compiler's own (the profile's).
    waited: float = 0.0
    #: The largest peak memory of its steps in bytes (0: not measured, e.g. remote).
    memory: int = 0
    #: Where a step's peak was not known locally, the most it can have been (bytes).
    bound: int = 0


async def run_compile(
    ctx: BuildContext, module: ModulePlan, *, expected: float = 0.0
) -> tuple[bytes, float, tuple[Input, ...], Ran]:
    """Compile one module in its staged role directory into a temporary directory.

    As the reference drives each compiler (SPEC 3.3): a ``hip``-dialect toolchain
    compiles the module's mirror (:mod:`metrale_orch.steps.hip_mirror`, written under
    the stage) with the project's compat directory as ``-I``; a two-step
    toolchain (Metal) turns the first step's intermediate into the artefact;
    the toolchain's environment switches are those of the plan.

    Returns (artefact bytes, seconds, the inputs the compile read
    (:class:`~metrale_orch.steps.deps.Input`): from the compiler's dependency list when the
    toolchain writes one (mirrored files named as the staged files they were
    made from), else the scanned closure, plus the files named by flags; and
    where it ran, :class:`Ran`).
    Raises :class:`CompileError`, or :class:`StageError` when the temporary
    directory or the mirror cannot be written.
    """
    # The file work around the compile (the artefact and the dependency list read, the
    # inputs hashed, the temporary directory removed) goes to the loop's pool: on the loop
    # each of those system calls would wait for the one before it. The temporary directory
    # is made by the executor that runs the compile here: a remote run brings its outputs
    # back in memory, and no file of it is written, read or removed. Rendering the steps
    # touches no file but HIP's mirror: on the loop, it never waits in the pool's queue
    # behind every other module's (measured: with 64 jobs, compiles waited for the pool
    # while targets were being planned, and a fifth of the jobs ran).
    ctx.session.compiled = True  # targets are prepared one at a time from now on
    if ctx.plan.hip_compat is not None:
        steps, remote = await offload(_prepared, ctx, module)
    else:
        steps, remote = _prepared(ctx, module)
    try:
        ran_at = await _run_steps(ctx, module, steps, expected, remote)
        done = await offload(_outcome_removed, ctx, module, steps, ran_at)
        if remote is not None and done.escape:
            # A remote worker read a file we cannot vouch for: compile here instead.
            ctx.log.info(
                "%s: %s: compiled again here: %s", ctx.plan.target, module.name, done.escape
            )
            remote = replace(remote, local_reason=done.escape)
            ran_at = await _run_steps(ctx, module, steps, expected, remote)
            done = await offload(_outcome_removed, ctx, module, steps, ran_at)
        return done.data, ran_at.seconds, done.inputs, ran_at.ran
    except BaseException:
        if os.path.lexists(steps.tmp):  # a run here made it, and no outcome removed it
            await offload(shutil.rmtree, steps.tmp, True)
        raise


def _prepared(ctx: BuildContext, module: ModulePlan) -> tuple[_Steps, RemoteForm | None]:
    """A compile's steps, rendered into a temporary directory still to be made, and its
    remote form where the session can send it (raises :class:`StageError`)."""
    steps = _render_steps(ctx, module, _temporary_dir(ctx, module))
    return steps, _remote_form(ctx, module, steps) if ctx.session.remote else None


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a compile that exited 0 produced: the artefact, the inputs it read, and what a
    remote run of it read that this machine cannot vouch for ("" when nothing)."""

    data: bytes
    inputs: tuple[Input, ...]
    escape: str


def _outcome_removed(ctx: BuildContext, module: ModulePlan, steps: _Steps, ran: _Ran) -> _Outcome:
    """:func:`_outcome`, then the temporary directory a run here made removed: one trip to
    the pool for both (each trip hands the interpreter between two threads twice)."""
    try:
        return _outcome(ctx, module, steps, ran)
    finally:
        if not ran.ran.where.startswith("remote"):  # a run here: it made the directory
            shutil.rmtree(steps.tmp, ignore_errors=True)


def _outcome(ctx: BuildContext, module: ModulePlan, steps: _Steps, ran: _Ran) -> _Outcome:
    """The :class:`_Outcome` of a compile that ran as ``ran`` says (raises CompileError)."""
    data, read = _results(ctx, module, steps, ran)
    if ran.ran.where.startswith("remote"):
        escape = _read_outside(ctx, steps, read)
        if escape:
            return _Outcome(data, (), escape)
    recorded = record_inputs(
        read,
        stage_dir=os.path.abspath(ctx.staged.dir),
        cwd=os.path.abspath(steps.cwd),
        module_cwd=module.cwd,
        staged=ctx.staged.hashes,
        roots=ctx.roots,
        hasher=ctx.session.hasher,
        system_dirs=ctx.system_dirs,
    )
    return _Outcome(data, tuple(Input(k, p, h) for k, p, h in recorded), "")


def _results(
    ctx: BuildContext, module: ModulePlan, steps: _Steps, ran: _Ran
) -> tuple[bytes, list[str]]:
    """The artefact's bytes and what the compile read (raises :class:`CompileError`)."""
    fail = _failure(ctx, module, ran.returncode, ran.text)
    data = _produced(steps.output, ran.outputs)
    if not data:
        raise fail(steps.argvs[-1], f"exited 0 but wrote no {module.artefact}")
    return data, _files_read(ctx, module, steps, fail, ran.outputs)


def _produced(path: Path, outputs: Mapping[Path, bytes]) -> bytes:
    """The bytes of an output file of the compile: those its executor brought back in
    memory, else the file's (b"" when it is missing)."""
    data = outputs.get(path)
    if data is not None:
        return data
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _remote_form(ctx: BuildContext, module: ModulePlan, steps: _Steps) -> RemoteForm:
    """The compile as a remote executor sends it: the same step rendered with its outputs
    at fixed places under :data:`OUT_DIR` in the module's directory (REAPI output paths
    are relative to the working directory, without ``..``; see :mod:`.remote_form`)."""
    staged = ctx.staged
    fixed = _render_steps(ctx, module, staged.dir / module.cwd / OUT_DIR / module.name)
    outputs = {posixpath.relpath(fixed.output, staged.dir): steps.output}
    if ctx.plan.toolchain.depfile_args:
        outputs[posixpath.relpath(fixed.depfile, staged.dir)] = steps.depfile
    reason = ""
    if len(fixed.argvs) > 1:
        reason = "a two-step toolchain (its intermediate file is not sent)"
    elif ctx.plan.hip_compat is not None:
        reason = "HIP's mirrored sources are not sent"
    elif ctx.layer_includes.get(module.staged):
        reason = "it reaches files beyond its layout (their empty .tree/ directories are not sent)"
    elif ctx.checkout:
        reason = "its flags embed source paths (-lineinfo, -G, -g): the worker's would differ"
    return remote_form(
        root=staged.dir,
        files=staged.hashes,
        cwd=module.cwd,
        argv=fixed.argvs[0],
        outputs=outputs,
        toolchain=ctx.plan.toolchain,
        identity=ctx.plan.identity,
        environ=ctx.environ,
        allowed=(*ctx.roots, *ctx.system_dirs),
        container_image=ctx.session.container_image,
        reason=reason,
    )


def _read_outside(ctx: BuildContext, steps: _Steps, read: Sequence[str]) -> str:
    """What a remotely run compile read that this machine cannot vouch for, or "": a file
    the dependency list's classification (:func:`~metrale_orch.steps.deps.classify`, as
    :func:`record_inputs` records it) puts outside the stage and the toolchain's own
    directories, or a toolchain file that is not here (the worker's toolkit lies
    elsewhere)."""
    stage, cwd = os.path.abspath(ctx.staged.dir), os.path.abspath(steps.cwd)
    for path in read:
        kind, _ = classify(
            path, stage_dir=stage, cwd=cwd, roots=ctx.roots, system_dirs=ctx.system_dirs
        )
        if kind == "abs":
            return f"it read {path!r}, outside the input root and the toolchain"
        if kind != "stage" and not os.path.isfile(os.path.join(cwd, path)):
            return f"it read {path!r}, which is not on this machine"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Steps:
    """The argvs of one module's compile, and where it runs and writes."""

    argvs: tuple[tuple[str, ...], ...]
    cwd: Path
    #: The compile's temporary directory (made by an executor that runs it here).
    tmp: Path
    output: Path
    depfile: Path
    #: The first step's intermediate file (two-step toolchains), else None.
    intermediate: Path | None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ran:
    """What the executor's runs of a compile's steps came back with."""

    seconds: float
    #: The compiler's output, every step's.
    text: str
    #: The last step's exit code.
    returncode: int
    ran: Ran
    #: The outputs an executor brought back in memory (:attr:`Completed.outputs`).
    outputs: Mapping[Path, bytes]


def _temporary_dir(ctx: BuildContext, module: ModulePlan) -> Path:
    """A new name under the build's ``.tmp`` for one compile's directory (:func:`~metrale_orch.
    steps.scratch.scratch_name`); the executor that runs the compile here makes it, and
    fails when it exists."""
    return ctx.tmp_root / scratch_name(module.name)


def step_argv(
    plan: TargetPlan,
    *,
    program: str,
    here: str,
    source: str,
    output: str,
    intermediate: str,
    layer_include: str,
) -> tuple[str, ...]:
    """The first (or only) compile step of a module of ``plan`` as this machine runs it in
    the real directory ``here`` (its staged role directory): ``source``, ``output`` and
    ``intermediate`` ("" for one step) as given (relative to ``here``), the HIP compat
    directory made relative to ``here``, the module's layer directory under ``.tree/`` as
    one more ``-I`` when it has one; no dependency-list flags (the build adds them,
    :func:`_render_steps`; the compilation database leaves them out)."""
    tc = plan.toolchain
    compat = plan.hip_compat
    compat_dir = None if compat is None else compat.dir
    argv = compile_argv(
        tc,
        program=program,
        arch=plan.arch,
        flags=plan.flags,
        include=".",
        source=source,
        output=output,
        intermediate=intermediate,
        switches=plan.switches,
        compat_include="" if compat_dir is None else _relative(compat_dir, here),
    )
    if layer_include:  # SPEC 3.3.1: the module's layer directory, mirrored under .tree/
        argv = (*argv, f"-I{layer_include}")
    return argv


def _render_steps(ctx: BuildContext, module: ModulePlan, tmp: Path) -> _Steps:
    """The module's argvs for this machine, every path relative to its working directory
    (writes the HIP mirror first for a ``hip`` toolchain; raises StageError)."""
    plan, staged, tc = ctx.plan, ctx.staged, ctx.plan.toolchain
    cwd = staged.dir / module.cwd
    here = ctx.real(cwd)
    # ``tmp`` is not made yet, and is no link when it is: its parent's real path will do.
    real_tmp = os.path.join(ctx.real(tmp.parent), tmp.name)

    def in_tmp(name: str) -> str:
        return os.path.relpath(os.path.join(real_tmp, name), here)

    out = tmp / module.artefact
    depfile = tmp / "deps.d"
    compat = plan.hip_compat
    source = module.entry
    if compat is not None:
        try:
            with ctx.mirror_lock:
                write_mirror(staged.dir, mirror_files(staged.hashes, module.cwd), staged.hashes)
        except OSError as exc:
            raise StageError(
                str(plan.target),
                str(staged.dir / MIRROR_DIR),
                f"cannot write the HIP mirror: {exc}",
            ) from None
        source = mirrored_source(module.cwd, module.entry)
    intermediate = tmp / f"{module.name}.{tc.intermediate_extension}" if tc.link_argv else None
    argv = step_argv(
        plan,
        program=str(ctx.program),
        here=here,
        source=source,
        output=in_tmp(out.name),
        intermediate="" if intermediate is None else in_tmp(intermediate.name),
        layer_include=ctx.layer_includes.get(module.staged, ""),
    )
    if tc.depfile_args:
        rel = in_tmp(depfile.name)
        argv = (*argv, *(a.format_map({"depfile": rel}) for a in tc.depfile_args))
    argvs = [tuple(argv)]
    if intermediate is not None:
        argvs.append(
            tuple(
                link_argv(
                    tc,
                    program=str(ctx.program),
                    arch=plan.arch,
                    intermediate=in_tmp(intermediate.name),
                    output=in_tmp(out.name),
                )
            )
        )
    return _Steps(
        argvs=tuple(argvs),
        cwd=cwd,
        tmp=tmp,
        output=out,
        depfile=depfile,
        intermediate=intermediate,
    )


def _failure(
    ctx: BuildContext, module: ModulePlan, returncode: int | None, output: str
) -> Callable[[Sequence[str], str], CompileError]:
    """A maker of this module's :class:`CompileError` for a step and a reason."""

    def make(argv: Sequence[str], reason: str) -> CompileError:
        return CompileError(
            target=str(ctx.plan.target),
            module=module.name,
            argv=argv,
            returncode=returncode,
            output=output,
            reason=reason,
            source=module.source_rel,
            assigned=set_environment_line(ctx.plan.toolchain),
        )

    return make


async def _run_steps(
    ctx: BuildContext,
    module: ModulePlan,
    steps: _Steps,
    expected: float,
    remote: RemoteForm | None = None,
) -> _Ran:
    """Run each step through the session's executor. ``remote`` is the single step's
    remote form. Raises :class:`CompileError`."""
    target = str(ctx.plan.target)
    seconds = 0.0
    texts: list[str] = []
    returncode = 0
    ran = Ran()
    outputs: dict[Path, bytes] = {}
    waited = 0.0
    # The toolchain's env_set is part of the command (HIP_PLATFORM=amd hipcc ...).
    assigned = set_environment_line(ctx.plan.toolchain)
    for step in steps.argvs:
        ctx.log.info(
            "%s: compile %s: (cd %s &&) %s%s",
            target,
            module.name,
            module.cwd,
            f"{assigned} " if assigned else "",
            format_argv(step),
        )
        action = Action(
            argv=step,
            cwd=steps.cwd,
            env=ctx.environ,
            timeout=ctx.compile_timeout,
            expected=expected,
            memory=ctx.session.peaks.get((target, module.name), 0),
            label=f"{target} {module.name}",
            remote=remote if len(steps.argvs) == 1 else None,
            owner=target,
            scratch=steps.tmp,
        )
        asked = time.perf_counter()
        try:
            done = await ctx.session.executor.run(action)
        except ProcessError as exc:
            raise _failure(ctx, module, exc.returncode, exc.output)(step, exc.reason) from None
        # What the executor took beyond the compiler's own seconds: the wait for a slot.
        waited += max(0.0, time.perf_counter() - asked - done.seconds)
        seconds += done.seconds
        returncode = done.returncode
        memory, bound = max(ran.memory, done.memory), max(ran.bound, done.memory_bound)
        ran = Ran(where=done.where, stages=done.stages, waited=waited, memory=memory, bound=bound)
        outputs.update(done.outputs)
        texts.append((done.stdout + done.stderr).strip())
        first = step is steps.argvs[0]
        if steps.intermediate is not None and first and not steps.intermediate.is_file():
            reason = f"exited 0 but wrote no {steps.intermediate.name}"
            raise _failure(ctx, module, done.returncode, texts[-1])(step, reason)
    text = "\n".join(t for t in texts if t)
    if text:
        ctx.log.info("%s: %s: compiler output:\n%s", target, module.name, text)
    return _Ran(seconds=seconds, text=text, returncode=returncode, ran=ran, outputs=outputs)


def _files_read(
    ctx: BuildContext,
    module: ModulePlan,
    steps: _Steps,
    fail: Callable[[Sequence[str], str], CompileError],
    outputs: Mapping[Path, bytes],
) -> list[str]:
    """What the compile read, as the compiler spelled it: its dependency list (mirrored
    files named as the staged files they were made from), else the scanned closure,
    plus the files named by flags. Raises :class:`CompileError` for a missing list."""
    plan, staged = ctx.plan, ctx.staged
    tc = plan.toolchain
    if tc.depfile_args:
        text = _produced(steps.depfile, outputs).decode("utf-8", "surrogateescape")
        read = parse_depfile(text)
        if not read:
            reason = "exited 0 but wrote no dependency list (toolchain depfile_args)"
            raise fail(steps.argvs[0], reason)
        if plan.hip_compat is not None:
            read = unmirror(
                read, stage_dir=os.path.abspath(staged.dir), cwd=os.path.abspath(steps.cwd)
            )
    else:
        words = ctx.words.get(module.cwd, (plan.flags, ()))
        closure = resolve_closure(
            [module.staged],
            staged=staged.hashes,
            includes_of=ctx.includes or scan_includes(staged),
            dirs=include_dirs(module.cwd, *words),
        )
        read = [stage_relpath(p, module.cwd) for p in closure]
    switches = plan.switches
    before, after = ctx.words.get(module.cwd, (plan.flags, switches.extra))
    files = [
        os.path.join(p, "gcc") if os.path.isdir(os.path.join(steps.cwd, p)) else p
        for p in read_files_of((*before, *after))
    ]
    return [*read, *files]
