"""What a toolchain's compiler is: its probed identity (I/O).

:func:`probe_toolchain` runs the compiler's version and dry-run probes and
hashes the real binaries they name (see its docstring); only those content
hashes are remembered across processes (``<state_dir>/file-hashes.json``, and the
user's ``~/.cache/metrale-orch-probes/toolchain-hashes.json``).
Within one run a :class:`ProbeMemo` (held by the run's session, passed in)
probes each compiler once, however many threads ask at the same time.
:func:`find_toolchain` locates and probes (what the task cache compares is
:mod:`~metrale_orch.toolchain.stamps`). The identity is part of every action key.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import file_hash, read_json_object, settled_change, text_hash, write_own
from metrale_orch.paths import user_cache_home
from metrale_orch.proc import ProcessError
from metrale_orch.toolchain.argv import keyed_environment, toolchain_environ
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.dryrun import (
    SEARCH_PATH_VARS,
    dryrun_files,
    dryrun_roots,
    run_dryrun,
    run_tool,
    run_witness,
    search_dirs,
)
from metrale_orch.toolchain.earlyruns import EarlyRuns
from metrale_orch.toolchain.errors import ToolchainError, ToolchainMissing
from metrale_orch.toolchain.locate import executable, locate_toolchain
from metrale_orch.toolchain.records import ProbeRecord, RecordStore, dir_states, file_stamps
from metrale_orch.toolchain.records import Stamp as FileStamp

__all__ = [
    "FoundToolchain",
    "Probe",
    "ProbeMemo",
    "find_toolchain",
    "host_compiler",
    "probe_toolchain",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundToolchain:
    """A toolchain whose program was found and probed."""

    toolchain: Toolchain
    program: Path
    identity: str
    #: Toolkit directories (see :class:`Probe`).
    roots: tuple[str, ...] = ()
    #: The host compiler's system include directories (see :class:`Probe`).
    system_dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """What probing a compiler found: its identity and the toolkit directories it reads."""

    #: Human-readable version text plus a digest of everything that decides the output.
    identity: str
    #: Normalised absolute toolkit directories (the dry run's ``TOP`` and include
    #: directories): files the compiler reads below them are recorded relative to them.
    roots: tuple[str, ...] = ()
    #: The host compiler's own include directories (without the user's ``CPATH`` and
    #: friends): files read below them are system headers.
    system_dirs: tuple[str, ...] = ()


class ProbeMemo:
    """The probes of one run, each run once: a caller asking for a probe another thread is
    running waits for that one (thread-safe). A failed probe is not remembered. Its
    :attr:`early` runs are the probes' dry runs started before the package loaded."""

    def __init__(self, early: EarlyRuns | None = None) -> None:
        self.early = EarlyRuns() if early is None else early
        self._lock = threading.Lock()
        self._done: dict[str, Probe] = {}
        self._running: dict[str, threading.Lock] = {}

    def probe(self, key: str, run: Callable[[], Probe]) -> Probe:
        """The probe remembered for ``key``, else ``run()``'s, remembered."""
        with self._lock:
            got = self._done.get(key)
            if got is not None:
                return got
            gate = self._running.setdefault(key, threading.Lock())
        with gate:  # one thread probes; the others wait here, then find its probe
            with self._lock:
                got = self._done.get(key)
            if got is not None:
                return got
            probe = run()
            with self._lock:
                self._done[key] = probe
            return probe


def host_compiler(toolchain: Toolchain, environ: Mapping[str, str]) -> Path | None:
    """The host compiler ``toolchain``'s compiler would run with ``environ`` (its
    ``host_compiler_env`` first, then ``host_compiler`` on ``PATH``), or None (I/O)."""
    name = (environ.get(toolchain.host_compiler_env) if toolchain.host_compiler_env else None) or (
        toolchain.host_compiler
    )
    if not name:
        return None
    if os.sep in name:
        path = Path(name)
        if path.is_dir():  # nvcc's -ccbin / NVCC_CCBIN may name the compiler's directory
            path = path / (toolchain.host_compiler or "gcc")
        return path if executable(path) else None
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    return Path(found) if found else None


def _version_text(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines()]
    kept = [ln for ln in lines if ln and "copyright" not in ln.lower()]
    return "; ".join(kept)


def probe_toolchain(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    arch: str = "",
    memo: ProbeMemo | None = None,
) -> Probe:
    """Probe what really runs when ``program`` is called (once per ``memo``; every call
    without one probes).

    A wrapper script, a shim reading a version file or an environment variable,
    or an ``update-alternatives`` link can switch the real compiler without any
    change a ``stat`` of ``program`` would see, so every probe runs the dry runs
    (the compiler's and the host compiler's), which show such a switch. Across
    processes (with a ``state_dir``) only two things are remembered: the content
    hashes of the real binaries (by their ``stat``, in
    ``<state_dir>/file-hashes.json`` and the user's ``toolchain-hashes.json``), and a
    record of the last full probe
    (:mod:`~metrale_orch.toolchain.records`): while both dry runs print what they
    printed then and every file the probe read keeps its settled stat (and each
    host search directory is as present or absent as it was), the record's identity
    stands and the version runs are not repeated. The identity covers:

    - the version output (``version_args``);
    - the dry run (``dryrun_args``, e.g. ``nvcc --dryrun``, or a clang driver's
      ``-###`` for SCALE, hipcc and metal; ``{arch}`` tokens are dropped when no
      ``arch`` is given): every command and flag the compiler would run, a
      wrapper's additions included, with temporary names and the probe directory
      normalised;
    - the content of the programs it names (the real ``nvcc``, ``cicc``,
      ``ptxas``, libdevice ...) and of ``program`` itself;
    - the host compiler: its version output, its own dry run
      (``host_compiler_probe_args``, e.g. ``gcc -###``, which shows the defines a
      wrapper adds and the real ``cc1plus``) and the content of both;
    - the environment variables the compilers read (:func:`keyed_environment`).

    Every probe runs in :func:`toolchain_environ` (the toolchain's ``env_set`` over
    ``environ``). Raises :class:`ToolchainMissing` when the host compiler is absent
    and :class:`ToolchainError` when a probe fails.
    """
    environ = toolchain_environ(toolchain, environ)
    host = None
    if toolchain.host_compiler or toolchain.host_compiler_env:
        host = host_compiler(toolchain, environ)
        if host is None:
            name = (
                environ.get(toolchain.host_compiler_env, "") if toolchain.host_compiler_env else ""
            ) or toolchain.host_compiler
            raise ToolchainMissing(
                toolchain.name,
                toolchain.program,
                f"a host C++ compiler ({name}) on PATH",
                detail=f"its host compiler `{name}` was not found",
            )
    env = keyed_environment(toolchain, environ)
    # Only a probe that names the arch differs per arch (nvcc's does not: one probe).
    if not any("{arch}" in a for a in (toolchain.program, *toolchain.dryrun_args)):
        arch = ""
    memo_key = json.dumps(
        [
            toolchain.to_dict(),
            str(program),
            None if host is None else str(host),
            env,
            environ.get("PATH", ""),
            arch,
        ],
        sort_keys=True,
    )

    def run() -> Probe:
        hashes = (
            _FileHashes(None)
            if state_dir is None
            else _FileHashes(Path(state_dir) / _FILE_HASHES, _shared_hashes(environ))
        )
        store = None if state_dir is None else RecordStore(Path(state_dir), memo_key)
        try:
            early = None if memo is None else memo.early
            subject = _Subject(
                toolchain=toolchain,
                program=program,
                host=host,
                environ=environ,
                env=env,
                hashes=hashes,
                arch=arch,
            )
            return _run_probe(subject, store, early)
        finally:
            hashes.save()

    return run() if memo is None else memo.probe(memo_key, run)


_FILE_HASHES = "file-hashes.json"
_FILE_HASHES_MAX = 256
#: The user's copy, under the user's cache directory (every build directory reads it;
#: not in the artefact cache, which holds artefacts only).
_SHARED_HASHES = ("metrale-orch-probes", "toolchain-hashes.json")


def _shared_hashes(environ: Mapping[str, str]) -> Path | None:
    """The user's file of toolkit hashes, or None (no ``XDG_CACHE_HOME`` nor ``HOME``)."""
    home = user_cache_home(environ)
    return None if home is None else home.joinpath(*_SHARED_HASHES)


class _FileHashes:
    """Content hashes of the compilers' binaries, remembered by (size, mtime, ctime, inode)
    of the real path: the one part of a probe worth keeping across processes (tens of
    MB to read). ctime cannot be set back by a user, so a replaced file is re-read.

    Kept in the build's state directory and, with ``shared``, in the user's file too
    (the device joins the stamp there), so a new build directory (a fresh clone,
    ``rm -rf build``) does not read the toolkit again: the same stamp rule, another
    place."""

    def __init__(self, path: Path | None, shared: Path | None = None) -> None:
        self.path = path
        self.shared = shared
        self.known = _read_hashes(path)
        self.used: dict[str, list[int | str]] = {}
        self.dirty = False
        self.shared_known = _read_hashes(shared)
        self.shared_new: dict[str, list[int | str]] = {}

    def digest(self, path: str) -> str | None:
        """xxh3-128 of the file at ``path`` (links followed), or None when it is not a file.
        A hash is remembered only for a settled stamp (its ctime older than the racy
        window when the file was read): a binary rewritten within one timestamp tick of
        being read keeps its stamp, so it is read again until then."""
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp: list[int | str] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = self.known.get(real)
        if known is not None and len(known) == 5 and known[:4] == stamp:
            self.used[real] = known
            return str(known[4])
        shared_stamp: list[int | str] = [st.st_dev, *stamp]
        mine = self.shared_known.get(real)
        if mine is not None and len(mine) == 6 and mine[:5] == shared_stamp:
            digest = str(mine[5])
            self.shared_new[real] = mine  # used: kept among the newest
        else:
            taken = time.time_ns()
            try:
                digest = file_hash(real)
            except OSError:
                return None
            if settled_change(st, taken) == 0:
                return digest  # too fresh to be known by its stamp: not remembered
            self.shared_new[real] = [*shared_stamp, digest]
        self.known[real] = self.used[real] = [*stamp, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        # Only a speed-up: a read-only build dir costs one hashing pass per process.
        if self.path is not None and self.dirty:
            _write_hashes(self.path, self.known, self.used)
        if self.shared is not None and self.shared_new:
            # Read again: other builds of this user may have written theirs meanwhile.
            # The entries used last come last and the oldest go first when it is full.
            current = _read_hashes(self.shared)
            for real in self.shared_new:
                current.pop(real, None)
            current.update(self.shared_new)
            kept = list(current.items())[-_FILE_HASHES_MAX:]
            with contextlib.suppress(OSError):
                write_own(self.shared, json.dumps(dict(kept), indent=1).encode())


def _read_hashes(path: Path | None) -> dict[str, list[int | str]]:
    data = {} if path is None else read_json_object(path)
    return {k: v for k, v in data.items() if isinstance(v, list)}


def _write_hashes(
    path: Path, known: Mapping[str, list[int | str]], used: Mapping[str, list[int | str]]
) -> None:
    """Write ``known``, at most :data:`_FILE_HASHES_MAX` of them, ``used`` first."""
    others = sorted(k for k in known if k not in used)
    room = max(0, _FILE_HASHES_MAX - len(used))
    keep = {k: known[k] for k in others[:room]}
    keep.update(used)
    with contextlib.suppress(OSError):
        write_own(path, json.dumps(dict(sorted(keep.items())), indent=1).encode())


#: The probe commands that show what really runs (see :mod:`.records`): a run with a
#: record runs only these, and the rest when the record does not hold.
_WITNESSES = frozenset({"dryrun", "host_dryrun"})
_OTHERS = frozenset({"version", "host_version", "host_search"})


def _start_runs(
    pool: ThreadPoolExecutor,
    toolchain: Toolchain,
    program: Path,
    host: Path | None,
    environ: Mapping[str, str],
    arch: str,
    early: EarlyRuns | None,
    names: frozenset[str] | None = None,
) -> dict[str, Future[Any]]:
    """Start every command a probe runs at once (they are independent): a probe takes
    as long as its slowest command, not their sum. Results by name; absent: not run.
    ``names``: only those commands (None: all); ``early``: the runs started early, which
    the dry runs take when one is exactly theirs."""
    calls: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "version": (run_tool, ([str(program), *toolchain.version_args], environ))
    }
    if toolchain.dryrun_args:
        calls["dryrun"] = (run_dryrun, (toolchain, program, environ, arch, early))
    if host is not None:
        argv = [str(host), *toolchain.host_compiler_version_args]
        calls["host_version"] = (run_tool, (argv, environ))
        if toolchain.host_compiler_probe_args:
            argv = [str(host), *toolchain.host_compiler_probe_args]
            calls["host_dryrun"] = (run_witness, (argv, environ, early))
        if toolchain.host_compiler_search_args:
            # The user's search-path variables would show up as "system" directories.
            plain = {k: v for k, v in environ.items() if k not in SEARCH_PATH_VARS}
            argv = [str(host), *toolchain.host_compiler_search_args]
            calls["host_search"] = (run_tool, (argv, plain))
    return {
        name: pool.submit(call, *args)
        for name, (call, args) in calls.items()
        if names is None or name in names
    }


def _recordable(toolchain: Toolchain, host: Path | None) -> bool:
    """Whether dry runs show what really runs: the compiler's, and the host compiler's
    when there is one (otherwise every run probes in full)."""
    host_shown = host is None or bool(toolchain.host_compiler_probe_args)
    return bool(toolchain.dryrun_args) and host_shown


def _probed_files(
    program: Path, host: Path | None, environ: Mapping[str, str], runs: Mapping[str, Future[Any]]
) -> list[str]:
    """The files the probe's dry runs lead to (their results must be in ``runs``): the
    program, what its dry run runs and reads, the host compiler and what its dry run runs."""
    files = [str(program)]
    if "dryrun" in runs:
        _text, variables, commands = runs["dryrun"].result()
        search = variables.get("PATH") or environ.get("PATH", os.defpath)
        files.extend(dryrun_files(variables, commands, search))
    if host is not None:
        files.append(str(host))
        if "host_dryrun" in runs:
            for line in runs["host_dryrun"].result().splitlines():
                # gcc -### prints each command it would run indented by one space.
                if line.startswith(" ") and line.strip():
                    first = line.split()[0].strip('"')
                    if os.path.isabs(first):
                        files.append(first)
    return files


def _witness(runs: Mapping[str, Future[Any]]) -> dict[str, str]:
    """The dry runs' text (their results must be in ``runs``)."""
    seen: dict[str, str] = {}
    if "dryrun" in runs:
        seen["dryrun"] = runs["dryrun"].result()[0]
    if "host_dryrun" in runs:
        seen["host_dryrun"] = runs["host_dryrun"].result()
    return seen


@dataclass(frozen=True, slots=True, kw_only=True)
class _Subject:
    """What one probe is of: the toolchain, its located program and host compiler, the
    caller's environment and the one the commands run in, the file hasher, the arch."""

    toolchain: Toolchain
    program: Path
    host: Path | None
    environ: Mapping[str, str]
    env: Mapping[str, str]
    hashes: _FileHashes
    arch: str


def _run_probe(subject: _Subject, store: RecordStore | None, early: EarlyRuns | None) -> Probe:
    """Probe in full, or only the dry runs when ``store``'s record still holds for them
    (:mod:`~metrale_orch.toolchain.records`)."""
    toolchain, program, host, environ, arch = (
        subject.toolchain,
        subject.program,
        subject.host,
        subject.environ,
        subject.arch,
    )
    if store is not None and not _recordable(toolchain, host):
        store = None
    record = None if store is None else store.load()
    with ThreadPoolExecutor(max_workers=5, thread_name_prefix="metrale-probe-run") as pool:
        if record is None:
            runs = _start_runs(pool, toolchain, program, host, environ, arch, early)
        else:
            runs = _start_runs(pool, toolchain, program, host, environ, arch, early, _WITNESSES)
            try:
                seen = file_stamps(_probed_files(program, host, environ, runs))
                if record.holds(_witness(runs), seen):
                    return Probe(
                        identity=record.identity,
                        roots=record.roots,
                        system_dirs=record.system_dirs,
                    )
            except ProcessError:
                pass  # the full probe below reports the failure where it belongs
            rest = _start_runs(pool, toolchain, program, host, environ, arch, early, _OTHERS)
            runs.update(rest)
    # Stamped before the full probe hashes the files: a file changed after its stamp
    # is seen by the next run's stamp, never recorded with this run's identity.
    stamps: list[FileStamp] | None = None
    if store is not None:
        with contextlib.suppress(ProcessError):  # the full probe reports it
            stamps = file_stamps(_probed_files(program, host, environ, runs))
    probe, listed = _full_probe(subject, runs)
    if store is not None and stamps is not None:
        search = runs["host_search"].result() if "host_search" in runs else ""
        store.save(
            ProbeRecord(
                witness=_witness(runs),
                files=stamps,
                dirs=dir_states(search, listed),
                identity=probe.identity,
                roots=probe.roots,
                system_dirs=probe.system_dirs,
            )
        )
    return probe


def _full_probe(
    subject: _Subject, runs: Mapping[str, Future[Any]]
) -> tuple[Probe, tuple[str, ...]]:
    """The probe from every command's result in ``runs``, and the host's search list."""
    toolchain, host, arch = subject.toolchain, subject.host, subject.arch
    doc: dict[str, object] = {"toolchain": toolchain.name, "env": dict(subject.env)}
    roots: tuple[str, ...] = ()
    system: tuple[str, ...] = ()
    # Read in the order the commands used to run, so the same failure is the one reported.
    try:
        version = _version_text(runs["version"].result())
        doc["version"] = version
        if "dryrun" in runs:
            try:
                text, variables, commands = runs["dryrun"].result()
            except ProcessError as exc:
                raise ToolchainError(
                    f"toolchain {toolchain.name!r}",
                    "dryrun_args",
                    f"the dry-run probe failed: {exc}; {_dryrun_hint(toolchain, arch, exc)}",
                ) from None
            doc["dryrun"] = text
            roots = dryrun_roots(variables, commands)
        human = version
        if host is not None:
            host_version = runs["host_version"].result()
            lines = host_version.strip().splitlines()
            human += " | host: " + (lines[0].strip() if lines else host.name)
            doc["host_version"] = host_version.strip()
            if "host_dryrun" in runs:
                doc["host_dryrun"] = runs["host_dryrun"].result()
            if "host_search" in runs:
                system = search_dirs(runs["host_search"].result())
                doc["host_search"] = list(system)
        files = _probed_files(subject.program, host, subject.environ, runs)
    except ProcessError as exc:
        raise ToolchainError(
            f"toolchain {toolchain.name!r}", "version_args", f"the version probe failed: {exc}"
        ) from None
    if not version.strip():
        raise ToolchainError(
            f"toolchain {toolchain.name!r}", "version_args", "the version probe printed nothing"
        )
    # Content, not path: the same toolkit installed elsewhere has the same identity.
    doc["files"] = sorted({d for d in (subject.hashes.digest(f) for f in files) if d is not None})
    digest = text_hash(canonical_json(doc))
    return Probe(identity=f"{human} | {digest}", roots=roots, system_dirs=system), system


def _dryrun_hint(toolchain: Toolchain, arch: str, failure: ProcessError) -> str:
    """What to do about a failed dry run, by its cause: an arch the compiler does not know
    (an error line of its output names the arch), else a compiler without this dry run."""
    lines = failure.output.splitlines()
    if arch and any("error" in ln.lower() and arch in ln for ln in lines):
        return (
            f"the compiler rejects the arch {arch} ([hardware] arch): install a "
            f"{toolchain.program} that supports {arch}"
        )
    return (
        f"if this compiler has no dry run, set dryrun_args = [] in a "
        f'toolchains/{toolchain.name}.toml that extends "{toolchain.name}"'
    )


class ProbeFunction(Protocol):
    """How :func:`find_toolchain` probes the program it located."""

    def __call__(
        self,
        toolchain: Toolchain,
        program: Path,
        environ: Mapping[str, str],
        *,
        arch: str,
        state_dir: Path | None = ...,
        memo: ProbeMemo | None = ...,
    ) -> Probe: ...


def find_toolchain(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    site_dirs: Iterable[Path] | None = None,
    arch: str = "",
    memo: ProbeMemo | None = None,
    probe: ProbeFunction = probe_toolchain,
) -> FoundToolchain:
    """Find and probe ``toolchain`` (for ``arch``: the hardware's ``[hardware] arch``, which
    picks the compiler of a toolchain whose program lies under ``{root}`` and fills
    ``{arch}`` in its dry run) with ``probe``: :func:`probe_toolchain`, or
    :func:`~metrale_orch.toolchain.archcheck.probe_for_arch` to check the arch first.

    Raises :class:`ToolchainMissing` saying what to install, :class:`ToolchainError`
    for a variable naming an unusable compiler or root, or a failed probe.
    """
    program = locate_toolchain(toolchain, environ, site_dirs=site_dirs, arch=arch)
    probed = probe(toolchain, program, environ, state_dir=state_dir, arch=arch, memo=memo)
    return FoundToolchain(
        toolchain=toolchain,
        program=program,
        identity=probed.identity,
        roots=probed.roots,
        system_dirs=probed.system_dirs,
    )
