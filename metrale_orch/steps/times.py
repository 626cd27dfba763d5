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

import contextlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import write_atomic
from metrale_orch.paths import STATE_DIR

__all__ = [
    "TARGET_TIMES",
    "TIMES",
    "CompileTimes",
    "longest_first",
    "merge_compiles",
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


def read_times(state_dir: Path) -> CompileTimes:
    """The kept times (empty when the file is missing or not this schema's)."""
    doc = _read(Path(state_dir) / TIMES)
    raw = doc.get("modules")
    if not isinstance(raw, dict):
        return CompileTimes()
    modules: dict[str, dict[str, tuple[str, float]]] = {}
    for target, mods in raw.items():
        if not isinstance(mods, dict):
            continue
        for module, entry in mods.items():
            if (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], int | float)
                and not isinstance(entry[1], bool)
            ):
                modules.setdefault(str(target), {})[str(module)] = (entry[0], float(entry[1]))
    return CompileTimes(modules, _read_peaks(doc.get("memory")))


def _read_peaks(raw: object) -> dict[str, dict[str, int]]:
    """The ``"memory"`` table of the file ({} when absent or malformed)."""
    peaks: dict[str, dict[str, int]] = {}
    for target, mods in (raw if isinstance(raw, dict) else {}).items():
        for module, peak in (mods if isinstance(mods, dict) else {}).items():
            if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0:
                peaks.setdefault(str(target), {})[str(module)] = peak
    return peaks


def read_kept_seconds(build_dir: Path) -> dict[str, float]:
    """The kept compile seconds by target under ``<build_dir>/.state``: the
    ``target-times.json`` summary, else the sums of ``compile-times.json``; ``{}`` when
    neither is there or readable. A build the cache served changes neither, so the next
    one still knows every target's time (the ETA of the progress line, CI's rows)."""
    state = Path(build_dir) / STATE_DIR
    return read_target_seconds(state) or read_times(state).target_seconds()


def read_target_seconds(state_dir: Path) -> dict[str, float]:
    """The per-target summary ({} when missing or unreadable): cheap enough for every run."""
    raw = _read(Path(state_dir) / TARGET_TIMES).get("targets")
    if not isinstance(raw, dict):
        return {}
    return {
        str(t): float(s)
        for t, s in raw.items()
        if isinstance(s, int | float) and not isinstance(s, bool)
    }


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


def _read(path: Path) -> dict[str, object]:
    with contextlib.suppress(OSError, ValueError, UnicodeError):
        doc = json.loads(path.read_bytes())
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            return doc
    return {}


def _encode(doc: Mapping[str, object]) -> bytes:
    return (canonical_json(doc) + "\n").encode()
