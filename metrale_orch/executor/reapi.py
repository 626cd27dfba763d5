"""The REAPI glue of the remote executor: one remote form in, its outputs' bytes out.

:class:`ReapiBackend` is the :class:`~metrale_orch.executor.offload.RemoteBackend` on an
:class:`~metrale_orch.remote.client.AsyncRemoteClient`: :meth:`ReapiBackend.run` is a
coroutine on the build's event loop, and what costs CPU leaves the loop for its default
executor (a small pool): hashing a stage's files and building its input root, once per
target. Per action it builds the input root
(SHA-256 of each staged file found once per content through the stage's xxh3 hashes;
directory digests memoised by content, so the subtrees thousands of actions share are
hashed and uploaded once), the Command and Action, looks the action up in the action
cache when its input root is not yet known present (a hit uploads and executes nothing;
otherwise Execute's own lookup serves, at no extra call), uploads what the CAS lacks
(the input root's blobs once per target, FindMissingBlobs first, while the target's other
modules wait for that upload; a module's own Command and Action without asking; digests
already known present this run are not sent again), executes, and brings each declared
output back in memory, verified against its SHA-256 (the outputs, stdout and stderr in one
batch read where they fit): the compile takes the bytes where it would read its files, so a
remote action writes, reads and removes no file here. Errors map onto the executor's two kinds:
infrastructure (:class:`~metrale_orch.executor.offload.RemoteUnavailable`, run here
instead) and a compile that ran and failed (a :class:`RemoteRun` with its exit code).
Cancelling the task that awaits :meth:`ReapiBackend.run` cancels its calls in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from metrale_orch.executor.action import RemoteForm
from metrale_orch.executor.offload import RemoteRun, RemoteUnavailable
from metrale_orch.paths import stage_relpath
from metrale_orch.remote.coalesce import Coalesced
from metrale_orch.remote.digest import Digest
from metrale_orch.remote.errors import (
    BlobMissing,
    CorruptBlob,
    RemoteAuthError,
    RemoteError,
    RemoteOverloaded,
    RemoteRejected,
)
from metrale_orch.remote.errors import RemoteUnavailable as ClientUnavailable

if TYPE_CHECKING:
    from metrale_orch.config import Config
    from metrale_orch.remote._proto.remote_execution_pb2 import ActionResult
    from metrale_orch.remote.client import AsyncRemoteClient
    from metrale_orch.remote.merkle import Blob, InputRoot, MerkleMemo

__all__ = ["ReapiBackend", "open_backend"]

#: Input roots kept for reuse (one per target stage in flight; a target's modules share one).
ROOTS_KEPT = 64

#: Bytes of unknown blobs up to which they are sent without asking FindMissingBlobs first.
ASK_ABOVE = 16 * 1024

#: Seconds before asking an overloaded engine again (doubling up to the second).
THROTTLE_PAUSE = 0.1
THROTTLE_PAUSE_MAX = 2.0

#: Seconds each unary call (capabilities, FindMissingBlobs, a batch) may take.
CALL_TIMEOUT = 60.0


def open_backend(config: Config) -> ReapiBackend:
    """The backend for ``config.remote_executor`` (nothing is sent yet). Raises the
    :class:`~metrale_orch.extras.ExtraMissing` of a missing ``remote`` extra."""
    from metrale_orch.remote import AsyncRemoteClient  # the package's door: the extra checked

    client = AsyncRemoteClient(
        config.remote_executor,
        instance=config.remote_instance,
        headers={k: str(v) for k, v in config.remote_headers.items()},
        timeout=CALL_TIMEOUT,
        ca_file=config.remote_ca_file,
        streams=config.remote_jobs,
    )
    return ReapiBackend(client, queue_timeout=config.remote_queue_timeout)


class ReapiBackend:
    """See the module docstring. Its :meth:`run` is a coroutine on the build's event loop
    (the first call binds the client's channels to that loop); :meth:`close` may be
    called from any thread."""

    def __init__(self, client: AsyncRemoteClient, *, queue_timeout: float = 60.0) -> None:
        from metrale_orch.remote.merkle import MerkleMemo

        self.client = client
        self.queue_timeout = queue_timeout
        self._memo: MerkleMemo = MerkleMemo()
        #: Guards ``_sha``: input roots are built on the loop's pool threads.
        self._lock = threading.Lock()
        #: xxh3-128 of a file's bytes -> its REAPI digest (the same bytes anywhere).
        self._sha: dict[str, Digest] = {}
        #: Digests known to be in the CAS this run (found there or uploaded).
        self._present: set[Digest] = set()
        #: Input roots whose blobs are being sent (FindMissingBlobs once per root: the
        #: target's other modules wait for that upload, then send only their own blobs).
        self._sending: dict[Digest, asyncio.Future[None]] = {}
        #: Whether to look an action up in the action cache before uploading its inputs
        #: (False once the server says it has none).
        self._ac = True
        #: Input root -> whether its target's first lookup was a hit (see _worth_asking).
        self._probes: dict[Digest, asyncio.Future[bool]] = {}
        #: Stage directory -> (its file mapping, the input root built from it), newest last.
        self._roots: dict[Path, tuple[Mapping[str, str], asyncio.Future[InputRoot]]] = {}
        #: Small blobs sent unasked, many actions' in one call (see _upload).
        self._unasked: Coalesced[Digest, Blob] = Coalesced(self._send_unasked)

    @property
    def endpoint(self) -> str:
        return self.client.url

    def close(self) -> None:
        self.client.close()

    async def run(
        self,
        form: RemoteForm,
        *,
        timeout: float,
        started: Callable[[float], None] | None = None,
    ) -> RemoteRun:
        """Run ``form`` on the engine and bring its outputs back; raises
        :class:`RemoteUnavailable` for infrastructure trouble (cancelling the awaiting
        task cancels the calls in flight). ``started`` is told the seconds the action
        waited for a worker, when one takes it."""
        try:
            return await self._patient(form, timeout, time.perf_counter(), started)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():  # this task was cancelled: go on up
                raise
            # grpc.aio cancels the calls of a channel closed under them (close() from the
            # build's stop path): for this action that is the remote gone, not a cancel.
            raise RemoteUnavailable(f"the connection to {self.endpoint} was closed") from None
        except RemoteAuthError as exc:
            raise RemoteUnavailable(str(exc)) from None
        except ClientUnavailable as exc:
            raise RemoteUnavailable(_reason(exc)) from None
        except (BlobMissing, CorruptBlob) as exc:
            raise RemoteUnavailable(f"bad result: {exc}") from None
        except RemoteRejected as exc:
            raise RemoteUnavailable(_rejected(exc, timeout)) from None
        except RemoteError as exc:
            raise RemoteUnavailable(str(exc)) from None
        except OSError as exc:
            raise RemoteUnavailable(f"cannot read an input or write an output: {exc}") from None

    async def _patient(
        self,
        form: RemoteForm,
        timeout: float,
        start: float,
        started: Callable[[float], None] | None,
    ) -> RemoteRun:
        """:meth:`_run`, asked again after a pause (doubling, jittered) while the engine
        refuses it as overloaded, for at most ``queue_timeout`` seconds in all (as long
        as it may wait in the engine's own queue); the time so spent comes back as the
        run's ``throttled`` stage, which makes the executor's window send fewer at once."""
        since, pause = 0.0, THROTTLE_PAUSE
        give_up = time.monotonic() + self.queue_timeout
        while True:
            try:
                run = await self._run(form, timeout, start, started)
            except RemoteOverloaded:
                if time.monotonic() + pause > give_up:
                    raise
                since = since or time.time()
                await asyncio.sleep(pause * random.uniform(0.5, 1.0))
                pause = min(2 * pause, THROTTLE_PAUSE_MAX)
                continue
            if not since:
                return run
            return dataclasses.replace(
                run, stages={**run.stages, "throttled": (since, time.time())}
            )

    async def _run(
        self,
        form: RemoteForm,
        timeout: float,
        start: float,
        started: Callable[[float], None] | None,
    ) -> RemoteRun:
        from metrale_orch.remote.action import encode_action

        root = await self._input_root(form)
        outputs = {stage_relpath(rel, form.cwd): local for rel, local in form.outputs.items()}
        action = encode_action(form.argv, form.env, form.cwd, outputs, root, form.platform, timeout)
        # Inputs to send: ask the action cache first (a hit sends nothing). Once the root
        # is there, only the module's own Command and Action: Execute's lookup costs no call.
        asked = await self._worth_asking(root.digest)
        if asked:
            hit = await self._probe(root.digest, self._cached(action.digest, outputs, start))
            if hit is not None:  # nothing uploaded, nothing executed
                return hit
        await self._send_root(root)
        await self._upload({d: b for d, b in action.blobs.items() if d not in root.blobs})
        sent = time.perf_counter()
        done = await self.client.execute(
            action.digest,
            skip_cache_lookup=asked and self._ac,  # just asked: a miss
            timeout=timeout + self.queue_timeout,
            platform=form.platform,
            queue_timeout=self.queue_timeout,
            on_executing=started,
        )
        if done.timed_out:
            return RemoteRun(
                returncode=124,
                stdout="",
                stderr=f"remote worker stopped the compile at its {timeout:g} s timeout",
                seconds=time.perf_counter() - start,
                worker=done.timings.worker,
            )
        stdout, stderr, data = await self._fetch(
            done.result, outputs if done.exit_code == 0 else {}
        )
        return RemoteRun(
            returncode=done.exit_code,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            seconds=time.perf_counter() - start,
            cached=done.cached,
            stages=_stages(done, sent - start),
            worker=done.timings.worker,
            outputs=data,
        )

    async def _worth_asking(self, root: Digest) -> bool:
        """Whether to ask the action cache before sending ``root``: not once the root is
        in the CAS; the first module of a target asks (its answer is the target's probe);
        the others wait for that answer and ask only after a hit. After a miss the root is
        sent anyway and Execute's own lookup serves them, one call fewer each."""
        if not self._ac or root in self._present:
            return False
        probe = self._probes.get(root)
        if probe is None:
            self._probes[root] = asyncio.get_running_loop().create_future()
            return True
        return await asyncio.shield(probe)

    async def _probe(
        self, root: Digest, lookup: Coroutine[None, None, RemoteRun | None]
    ) -> RemoteRun | None:
        """``lookup``'s answer; the first for ``root`` also answers the target's probe (a
        hit or not; not, when it failed)."""
        hit: RemoteRun | None = None
        try:
            hit = await lookup
        finally:
            probe = self._probes.get(root)
            if probe is not None and not probe.done():
                probe.set_result(hit is not None)
        return hit

    async def _cached(
        self, action: Digest, outputs: Mapping[str, Path], start: float
    ) -> RemoteRun | None:
        """The action cache's successful result of ``action`` with its outputs, or
        None (a miss, a failed or incomplete result, a blob gone from the CAS, or a server
        without an action cache: then it is not asked again)."""
        try:
            result = await self.client.get_action_result(action)
        except RemoteRejected:  # no action cache here (UNIMPLEMENTED): Execute's lookup
            self._ac = False
            return None
        if result is None or result.exit_code != 0:
            return None
        try:
            stdout, stderr, data = await self._fetch(result, outputs)
        except (BlobMissing, CorruptBlob, RemoteUnavailable):  # evicted, bad, or no output
            return None
        return RemoteRun(
            returncode=0,
            stdout=stdout.decode("utf-8", "replace"),
            stderr=stderr.decode("utf-8", "replace"),
            seconds=time.perf_counter() - start,
            cached=True,
            worker=result.execution_metadata.worker,
            outputs=data,
        )

    async def _input_root(self, form: RemoteForm) -> InputRoot:
        """The form's input root: built once per stage on the loop's pool (every module of
        a target shares its stage's file mapping, and waits for the one build), then
        reused while the mapping is that same object."""
        cached = self._roots.get(form.root)
        if cached is None or cached[0] is not form.files:
            loop = asyncio.get_running_loop()
            building = loop.run_in_executor(None, self._build_root, form)
            cached = self._roots[form.root] = (form.files, building)
            self._roots[form.root] = self._roots.pop(form.root)  # the newest last
            while len(self._roots) > ROOTS_KEPT:
                self._roots.pop(next(iter(self._roots)))
            building.add_done_callback(lambda done: self._forget_failed(form.root, done))
        # Shielded: one module cancelled leaves the build to the others waiting on it.
        return await asyncio.shield(cached[1])

    def _forget_failed(self, stage: Path, done: asyncio.Future[InputRoot]) -> None:
        """Drop a failed build of ``stage``'s root, so the next module tries afresh."""
        if done.cancelled() or done.exception() is not None:
            cached = self._roots.get(stage)
            if cached is not None and cached[1] is done:
                del self._roots[stage]

    def _build_root(self, form: RemoteForm) -> InputRoot:
        from metrale_orch.remote.merkle import InputFile, build_input_root

        by_path: dict[str, str] = {}  # text, not Path: a Path hashes ten times slower
        files: dict[str, InputFile] = {}
        for rel, xxh in form.files.items():
            path = form.root / rel
            by_path[os.fspath(path)] = xxh
            files[rel] = InputFile(path, executable=os.access(path, os.X_OK))

        def hasher(path: Path) -> Digest:
            xxh = by_path.get(os.fspath(path), "")
            with self._lock:
                found = self._sha.get(xxh) if xxh else None
            if found is not None:
                return found
            digest, now = _digests(path)
            if xxh and now != xxh:  # changed since it was staged: never send other bytes
                raise RemoteUnavailable(f"{path.name} changed since it was staged")
            if xxh:
                with self._lock:
                    self._sha[xxh] = digest
            return digest

        return build_input_root(files, hasher=hasher, memo=self._memo)

    async def _send_root(self, root: InputRoot) -> None:
        """Put the input root's blobs in the CAS once per root: the first module of a
        target asks FindMissingBlobs and sends what is missing; the others wait for it."""
        if root.digest in self._present:
            return
        sending = self._sending.get(root.digest)
        if sending is None:
            sending = asyncio.ensure_future(self._upload(root.blobs))
            self._sending[root.digest] = sending
            sending.add_done_callback(lambda _: self._sending.pop(root.digest, None))
        await asyncio.shield(sending)

    async def _upload(self, blobs: Mapping[Digest, Blob]) -> None:
        """Send those of ``blobs`` not known to be in the CAS this run."""
        unknown = {d: b for d, b in blobs.items() if d not in self._present}
        if not unknown:
            return
        # A module's own blobs (its Command and Action, a few hundred bytes) cost less to
        # send than to ask about: one call, not two; and those of the modules that come
        # while that call is under way go together in the next.
        if sum(d.size for d in unknown) > ASK_ABOVE:
            await self.client.upload(unknown, ask=True)
        else:
            await self._unasked(unknown)
        self._present.update(unknown)

    async def _send_unasked(self, blobs: dict[Digest, Blob]) -> None:
        await self.client.upload(blobs, ask=False)

    async def _fetch(
        self, result: ActionResult, outputs: Mapping[str, Path]
    ) -> tuple[bytes, bytes, dict[Path, bytes]]:
        """The result's stdout and stderr, and the bytes of each of ``outputs`` by its local
        path: every blob they need read in one batch where they fit (verified)."""
        from metrale_orch.remote.wire import from_message

        named = {f.path: from_message(f.digest) for f in result.output_files}
        files: dict[Path, Digest] = {}
        for rel, local in outputs.items():
            digest = named.get(rel)
            if digest is None:  # exit 0 without an output: the engine's fault, not the compile's
                raise RemoteUnavailable(f"bad result: exit 0 but no output {rel!r}")
            files[local] = digest
        std = [
            None if raw or not result.HasField(name) else from_message(getattr(result, name))
            for raw, name in (
                (result.stdout_raw, "stdout_digest"),
                (result.stderr_raw, "stderr_digest"),
            )
        ]
        data = await self.client.download_many(
            [*files.values(), *(d for d in std if d is not None)]
        )
        out, err = (
            bytes(raw) if digest is None else data[digest]
            for raw, digest in zip((result.stdout_raw, result.stderr_raw), std, strict=True)
        )
        return out, err, {local: data[digest] for local, digest in files.items()}


def _digests(path: Path) -> tuple[Digest, str]:
    """The REAPI digest of ``path`` and the xxh3-128 of the same bytes, in one read."""
    sha, xxh, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            xxh.update(chunk)
            size += len(chunk)
    return Digest(sha.hexdigest(), size), xxh.hexdigest()


def _reason(exc: ClientUnavailable) -> str:
    reason = getattr(exc, "reason", "") or str(exc)
    url = getattr(exc, "url", "")
    return f"{reason} ({url})" if url and url not in reason else reason


def _stages(done: object, upload: float) -> dict[str, tuple[float, float]]:
    """The worker's stages as (start, end) wall-clock seconds, where reported."""
    timings = getattr(done, "timings", None)
    if timings is None:
        return {}
    spans = {
        "queued": (timings.queued, timings.worker_start),
        "fetching inputs": (timings.input_fetch_start, timings.input_fetch_completed),
        "executing": (timings.execution_start, timings.execution_completed),
        "uploading outputs": (timings.output_upload_start, timings.output_upload_completed),
    }
    out = {k: (a, b) for k, (a, b) in spans.items() if a and b and b >= a}
    if upload > 0:
        end = time.time() - (timings.wall or 0.0)
        out["uploading inputs"] = (end - upload, end)
    return out


def _rejected(exc: RemoteRejected, timeout: float) -> str:
    """Why the server refused an action: its answer, and when the answer is about the
    action's timeout, the setting that sets it (pure)."""
    if exc.call == "Execute" and "timeout" in exc.detail.lower():
        return (
            f"the server refused the action timeout of {timeout:g} s "
            f"({exc.code}: {exc.detail}); set compile_timeout at or below the server's "
            "maximum execution timeout"
        )
    return str(exc)
