"""One build run's shared state, passed to every target's build (no module-level state).

A :class:`BuildSession` holds what the targets of one run share: the executor
that runs their compile actions (``jobs`` at a time), the artefacts already
obtained (so two targets sharing a key compile it once), the toolchain
identities probed, the hashes of files outside the stage, the temporary
directories already swept, the last build's compile times (longest work
first), the live counters a progress line reads, and the run it belongs to
(``run``: every worker process of one doit run names the same, and the cache
entries the run stores carry it, so a target that finds one counts it as shared in
the run, not as a hit). The doit integration makes one per process; a caller of
:func:`~metrale_orch.steps.target.build_target` without one gets a private one.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from metrale_orch.config import default_jobs
from metrale_orch.executor import Executor, LocalExecutor
from metrale_orch.executor.loop import ActionLoop
from metrale_orch.fsutil import SameBytes
from metrale_orch.paths import STATE_DIR
from metrale_orch.steps.deps import FileHasher
from metrale_orch.steps.includes import Includes
from metrale_orch.steps.memo import ArtefactMemo
from metrale_orch.toolchain.probe import ProbeMemo

__all__ = ["SLOTS_DIR", "BuildSession", "Progress", "local_executor"]

T = TypeVar("T")

#: Threads of the session loop's pool: cache lookups and stores (file and network I/O).
LOOP_WORKERS = 8
#: The machine-wide compile slots (``<build_dir>/.state/jobs/slot-N``).
SLOTS_DIR = "jobs"


@dataclass(slots=True)
class Progress:
    """Live module counts of a run, updated by the build threads (read under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    total: int = 0
    done: int = 0
    hits: int = 0
    #: Modules another target of the run obtained (not a hit: no cache served them).
    shared: int = 0
    compiled: int = 0
    failed: int = 0
    #: Expected seconds of the modules not yet done (the last build's times).
    expected_left: float = 0.0

    def snapshot(self) -> dict[str, float]:
        """The counts, read together."""
        with self.lock:
            return {
                "total": self.total,
                "done": self.done,
                "hits": self.hits,
                "shared": self.shared,
                "compiled": self.compiled,
                "failed": self.failed,
                "expected_left": self.expected_left,
            }

    def add(self, modules: int, expected: float) -> None:
        with self.lock:
            self.total += modules
            self.expected_left += expected

    def finished(self, outcome: str, expected: float) -> None:
        with self.lock:
            self.done += 1
            self.expected_left = max(0.0, self.expected_left - expected)
            if outcome == "failed":
                self.failed += 1
            elif outcome == "compiled":
                self.compiled += 1
            elif outcome == "shared":
                self.shared += 1
            else:
                self.hits += 1


def local_executor(jobs: int, build_dir: Path, memory: int = 0) -> LocalExecutor:
    """This machine's executor: ``jobs`` compiles at once across every process of the
    build (slot files under ``<build_dir>/.state/jobs/``), within ``memory`` bytes of
    predicted peaks (0: the memory available now)."""
    return LocalExecutor(jobs, slot_dir=Path(build_dir) / STATE_DIR / SLOTS_DIR, memory=memory)


class BuildSession:
    """See the module docstring. Thread-safe; one per process (or per caller)."""

    def __init__(
        self,
        executor: Executor,
        *,
        expected: Mapping[str, float] | None = None,
        by_module: Mapping[tuple[str, str], float] | None = None,
        peaks: Mapping[tuple[str, str], int] | None = None,
        remote: bool = False,
        container_image: str = "",
        probes: ProbeMemo | None = None,
        run: str = "",
        loop: ActionLoop | None = None,
    ) -> None:
        self.executor = executor
        #: The build run this session serves (a new one when not given): the cache entries
        #: it stores name it, and one found so named was compiled in this run.
        self.run = run or uuid.uuid4().hex
        #: The toolchain identities probed in this run (shared with task generation).
        self.probes = ProbeMemo() if probes is None else probes
        #: Whether the executor can send compiles elsewhere (then each action carries
        #: its remote form), and the container image remote workers run them in.
        self.remote = remote
        self.container_image = container_image
        #: One-line warnings about the session itself, reported with every target it builds
        #: (remote execution configured without its extra: compiling here instead).
        self.warnings: tuple[str, ...] = ()
        self.memo = ArtefactMemo()
        self.hasher = FileHasher()
        #: The files this run staged and installed, by their bytes (links, not copies).
        self.same_bytes = SameBytes()
        #: Content digest -> the include lines of a file with that content (every
        #: target stages the same shared files: each content is parsed once a run).
        self.includes_memo: dict[str, Includes] = {}
        self.progress = Progress()
        #: Compile seconds of each key when it last compiled, for ordering; of each
        #: ``(target, module)`` for a module whose key changed since (``steps.times``).
        self.expected: Mapping[str, float] = MappingProxyType(dict(expected or {}))
        self.expected_by_module: Mapping[tuple[str, str], float] = MappingProxyType(
            dict(by_module or {})
        )
        #: Peak memory in bytes of each ``(target, module)``'s last measured compile.
        self.peaks: Mapping[tuple[str, str], int] = MappingProxyType(dict(peaks or {}))
        self._swept: set[str] = set()
        self._lock = threading.Lock()
        # Planning, staging and keying a target is Python and file work: as many at once
        # as this process has CPUs until the first compile starts, then one at a time.
        # All of doit's target threads preparing together made each take as long as all
        # of them, and the first compile waited for the first to end (E3 in
        # bench/HISTORY.md). With compiles running, two at once prepared no faster (the
        # interpreter runs one thread at a time) and starved the event loop that watches
        # them: each time it gave the interpreter up for a system call, it waited for it
        # behind both (E3 at 64 jobs: 0.77-0.81x with two, 0.84-0.87x with one). Before
        # any compile (a build of cache hits), two overlap their file work (X3's warm
        # rebuild: 0.91-1.01 s with two, 1.11 s with one).
        self._preparing = threading.BoundedSemaphore(default_jobs())
        self._preparing_alone = threading.Lock()
        #: Whether a compile of this session started (here or remotely).
        self.compiled = False
        # Verifying a target's artefacts obtained earlier in the run and installing it
        # feed no compile: one target at a time, so the interpreter stays with the targets
        # being prepared and keyed, whose misses keep the compile slots full (E3: with
        # every target finishing at once, preparation got a thirtieth of it and the slots
        # ran dry between targets).
        self._finishing = threading.BoundedSemaphore(1)
        # Module pipelines (lookup, compile, store) of every target in flight: coroutines
        # of one event loop, which waits for every slot, compiler and remote call in
        # flight; the cache lookups and stores on its small pool (issue 45: a thread per
        # pipeline cost 12-28 ms of CPU per action, rising with the actions in flight).
        self._owns_loop = loop is None
        self._loop = ActionLoop(LOOP_WORKERS) if loop is None else loop

    @classmethod
    def local(
        cls,
        *,
        jobs: int,
        build_dir: Path,
        expected: Mapping[str, float] | None = None,
        by_module: Mapping[tuple[str, str], float] | None = None,
        peaks: Mapping[tuple[str, str], int] | None = None,
        memory: int = 0,
        probes: ProbeMemo | None = None,
        run: str = "",
        loop: ActionLoop | None = None,
    ) -> BuildSession:
        """A session running compiles on this machine, ``jobs`` at once across every process
        of the build (slot files under ``build_dir``), within ``memory`` bytes."""
        return cls(
            local_executor(jobs, build_dir, memory),
            expected=expected,
            by_module=by_module,
            peaks=peaks,
            probes=probes,
            run=run,
            loop=loop,
        )

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """Hold one of the session's preparation slots (planning, staging and keying a
        target): one per CPU until a compile started, then one in all."""
        with self._preparing:
            if not self.compiled:
                yield
                return
            with self._preparing_alone:
                yield

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Hold the session's finishing slot (verifying artefacts obtained earlier, installing)."""
        with self._finishing:
            yield

    def expected_seconds(self, key: str, target: str, module: str) -> float:
        """How long the compile of ``key`` is expected to take (0.0: unknown)."""
        got = self.expected.get(key)
        if got is None:
            got = self.expected_by_module.get((target, module), 0.0)
        return got

    @property
    def loop(self) -> ActionLoop:
        """The event loop the session's module pipelines run on."""
        return self._loop

    def submit(self, pipeline: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a module pipeline on the session's loop, in the caller's context; its
        outcome on the future. Two pipelines of one key take turns (the memo's claim):
        the second finds the first one's artefact."""
        return self._loop.submit(pipeline)

    def first_sweep(self, directory: str) -> bool:
        """True the first time ``directory`` is asked about in this session."""
        with self._lock:
            if directory in self._swept:
                return False
            self._swept.add(directory)
            return True

    def stop(self) -> None:
        """Stop every compile in flight and refuse the rest (Ctrl-C, SIGTERM)."""
        self.executor.stop()

    def close(self) -> None:
        """Close the session's loop, unless it was lent (a run's, a watch's)."""
        if self._owns_loop:
            self._loop.close()
