"""One module's pipeline: from the run's memo or the cache, else compiled and stored.

:func:`run_pipeline` obtains one keyed module of a target (a coroutine on the session's
event loop, its cache I/O on the loop's pool) and
records what it got: :func:`obtain` looks in the session's memo, then the cache (under
the cache's key lock), and compiles on a miss (:func:`~metrale_orch.steps.compile.run_compile`)
then publishes to the cache and the memo. A memoised or cached artefact is taken only
when every file its compile read still has the content it had. The target's steps
around it live in :mod:`~metrale_orch.steps.target`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from metrale_orch.cache import RECORD_META, RUN_META
from metrale_orch.executor.loop import offload
from metrale_orch.fsutil import bytes_hash
from metrale_orch.manifest import ModuleOutcome
from metrale_orch.steps.compile import BuildContext, run_compile
from metrale_orch.steps.deps import Input, inputs_hold, inputs_match
from metrale_orch.steps.errors import (
    CompileError,
    MissRefused,
    ModuleFailure,
)
from metrale_orch.steps.keyrecord import key_record, staged_sources
from metrale_orch.steps.memo import Obtained, Origin
from metrale_orch.steps.plan_values import ModulePlan
from metrale_orch.steps.profile import SpanArgs, SpanRecorder
from metrale_orch.steps.results import ModuleResult

T = TypeVar("T")

__all__ = ["ModuleObtained", "Obtainment", "obtain", "pipeline_from_memo", "run_pipeline"]

#: How :func:`obtain` got an artefact: this process's memo, a cache entry this run stored
#: (another worker process compiled it), a cache tier, or the compiler. The first two are
#: shared in the run: another target obtained the artefact, no cache served it.
Obtainment = Literal["memo", "run", "local", "remote", "compiled"]


_SHARED: frozenset[str] = frozenset(("memo", "run"))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleObtained:
    """One module's pipeline result: its record, bytes, the inputs its compile read."""

    result: ModuleResult
    data: bytes | None
    inputs: tuple[Input, ...]
    outcome: Obtainment | Literal["failed"]
    failure: ModuleFailure | None = None


async def run_pipeline(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    expected: float,
    rec: SpanRecorder,
    parts: Mapping[str, object],
) -> ModuleObtained:
    """One module: from the memo or the cache, else compiled (on the session's loop);
    ``expected`` is its compile's seconds in the last build (0 when unknown), ``parts``
    what its key hashed (:func:`~metrale_orch.steps.keys.module_parts`)."""
    t0 = time.perf_counter()
    outcome: Obtainment | Literal["failed"] = "failed"
    origin: Origin = "compiled"
    failure: ModuleFailure | None = None
    try:
        data, outcome, inputs, origin = await obtain(ctx, module, key, rec, expected, parts)
    except (CompileError, MissRefused) as exc:
        failure = exc
        ctx.log.error("%s", exc)
        data, inputs = None, ()
    finally:
        ctx.session.progress.finished("shared" if outcome in _SHARED else outcome, expected)
    return _obtained(module, key, t0, (data, outcome, inputs, origin), failure)


def pipeline_from_memo(
    ctx: BuildContext, module: ModulePlan, key: str, expected: float, rec: SpanRecorder
) -> ModuleObtained | None:
    """:func:`run_pipeline` in the calling thread for a module this run already obtained
    whose inputs still hold (no hand-off to the loop); None when it must run there."""
    t0, start = time.perf_counter(), time.time_ns()
    args: SpanArgs = {}
    got = memo_hit(ctx, module, key, args)
    if got is None:
        return None
    rec.add_between("lookup", start, time.time_ns(), module=module.name, key=key, **args)
    ctx.session.progress.finished("shared", expected)
    return _obtained(module, key, t0, got, None)


def _obtained(
    module: ModulePlan,
    key: str,
    t0: float,
    got: tuple[bytes | None, Obtainment | Literal["failed"], tuple[Input, ...], Origin],
    failure: ModuleFailure | None,
) -> ModuleObtained:
    data, outcome, inputs, origin = got
    shared = outcome in _SHARED
    result = ModuleResult(
        name=module.name,
        stem=module.stem,
        source=module.source_rel,
        artefact=module.artefact,
        key=key,
        # The manifest says where the bytes were found (a shared artefact: "local").
        outcome="local" if shared else outcome,  # type: ignore[arg-type]  # not shared
        xxh3="" if data is None else bytes_hash(data),
        seconds=time.perf_counter() - t0,
        shared=origin if shared else "",
    )
    return ModuleObtained(result=result, data=data, inputs=inputs, outcome=outcome, failure=failure)


def _recorded(outcome: Obtainment | Literal["failed"]) -> ModuleOutcome:
    """The manifest's outcome: where the bytes were found (a shared artefact: "local",
    the first target's; ``ModuleResult.shared`` says it was shared)."""
    if outcome == "memo" or outcome == "run":
        return "local"
    return outcome


async def obtain(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    rec: SpanRecorder,
    expected: float,
    parts: Mapping[str, object],
) -> tuple[bytes, Obtainment, tuple[Input, ...], Origin]:
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
    of compiling when ``ctx.require_hits`` is set. A stored entry keeps a record of
    ``parts``, its key's parts (:func:`~metrale_orch.steps.keyrecord.key_record`).
    """
    session = ctx.session
    async with session.memo.claim(key), contextlib.AsyncExitStack() as held:
        with rec.span("lookup", module=module.name, key=key) as args:
            got = memo_hit(ctx, module, key, args)
            if got is not None:
                return got
            if ctx.cache is not None:
                await held.enter_async_context(ctx.cache.key_lock(key))  # until stored
            hit, rejected = await _io(ctx, _cache_lookup, ctx, module, key)
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
        data, inputs = await _compile_and_store(ctx, module, key, rec, expected, rejected, parts)
        return data, "compiled", inputs, "compiled"


def memo_hit(
    ctx: BuildContext, module: ModulePlan, key: str, args: SpanArgs
) -> tuple[bytes, Obtainment, tuple[Input, ...], Origin] | None:
    """The artefact of ``key`` this run already obtained, as :func:`obtain` returns it,
    when every file its compile read still has the content it had (else None); records
    the lookup in ``args`` and counts it as shared in the run."""
    got = ctx.session.memo.get(key, module.artefact)
    if got is None or not _still_valid(ctx, module, got.inputs, inputs_hold):
        return None
    args.update(outcome="local", source="memo", bytes=len(got.data))
    if ctx.cache is not None:
        ctx.cache.count_shared()
    return got.data, "memo", got.inputs, got.origin


def _still_valid(
    ctx: BuildContext,
    module: ModulePlan,
    inputs: object,
    check: Callable[..., bool] = inputs_match,
) -> bool:
    """Whether every file in a recorded ``inputs`` list still has its recorded content
    (``check``: :func:`inputs_match` for a record read back, :func:`inputs_hold` for the
    inputs this run recorded)."""
    return check(
        inputs,
        module_cwd=module.cwd,
        staged=ctx.staged.hashes,
        roots=ctx.roots,
        hasher=ctx.session.hasher,
    )


def _cache_lookup(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
) -> tuple[tuple[bytes, Obtainment, tuple[Input, ...], Origin] | None, bool]:
    """The cached artefact of ``key`` whose recorded inputs still hold, as :func:`obtain`
    returns it (or None), and whether an entry was rejected for other inputs."""
    cache = ctx.cache
    if cache is None:
        return None, False
    rejected = False

    def accept(meta: Mapping[str, object]) -> bool:
        nonlocal rejected
        ok = _still_valid(ctx, module, meta.get("inputs"))
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


async def _compile_and_store(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    rec: SpanRecorder,
    expected: float,
    replace: bool,
    parts: Mapping[str, object],
) -> tuple[bytes, tuple[Input, ...]]:
    """Compile ``module`` (``compile`` span), publish it to the cache (``store``) and the
    session's memo. Raises :class:`CompileError`."""
    with rec.span("compile", module=module.name, key=key) as args:
        args["outcome"] = "failed"
        data, seconds, inputs, ran = await run_compile(ctx, module, expected=expected)
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
        if ran.memory:  # the compiler's peak memory in bytes (kept for the next build)
            args["memory"] = ran.memory
        elif ran.bound:  # not known, but at most this: a larger kept peak is stale
            args["memory_bound"] = ran.bound
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
            await _io(ctx, _store, ctx, module, key, data, seconds, inputs, replace, parts)
    ctx.session.memo.put(key, module.artefact, Obtained(data, inputs, "compiled"))
    return data, inputs


def _store(
    ctx: BuildContext,
    module: ModulePlan,
    key: str,
    data: bytes,
    seconds: float,
    inputs: tuple[Input, ...],
    replace: bool,
    parts: Mapping[str, object],
) -> None:
    """Publish a compiled artefact to the cache, with what made it (I/O, off the loop)."""
    plan = ctx.plan
    assert ctx.cache is not None
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
            RECORD_META: key_record(
                parts,
                namespace=ctx.cache.settings.namespace,
                target=str(plan.target),
                hardware=plan.hardware,
                module=module.name,
                source=module.source_rel,
                tree=staged_sources(ctx.staged.files, ctx.root, module.cwd),
            ),
        },
        replace=replace,
    )


async def _io(ctx: BuildContext, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, a cache lookup or store: on the session's pool where it may ask a
    remote tier (network I/O), else here on the loop (a local file: a hop to the pool and
    back costs more than reading it)."""
    if ctx.cache is not None and ctx.cache.networked:
        return await offload(fn, *args)
    return fn(*args)


def _as_inputs(value: object) -> tuple[Input, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(
        Input(str(i[0]), str(i[1]), str(i[2])) for i in value if isinstance(i, list) and len(i) == 3
    )
