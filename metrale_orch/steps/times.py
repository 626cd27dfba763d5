"""How long each compile took when it last ran, kept across runs: the longest work first.

ninja orders its edges by its log and Bazel its actions by their history; a build
here reads ``<build_dir>/.state/compile-times.json``: for every target and module
the key and compiler seconds of its last compile. A warm run (all hits) changes
nothing in it, so the next cold build (a toolkit upgrade, a cache wipe) is still
ordered. Two uses:

- the executor starts the waiting compile with the longest expected time first
  (by key, else by the same target and module's last compile: an edit changes
  the key, rarely the time);
- doit starts the targets with the most compile seconds first
  (``target-times.json``, a small summary read on every run), so a tree does not
  end on one long target compiling alone. Targets never built go first (a new
  target in a warm tree is the one with work to do), the larger ones first.

The same file keeps each module's peak memory in bytes where it was measured
(``"memory": {target: {module: bytes}}``, beside ``"modules"``, so a file without it
still reads): the local executor admits a compile only while the predicted peaks of
the running ones fit (:mod:`metrale_orch.executor.memory`).

Only an ordering and an admission: a missing, stale or unreadable file changes no result.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import load_json_object, write_atomic
from metrale_orch.paths import STATE_DIR

__all__ = [
    "TARGET_TIMES",
    "TIMES",
    "CompileTimes",
    "kept_problems",
    "longest_first",
    "merge_compiles",
    "peaks_of",
    "read_kept_seconds",
    "read_target_seconds",
    "read_times",
    "write_target_seconds",
    "write_times",
]

#: The per-module file and the per-target summary, under ``<build_dir>/.state``.
TIMES = "compile-times.json"
TARGET_TIMES = "target-times.json"
SCHEMA = 1

#: The largest kept seconds read (115 days): a sum of thousands stays finite, and a
#: negative, NaN or infinite value is no time at all.
MAX_SECONDS = 1e7
#: The largest kept peak read, in bytes (1 PiB).
MAX_PEAK = 1 << 50
_NOT_SECONDS = f"not a time from 0 to {MAX_SECONDS:g} seconds"


@dataclass(frozen=True, slots=True)
class CompileTimes:
    """``target -> module -> (key, seconds)`` of each module's last compile, and
    ``target -> module -> bytes`` of its peak memory where measured (pure data)."""

    modules: Mapping[str, Mapping[str, tuple[str, float]]] = field(default_factory=dict)
    peaks: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def peak_by_key(self) -> dict[str, int]:
        """Peak bytes by the cache key of each module's kept entry (the largest)."""
        out: dict[str, int] = {}
        for target, mods in self.peaks.items():
            for module, peak in mods.items():
                key = self.modules.get(target, {}).get(module, ("", 0.0))[0]
                out[key] = max(out.get(key, 0), peak)
        out.pop("", None)
        return out

    def peak_by_module(self) -> dict[tuple[str, str], int]:
        """Peak bytes by ``(target, module)``: the prediction of its next compile."""
        return {(t, m): p for t, mods in self.peaks.items() for m, p in mods.items()}

    def by_key(self) -> dict[str, float]:
        """Seconds by cache key (the longest where two targets compiled one key)."""
        out: dict[str, float] = {}
        for mods in self.modules.values():
            for key, seconds in mods.values():
                out[key] = max(out.get(key, 0.0), seconds)
        return out

    def by_module(self) -> dict[tuple[str, str], float]:
        """Seconds by ``(target, module)``: the estimate for a module whose key changed."""
        return {(t, m): s for t, mods in self.modules.items() for m, (_k, s) in mods.items()}

    def target_seconds(self) -> dict[str, float]:
        """Compile seconds of each target: the sum of its modules' last compiles."""
        return {t: round(sum(s for _k, s in mods.values()), 6) for t, mods in self.modules.items()}


def merge_compiles(
    old: CompileTimes,
    compiles: Iterable[tuple[str, str, str, float]],
    *,
    seen: Mapping[str, Collection[str]] | None = None,
    alive: Collection[str] | None = None,
    peaks: Iterable[tuple[str, str, int]] = (),
) -> CompileTimes:
    """``old`` with each ``(target, module, key, seconds)`` of a run's successful compiles
    replacing that module's entry, and each ``(target, module, bytes)`` of ``peaks`` its
    peak (pure). ``seen``: the modules each target of the run has now (others of those
    targets are dropped); ``alive``: every target the tree still has (the others are
    dropped). A module keeps its last measured peak until a new one replaces it."""
    modules = {t: dict(mods) for t, mods in old.modules.items() if alive is None or t in alive}
    for target, names in (seen or {}).items():
        if target in modules:
            modules[target] = {m: v for m, v in modules[target].items() if m in names}
    for target, module, key, seconds in compiles:
        modules.setdefault(target, {})[module] = (key, float(seconds))
    memory = {t: dict(mods) for t, mods in old.peaks.items()}
    for target, module, peak in peaks:
        memory.setdefault(target, {})[module] = int(peak)
    kept = {
        t: {m: p for m, p in mods.items() if m in modules.get(t, {})} for t, mods in memory.items()
    }
    return CompileTimes(
        {t: mods for t, mods in modules.items() if mods},
        {t: mods for t, mods in kept.items() if mods},
    )


def peaks_of(
    old: CompileTimes,
    keyed: Iterable[tuple[str, str, str]],
    measured: Mapping[str, int],
    bounds: Mapping[str, int],
) -> list[tuple[str, str, int]]:
    """The peak to keep for each ``(target, module, key)`` of a run (pure): ``measured``
    by key, else the kept one (by key, else the module's) no larger than ``bounds`` by
    key, the most a newer compile whose peak was not known can have used: a one-off huge
    peak does not keep its module serial once a compile shows it smaller. A module with
    neither is left out (its kept peak, if any, stays)."""
    by_key, by_module = old.peak_by_key(), old.peak_by_module()
    out = []
    for target, module, key in keyed:
        peak = measured.get(key) or by_key.get(key) or by_module.get((target, module), 0)
        if key not in measured and key in bounds:
            peak = min(peak, bounds[key])
        if peak > 0:
            out.append((target, module, peak))
    return out


def read_times(state_dir: Path) -> CompileTimes:
    """The kept times (empty when the file is missing, unusable or not this schema's; an
    entry that is not a time or a peak is passed over: :func:`kept_problems` says why)."""
    return _load_times(Path(state_dir) / TIMES)[0]


def read_kept_seconds(build_dir: Path) -> dict[str, float]:
    """The kept compile seconds by target under ``<build_dir>/.state``: the
    ``target-times.json`` summary, else the sums of ``compile-times.json``; ``{}`` when
    neither is there or readable. A build the cache served changes neither, so the next
    one still knows every target's time (the ETA of the progress line, CI's rows)."""
    state = Path(build_dir) / STATE_DIR
    return read_target_seconds(state) or read_times(state).target_seconds()


def read_target_seconds(state_dir: Path) -> dict[str, float]:
    """The per-target summary ({} when missing or unusable; an entry that is not a time
    is passed over): cheap enough for every run."""
    return _load_targets(Path(state_dir) / TARGET_TIMES)[0]


def kept_problems(state_dir: Path) -> tuple[str, ...]:
    """One line for each kept file under ``state_dir`` that is there but was ignored in
    whole or in part, naming the file and why (I/O; a missing file is no problem)."""
    state = Path(state_dir)
    found = (_load_times(state / TIMES)[1], _load_targets(state / TARGET_TIMES)[1])
    return tuple(problem for problem in found if problem)


def _load_times(path: Path) -> tuple[CompileTimes, str]:
    """The times in ``path`` and what of it was ignored ("" when nothing)."""
    doc, problem = _read(path)
    raw = doc.get("modules", {})
    modules: dict[str, dict[str, tuple[str, float]]] = {}
    bad = 0
    for target, mods in (raw if isinstance(raw, dict) else {}).items():
        for module, entry in (mods if isinstance(mods, dict) else {}).items():
            ok = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
            seconds = _seconds(entry[1]) if ok else None
            if seconds is None:
                bad += 1
            else:
                modules.setdefault(str(target), {})[str(module)] = (entry[0], seconds)
    peaks, bad_peaks = _read_peaks(doc.get("memory"))
    what = f"{_NOT_SECONDS} or a peak from 1 byte to 1 PiB"
    return CompileTimes(modules, peaks), problem or _entries_ignored(path, bad + bad_peaks, what)


def _load_targets(path: Path) -> tuple[dict[str, float], str]:
    """The per-target seconds in ``path`` and what of it was ignored ("" when nothing)."""
    doc, problem = _read(path)
    raw = doc.get("targets", {})
    found = {str(t): _seconds(s) for t, s in (raw if isinstance(raw, dict) else {}).items()}
    seconds = {t: s for t, s in found.items() if s is not None}
    return seconds, problem or _entries_ignored(path, len(found) - len(seconds), _NOT_SECONDS)


def _read_peaks(raw: object) -> tuple[dict[str, dict[str, int]], int]:
    """The ``"memory"`` table of the file ({} when absent or malformed), and how many of
    its entries are not a peak."""
    peaks: dict[str, dict[str, int]] = {}
    bad = 0
    for target, mods in (raw if isinstance(raw, dict) else {}).items():
        for module, peak in (mods if isinstance(mods, dict) else {}).items():
            if isinstance(peak, int) and not isinstance(peak, bool) and 0 < peak <= MAX_PEAK:
                peaks.setdefault(str(target), {})[str(module)] = peak
            else:
                bad += 1
    return peaks, bad


def _seconds(value: object) -> float | None:
    """``value`` as kept seconds, None when it is not a number from 0 to
    :data:`MAX_SECONDS` (NaN, infinite, negative, huge, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # NaN fails both comparisons; an integer too large for a float is compared exactly.
    return float(value) if 0 <= value <= MAX_SECONDS else None


def _entries_ignored(path: Path, count: int, what: str) -> str:
    """The problem of ``count`` entries of ``path`` that are ``what`` ("" for none)."""
    return f"{path}: {count} entr{'y' if count == 1 else 'ies'} ignored: {what}" if count else ""


def write_times(state_dir: Path, times: CompileTimes) -> None:
    """Write both files, sorted (raises ``OSError``)."""
    state = Path(state_dir)
    modules = {
        t: {m: [k, round(s, 6)] for m, (k, s) in sorted(mods.items())}
        for t, mods in sorted(times.modules.items())
    }
    doc: dict[str, object] = {"schema": SCHEMA, "modules": modules}
    if times.peaks:
        doc["memory"] = {t: dict(sorted(m.items())) for t, m in sorted(times.peaks.items())}
    write_atomic(state / TIMES, _encode(doc))
    write_target_seconds(state, times.target_seconds())


def write_target_seconds(state_dir: Path, seconds: Mapping[str, float]) -> None:
    """Write the per-target summary alone, sorted (raises ``OSError``): what CI keeps
    between runs to balance its build rows (``metrale-orch matrix --keep-times``)."""
    targets = dict(sorted(seconds.items()))
    write_atomic(Path(state_dir) / TARGET_TIMES, _encode({"schema": SCHEMA, "targets": targets}))


def longest_first(
    names: Sequence[str], seconds: Mapping[str, float], sizes: Mapping[str, int]
) -> list[str]:
    """``names`` in the order to start them (pure): never-built ones first, larger
    ``sizes`` first; then by last compile seconds, longest first; ties by name."""

    def order(name: str) -> tuple[int, float, str]:
        known = seconds.get(name)
        if known is None:
            return (0, -float(sizes.get(name, 0)), name)
        return (1, -known, name)

    return sorted(names, key=order)


def _read(path: Path) -> tuple[dict[str, object], str]:
    """The document in ``path`` when it is a regular file holding a JSON object of this
    schema, and why it was ignored otherwise ("" when it is missing or of another
    schema: an older or newer version's file is no problem). Whoever owns it: the file
    decides no byte, and what it holds is checked (:func:`_seconds`)."""
    try:
        doc = load_json_object(path, own=False)
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return {}, f"{path}: ignored: {reason}"
    return (doc, "") if doc.get("schema") == SCHEMA else ({}, "")


def _encode(doc: Mapping[str, object]) -> bytes:
    return (canonical_json(doc) + "\n").encode()
