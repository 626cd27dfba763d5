"""A reader for PTX text: its ``.version``, ``.target``, ``.address_size`` and entry points.

Pure: :func:`parse_ptx` takes the text and returns a :class:`PtxInfo`; it never
runs a tool. It understands just enough of the PTX grammar for the smoke
checks: comments (``//`` and ``/* */``) are dropped before matching, so a
commented-out ``.entry`` is not an entry; ``.extern .entry`` lines are
declarations of kernels defined elsewhere and are not entries of the module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from metrale_orch.smoke.errors import SmokeError

__all__ = ["PtxEntry", "PtxError", "PtxInfo", "looks_like_ptx", "parse_ptx", "strip_comments"]


class PtxError(SmokeError, ValueError):
    """The text is not PTX (no ``.target`` directive, or not text at all)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PtxEntry:
    """One kernel defined in the module: its name and linkage (``visible``, ``weak`` or "")."""

    name: str
    linkage: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PtxInfo:
    """What a PTX module declares. ``entries`` is sorted by name."""

    version: str
    #: The first ``.target`` operand, e.g. ``sm_90a``.
    target: str
    #: The remaining ``.target`` operands (``debug``, ``texmode_independent``, ...).
    target_options: tuple[str, ...]
    address_size: int | None
    entries: tuple[PtxEntry, ...]

    @property
    def entry_names(self) -> tuple[str, ...]:
        """Names of every entry (kernel) the module defines, sorted."""
        return tuple(e.name for e in self.entries)

    @property
    def visible_entries(self) -> tuple[str, ...]:
        """Names of the ``.visible`` entries, the ones a loader can look up by name."""
        return tuple(e.name for e in self.entries if e.linkage == "visible")


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_VERSION = re.compile(r"^\s*\.version\s+(\d+\.\d+)", re.M)
_TARGET = re.compile(r"^\s*\.target\s+([^\n;]+)", re.M)
_ADDRESS = re.compile(r"^\s*\.address_size\s+(\d+)", re.M)
# PTX identifiers: [a-zA-Z][a-zA-Z0-9_$]* or [_$%][a-zA-Z0-9_$]+
_ENTRY = re.compile(
    r"^\s*((?:\.(?:visible|weak|extern)\s+)*)\.entry\s+([A-Za-z][\w$]*|[_$%][\w$]+)",
    re.M,
)


def strip_comments(text: str) -> str:
    """The text with ``//`` and ``/* */`` comments removed (newlines of block comments kept)."""
    return _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def parse_ptx(text: str) -> PtxInfo:
    """Read the module-level directives and the entries of a PTX module.

    Raises :class:`PtxError` when there is no ``.target`` directive.
    """
    body = strip_comments(text)
    target_m = _TARGET.search(body)
    if target_m is None:
        raise PtxError("no .target directive: not a PTX module")
    operands = tuple(t.strip() for t in target_m.group(1).split(",") if t.strip())
    version_m = _VERSION.search(body)
    address_m = _ADDRESS.search(body)
    entries: dict[str, PtxEntry] = {}
    for m in _ENTRY.finditer(body):
        qualifiers = m.group(1).split()
        if ".extern" in qualifiers:
            continue
        linkage = "visible" if ".visible" in qualifiers else "weak" if ".weak" in qualifiers else ""
        entries.setdefault(m.group(2), PtxEntry(name=m.group(2), linkage=linkage))
    return PtxInfo(
        version=version_m.group(1) if version_m else "",
        target=operands[0] if operands else "",
        target_options=operands[1:],
        address_size=int(address_m.group(1)) if address_m else None,
        entries=tuple(entries[k] for k in sorted(entries)),
    )


def looks_like_ptx(data: bytes) -> bool:
    """True when ``data`` is text with a ``.target`` directive (a cheap sniff, no full parse)."""
    if b"\0" in data[:4096]:
        return False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _TARGET.search(strip_comments(text)) is not None
