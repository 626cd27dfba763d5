"""The committed resource baseline, ``kernels.lock``: its text form, and a build checked
against it.

Everything here is pure but :func:`read_lock` and :func:`write_lock`. The lock holds,
per target, arch and kernel, what ``metrale-orch resources`` reports (registers, static
shared memory, stack frame, spill stores and loads) in a TOML file a reviewer reads in
a diff: one table per target and arch, one line per kernel, everything sorted, so the
same build always writes the same bytes::

    schema = 1

    ["hopper/qwen3-8b/bf16".sm_90a]
    rmsnorm_bf16 = { regs = 16, smem = 128, stack = 0, spill_stores = 0, spill_loads = 0 }

A kernel without ``spill_stores``/``spill_loads`` has unknown spills (a cubin keeps no
spill counts). A kernel that two modules of one target export (a duplicate the coverage
check names) is locked at the larger of each number, so the lock stays one line per key.

:func:`check_lock` compares a :class:`~metrale_orch.resources.report.ResourceReport`
with a lock: a new spill, more spill bytes, a new stack frame, registers grown past the
allowed growth, a kernel the lock lacks, a locked target not built or unreadable: one
:class:`LockProblem` each. Anything else that differs (fewer registers, a kernel gone)
is counted as drift: allowed, but the lock is stale.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.fsutil import write_atomic
from metrale_orch.resources.errors import LockFileError
from metrale_orch.resources.report import KernelResources, ResourceReport

__all__ = [
    "LOCK_NAME",
    "LOCK_SCHEMA",
    "LockCheck",
    "LockIssue",
    "LockProblem",
    "LockedTarget",
    "ResourceLock",
    "check_lock",
    "decode_lock",
    "encode_lock",
    "lock_from_report",
    "read_lock",
    "update_lock",
    "write_lock",
]

#: The lock's file name, at the project root.
LOCK_NAME = "kernels.lock"
#: Version of the lock's layout; a reader refuses any other.
LOCK_SCHEMA = 1

#: What :func:`check_lock` finds wrong (``not-built`` and ``error`` concern a whole target).
LockIssue = Literal[
    "new-spill", "more-spill", "new-stack", "register-growth", "missing", "not-built", "error"
]

_HEADER = """\
# kernels.lock: registers (regs), static shared memory (smem, bytes per block), stack frame
# and spill bytes (per thread) of every kernel, per target and arch. Written by
# `metrale-orch resources --lock`; `metrale-orch resources --check` compares a build with
# it. A kernel without spill_stores/spill_loads has unknown spills (cubins keep none).
"""
#: (key in the file, field of KernelResources, whether the key may be left out).
_FIELDS = (
    ("regs", "registers", False),
    ("smem", "shared_bytes", False),
    ("stack", "stack_bytes", False),
    ("spill_stores", "spill_store_bytes", True),
    ("spill_loads", "spill_load_bytes", True),
)
_FIELD_KEYS = frozenset(f for f, _, _ in _FIELDS)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TARGET = re.compile(r"[^/]+/[^/]+/[^/]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class LockedTarget:
    """The locked kernels of one target, sorted by kernel and arch."""

    target: str
    kernels: tuple[KernelResources, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceLock:
    """A whole lock: targets sorted by name, none without kernels."""

    targets: tuple[LockedTarget, ...] = ()

    def kernels_of(self, target: str) -> tuple[KernelResources, ...]:
        """The locked kernels of ``target`` (none when it is not locked)."""
        for locked in self.targets:
            if locked.target == target:
                return locked.kernels
        return ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LockProblem:
    """One thing of a build that the lock does not allow. ``kernel`` and ``arch`` are ""
    for a problem of the whole target (``not-built``, ``error``: then ``detail`` says
    what); ``locked``/``now`` are the kernel's two sides, None where it has none."""

    target: str
    kernel: str
    arch: str
    issue: LockIssue
    locked: KernelResources | None = None
    now: KernelResources | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {
            "target": self.target,
            "kernel": self.kernel,
            "arch": self.arch,
            "issue": self.issue,
            "locked": None if self.locked is None else self.locked.to_dict(),
            "now": None if self.now is None else self.now.to_dict(),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LockCheck:
    """What :func:`check_lock` found: the problems (sorted by target, kernel, arch,
    issue), the kernels of the build compared and their targets, and ``drift``: kernels
    that differ from the lock within what it allows (fewer registers, gone, ...)."""

    problems: tuple[LockProblem, ...]
    kernels: int
    targets: int
    drift: int
    max_register_growth: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view."""
        return {
            "problems": [p.to_dict() for p in self.problems],
            "kernels": self.kernels,
            "targets": self.targets,
            "drift": self.drift,
            "max_register_growth": self.max_register_growth,
        }


# ---------------------------------------------------------------------- making a lock


def lock_from_report(report: ResourceReport) -> ResourceLock:
    """The lock of the targets ``report`` read (status ``ok``) that have kernels."""
    return ResourceLock(
        targets=tuple(
            LockedTarget(target=t.target, kernels=_merged(t.kernels))
            for t in sorted(report.targets, key=lambda t: t.target)
            if t.status == "ok" and t.kernels
        )
    )


def update_lock(old: ResourceLock, report: ResourceReport) -> ResourceLock:
    """``old`` with the entries of every target ``report`` read replaced by what it read;
    targets the report did not read (not selected, not built) keep their entries."""
    fresh = lock_from_report(report)
    replaced = {t.target for t in report.targets if t.status in ("ok", "no-report")}
    kept = [t for t in old.targets if t.target not in replaced]
    return ResourceLock(targets=tuple(sorted((*kept, *fresh.targets), key=lambda t: t.target)))


def _merged(kernels: Iterable[KernelResources]) -> tuple[KernelResources, ...]:
    """One entry per (kernel, arch), sorted; a key seen twice keeps the larger of each
    number (an unknown spill count stays unknown only when both are)."""
    out: dict[tuple[str, str], KernelResources] = {}
    for k in kernels:
        was = out.get((k.kernel, k.arch))
        out[(k.kernel, k.arch)] = k if was is None else _larger(was, k)
    return tuple(out[key] for key in sorted(out))


def _larger(a: KernelResources, b: KernelResources) -> KernelResources:
    def most(x: int | None, y: int | None) -> int | None:
        return y if x is None else x if y is None else max(x, y)

    return KernelResources(
        kernel=a.kernel,
        arch=a.arch,
        registers=max(a.registers, b.registers),
        shared_bytes=max(a.shared_bytes, b.shared_bytes),
        stack_bytes=max(a.stack_bytes, b.stack_bytes),
        spill_store_bytes=most(a.spill_store_bytes, b.spill_store_bytes),
        spill_load_bytes=most(a.spill_load_bytes, b.spill_load_bytes),
    )


# --------------------------------------------------------------------- the text form


def encode_lock(lock: ResourceLock) -> str:
    """The lock's file text (pure; :func:`decode_lock` reads it back)."""
    parts = [_HEADER, f"\nschema = {LOCK_SCHEMA}\n"]
    for locked in lock.targets:
        archs = sorted({k.arch for k in locked.kernels})
        for arch in archs:
            parts.append(f"\n[{_key(locked.target)}.{_key(arch)}]\n")
            for k in sorted((k for k in locked.kernels if k.arch == arch), key=_by_name):
                values = ", ".join(
                    f"{name} = {getattr(k, attr)}"
                    for name, attr, _ in _FIELDS
                    if getattr(k, attr) is not None
                )
                parts.append(f"{_key(k.kernel)} = {{ {values} }}\n")
    return "".join(parts)


def decode_lock(text: str, shown: str) -> ResourceLock:
    """Read :func:`encode_lock`'s text (pure). Raises :class:`LockFileError` naming
    ``shown`` and the line (bad TOML) or the key at fault."""
    try:
        doc = _canonical_doc(text)
        if doc is None:
            doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockFileError(
            shown,
            f"not valid TOML: {exc}; fix it, or delete it and write it anew with "
            "`metrale-orch resources --lock`",
        ) from None
    schema = doc.pop("schema", None)
    if schema != LOCK_SCHEMA:
        found = "no schema key" if schema is None else f"schema {schema!r}"
        raise LockFileError(shown, f"{found}; this metrale-orch reads schema = {LOCK_SCHEMA}")
    targets = []
    for target, archs in sorted(doc.items()):
        if not _TARGET.fullmatch(target) or not isinstance(archs, dict):
            raise LockFileError(
                shown, f"{_key(target)}: expected a table named by a target (hw/model/quant)"
            )
        kernels = [
            _decode_kernel(where, arch, name, value, shown)
            for arch, table in sorted(archs.items())
            for where in (f"{_key(target)}.{_key(arch)}",)
            for name, value in sorted(_table(table, where, shown))
        ]
        if kernels:
            targets.append(
                LockedTarget(target=target, kernels=tuple(sorted(kernels, key=_by_name)))
            )
    return ResourceLock(targets=tuple(targets))


#: The lines :func:`encode_lock` writes (a basic-string target without escapes, bare
#: keys, integers as TOML spells them); :func:`_canonical_doc` reads only these.
_N = "(0|[1-9][0-9]*)"
_CANONICAL_HEADER = re.compile(r'\["([^"\\\x00-\x1f\x7f]+)"\.([A-Za-z0-9_-]+)\]')
_CANONICAL_SCHEMA = re.compile(rf"schema = {_N}")
#: A kernel's line, its fields in encode_lock's order.
_CANONICAL_LINE = re.compile(
    rf"([A-Za-z0-9_-]+) = \{{ regs = {_N}, smem = {_N}, stack = {_N}"
    rf"(?:, spill_stores = {_N}, spill_loads = {_N})? \}}"
)
#: Control characters but for newline and tab.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _canonical_doc(text: str) -> dict[str, object] | None:
    """What ``tomllib.loads`` makes of ``text`` when every line is one :func:`encode_lock`
    writes (pure; the lock of a large tree is a megabyte, and tomllib reads it in seconds);
    None for anything else (tomllib reads it then, and names the mistake)."""
    if _CONTROL.search(text):
        return None
    doc: dict[str, object] = {}
    table: dict[str, object] | None = None
    for line in text.split("\n"):
        if table is not None and (m := _CANONICAL_LINE.fullmatch(line)) and m[1] not in table:
            regs, smem, stack, stores, loads = m.group(2, 3, 4, 5, 6)
            numbers = {"regs": int(regs), "smem": int(smem), "stack": int(stack)}
            if stores is not None:
                numbers.update(spill_stores=int(stores), spill_loads=int(loads))
            table[m[1]] = numbers
        elif not line.strip(" \t") or line.startswith("#"):
            continue
        elif table is None and (m := _CANONICAL_SCHEMA.fullmatch(line)) and "schema" not in doc:
            doc["schema"] = int(m[1])
        elif m := _CANONICAL_HEADER.fullmatch(line):
            archs = doc.setdefault(m[1], {})
            if not isinstance(archs, dict) or m[2] in archs:
                return None
            table = archs[m[2]] = {}
        else:
            return None
    return doc


def _table(value: object, where: str, shown: str) -> Iterable[tuple[str, object]]:
    if not isinstance(value, dict):
        raise LockFileError(shown, f"{where}: expected a table of kernels (an arch per table)")
    return value.items()


def _decode_kernel(where: str, arch: str, name: str, value: object, shown: str) -> KernelResources:
    if not isinstance(value, dict):
        key = f"{where}.{_key(name)}"
        raise LockFileError(shown, f"{key}: expected {{ regs = ..., smem = ..., stack = ... }}")
    if not value.keys() <= _FIELD_KEYS:
        unknown = sorted(value.keys() - _FIELD_KEYS)
        known = ", ".join(f for f, _, _ in _FIELDS)
        raise LockFileError(
            shown, f"{where}.{_key(name)}: unknown key {unknown[0]!r} (known: {known})"
        )
    numbers: dict[str, int | None] = {}
    for field, attr, optional in _FIELDS:
        number = value.get(field)
        if number is None and optional:
            numbers[attr] = None
            continue
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            got = "nothing" if number is None else repr(number)
            raise LockFileError(
                shown, f"{where}.{_key(name)}.{field}: expected a whole number >= 0, got {got}"
            )
        numbers[attr] = number
    return KernelResources(
        kernel=name,
        arch=arch,
        registers=numbers["registers"] or 0,
        shared_bytes=numbers["shared_bytes"] or 0,
        stack_bytes=numbers["stack_bytes"] or 0,
        spill_store_bytes=numbers["spill_store_bytes"],
        spill_load_bytes=numbers["spill_load_bytes"],
    )


def _key(text: str) -> str:
    """``text`` as a TOML key: bare when it can be, else a basic string."""
    if _BARE_KEY.fullmatch(text):
        return text
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _by_name(k: KernelResources) -> tuple[str, str]:
    return (k.kernel, k.arch)


# -------------------------------------------------------------------------------- I/O


def read_lock(path: Path, shown: str) -> ResourceLock:
    """The lock at ``path`` (``shown`` in messages). Raises :class:`LockFileError` when
    it is missing, unreadable or malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockFileError(
            shown,
            "does not exist; after a build, `metrale-orch resources --lock` writes it "
            "(commit it with the kernels)",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise LockFileError(shown, f"cannot be read ({why})") from None
    return decode_lock(text, shown)


def write_lock(path: Path, lock: ResourceLock) -> None:
    """Replace ``path`` with :func:`encode_lock`'s text, atomically. Raises OSError."""
    write_atomic(path, encode_lock(lock).encode("utf-8"))


# --------------------------------------------------------------------------- checking


def check_lock(
    lock: ResourceLock, report: ResourceReport, max_register_growth: int = 0
) -> LockCheck:
    """``report`` checked against ``lock`` (pure); only the report's targets take part."""
    problems: list[LockProblem] = []
    kernels = drift = targets = 0
    for t in report.targets:
        locked = {_by_name(k): k for k in lock.kernels_of(t.target)}
        if t.status in ("not-built", "error"):
            if t.status == "error" or locked:
                problems.append(_target_problem(t.target, t.status, t.detail, len(locked)))
            continue
        if t.status != "ok":
            continue
        targets += 1
        now = {_by_name(k): k for k in _merged(t.kernels)}
        kernels += len(now)
        drift += len(locked.keys() - now.keys())
        for key, kernel in sorted(now.items()):
            found = _kernel_problems(t.target, locked.get(key), kernel, max_register_growth)
            problems.extend(found)
            if not found and locked.get(key) != kernel:
                drift += 1
    return LockCheck(
        problems=tuple(problems),
        kernels=kernels,
        targets=targets,
        drift=drift,
        max_register_growth=max_register_growth,
    )


def _target_problem(target: str, status: str, detail: str, locked: int) -> LockProblem:
    if status == "error":
        return LockProblem(target=target, kernel="", arch="", issue="error", detail=detail)
    return LockProblem(
        target=target,
        kernel="",
        arch="",
        issue="not-built",
        detail=f"not built, and {LOCK_NAME} holds {locked} of its kernels",
    )


def _kernel_problems(
    target: str, was: KernelResources | None, now: KernelResources, max_growth: int
) -> list[LockProblem]:
    def problem(issue: LockIssue) -> LockProblem:
        return LockProblem(
            target=target, kernel=now.kernel, arch=now.arch, issue=issue, locked=was, now=now
        )

    if was is None:
        return [problem("missing")]
    out = []
    if _spill_grew(was, now):
        out.append(problem("more-spill" if was.spills else "new-spill"))
    if now.stack_bytes and not was.stack_bytes:
        out.append(problem("new-stack"))
    if now.registers - was.registers > max_growth:
        out.append(problem("register-growth"))
    return out


def _spill_grew(was: KernelResources, now: KernelResources) -> bool:
    """More spill stores or loads than locked; unknown on either side compares nothing."""
    pairs = (
        (was.spill_store_bytes, now.spill_store_bytes),
        (was.spill_load_bytes, now.spill_load_bytes),
    )
    return any(a is not None and b is not None and b > a for a, b in pairs)
