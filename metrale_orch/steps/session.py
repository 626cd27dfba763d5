"""One build run's shared state, passed to every target's build (no module-level state).

A :class:`BuildSession` holds what the targets of one run share: the executor
that runs their compile actions (``jobs`` at a time), the artefacts already
obtained (so two targets sharing a key compile it once), the toolchain
identities probed, the hashes of files outside the stage, the temporary
directories already swept, the last build's compile times (longest work
first) and the live counters a progress line reads. The doit integration
makes one per process; a caller of
:func:`~metrale_orch.steps.target.build_target` without one gets a private one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from metrale_orch.executor import Executor, LocalExecutor
from metrale_orch.paths import STATE_DIR
from metrale_orch.steps.deps import FileHasher
from metrale_orch.steps.memo import ArtefactMemo
from metrale_orch.toolchain.probe import ProbeMemo

__all__ = ["SLOTS_DIR", "BuildSession", "Progress", "local_executor"]

#: Fewest module pipelines in flight at once in one session (see ``__init__``).
PIPELINES = 32
#: The machine-wide compile slots (``<build_dir>/.state/jobs/slot-N``).
SLOTS_DIR = "jobs"


@dataclass(slots=True)
class Progress:
    """Live module counts of a run, updated by the build threads (read under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    total: int = 0
    done: int = 0
    hits: int = 0
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
            else:
                self.hits += 1


def local_executor(jobs: int, build_dir: Path) -> LocalExecutor:
    """This machine's executor: ``jobs`` compiles at once across every process of the
    build (slot files under ``<build_dir>/.state/jobs/``)."""
    return LocalExecutor(jobs, slot_dir=Path(build_dir) / STATE_DIR / SLOTS_DIR)


class BuildSession:
    """See the module docstring. Thread-safe; one per process (or per caller)."""

    def __init__(
        self,
        executor: Executor,
        *,
        expected: Mapping[str, float] | None = None,
        by_module: Mapping[tuple[str, str], float] | None = None,
        remote: bool = False,
        container_image: str = "",
        probes: ProbeMemo | None = None,
    ) -> None:
        self.executor = executor
        #: The toolchain identities probed in this run (shared with task generation).
        self.probes = ProbeMemo() if probes is None else probes
        #: Whether the executor can send compiles elsewhere (then each action carries
        #: its remote form), and the container image remote workers run them in.
        self.remote = remote
        self.container_image = container_image
        self.memo = ArtefactMemo()
        self.hasher = FileHasher()
        self.progress = Progress()
        #: Compile seconds of each key when it last compiled, for ordering; of each
        #: ``(target, module)`` for a module whose key changed since (``steps.times``).
        self.expected: Mapping[str, float] = MappingProxyType(dict(expected or {}))
        self.expected_by_module: Mapping[tuple[str, str], float] = MappingProxyType(
            dict(by_module or {})
        )
        self._swept: set[str] = set()
        self._lock = threading.Lock()
        # Module pipelines (lookup, compile, store) of every target in flight. A pipeline
        # mostly waits: for an executor slot, or for the pipeline of another target that
        # owns the same key. More threads than this only contend for the interpreter
        # (measured: E3 in BENCHMARKS.md, 1024 threads were 2.5x slower than 128).
        self._pool = ThreadPoolExecutor(
            max_workers=max(PIPELINES, 4 * executor.jobs), thread_name_prefix="metrale-module"
        )

    @classmethod
    def local(
        cls,
        *,
        jobs: int,
        build_dir: Path,
        expected: Mapping[str, float] | None = None,
        by_module: Mapping[tuple[str, str], float] | None = None,
        probes: ProbeMemo | None = None,
    ) -> BuildSession:
        """A session running compiles on this machine, ``jobs`` at once across every process
        of the build (slot files under ``build_dir``)."""
        return cls(
            local_executor(jobs, build_dir),
            expected=expected,
            by_module=by_module,
            probes=probes,
        )

    def expected_seconds(self, key: str, target: str, module: str) -> float:
        """How long the compile of ``key`` is expected to take (0.0: unknown)."""
        got = self.expected.get(key)
        if got is None:
            got = self.expected_by_module.get((target, module), 0.0)
        return got

    @property
    def pool(self) -> ThreadPoolExecutor:
        return self._pool

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
        self._pool.shutdown(wait=False, cancel_futures=True)
