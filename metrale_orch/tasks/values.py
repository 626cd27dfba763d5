"""A doit task's values, typed: the one module that spells their keys.

doit keeps a task's values as a plain dict: what its python-action returns, merged with
what its ``uptodate`` objects' savers return, saved in the task's record when it succeeds
and handed back on later runs (``Dependency.get_values``, the ``values`` argument of an
``uptodate`` check). Each kind of value is a frozen dataclass here, with ``to_values()``
(the dict doit is given) and ``from_values()`` (read from whatever doit hands back; a
field of the wrong type reads as absent, so a damaged record never raises, and a build
whose record lacks its signature is simply not up to date):

- :class:`BuildValues`: what a ``build:<target>`` action returns (a target built, skipped
  or failed), which the reporter adds up;
- :class:`BuildRecord`: what the target's last good build left in doit's database for the
  up-to-date check, the failed-run guard and ``metrale-orch why``: the signature parts
  (saved by :class:`~metrale_orch.tasks.checker.SignatureCheck`), the installed files,
  the files read beyond the tree, the plan record;
- :class:`SummaryValues`: what a ``smoke:<hw>`` or ``coverage`` action returns.

A field absent (None) is left out of the dict. The field names are the keys, the very
keys earlier versions wrote, so a database written before these types existed reads the
same (nothing rebuilds for it). ``inputs`` and ``profile`` travel from the action to the
checker and the reporter but are never stored (:func:`pop_inputs`, :func:`persisted`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast, get_args

__all__ = [
    "BuildRecord",
    "BuildValues",
    "Outcome",
    "SummaryValues",
    "persisted",
    "pop_inputs",
    "refreshed_record",
]

#: What became of a target in a run: ``built`` (a module compiled), ``cached`` (every
#: module from a cache), ``skipped`` (no toolchain), ``failed``, ``stopped`` (Ctrl-C).
Outcome = Literal["built", "cached", "skipped", "failed", "stopped"]
_OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))

#: The keys that are never stored (see the module docstring).
_INPUTS = "inputs"
_PROFILE = "profile"


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, object] | None:
    return value if isinstance(value, Mapping) else None


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list | tuple) and all(isinstance(x, str) for x in value):
        return tuple(value)
    return None


def _counts(value: object) -> Mapping[str, int] | None:
    if isinstance(value, Mapping) and all(_int(v) is not None for v in value.values()):
        return value
    return None


class _Values:
    """What the kinds of value share: their dict."""

    __slots__: tuple[str, ...] = ()

    def to_values(self) -> dict[str, object]:
        """The dict doit is given (pure): the fields that are set, tuples as lists (doit's
        codec keeps the type)."""
        fields = ((name, getattr(self, name)) for name in self.__slots__)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in fields if v is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildValues(_Values):
    """What a ``build:<target>`` action returns to doit (see the module docstring)."""

    outcome: Outcome | None = None
    #: Module outcome -> how many (``compiled``, ``local``, ``shared``, ``failed`` ...).
    modules: Mapping[str, int] | None = None
    seconds: float | None = None
    #: This target's nonzero cache counters (``CacheStats.to_dict()``).
    cache: Mapping[str, int | float] | None = None
    #: Where its compile actions ran (remote execution only).
    remote: Mapping[str, object] | None = None
    #: File dependency -> xxh3-64 of the content built from (consumed by the checker).
    inputs: Mapping[str, str] | None = None
    #: The installed files (:func:`~metrale_orch.tasks.checker.encode_outputs`).
    outputs: tuple[str, ...] | None = None
    #: The plan's record as canonical JSON (what ``why`` compares a plan with).
    plan: str | None = None
    #: Files read outside the tree -> their saved state.
    external: Mapping[str, Sequence[int | str]] | None = None
    #: Profile spans (``Span.to_dict()`` each), for ``profile.json``.
    profile: tuple[Mapping[str, object], ...] | None = None
    #: Modules ``require_hits`` did not compile.
    refused: int | None = None
    warnings: tuple[str, ...] | None = None
    #: Why the target was skipped (its toolchain is missing).
    skipped: str | None = None
    #: The package error's exit status, for a failure.
    exit_code: int | None = None

    @classmethod
    def from_values(cls, values: object) -> BuildValues:
        """The values of a dict doit handed back (pure; anything else reads as empty)."""
        if not isinstance(values, Mapping):
            return cls()
        get = values.get
        outcome = get("outcome")
        profile = get(_PROFILE)
        return cls(
            outcome=cast(Outcome, outcome) if outcome in _OUTCOMES else None,
            modules=_counts(get("modules")),
            seconds=_number(get("seconds")),
            cache=_mapping(get("cache")),  # type: ignore[arg-type]
            remote=_mapping(get("remote")),
            inputs=_mapping(get(_INPUTS)),  # type: ignore[arg-type]
            outputs=_strings(get("outputs")),
            plan=_str(get("plan")),
            external=_mapping(get("external")),  # type: ignore[arg-type]
            profile=tuple(s for s in profile if isinstance(s, Mapping))
            if isinstance(profile, list | tuple)
            else None,
            refused=_int(get("refused")),
            warnings=_strings(get("warnings")),
            skipped=_str(get("skipped")),
            exit_code=_int(get("exit_code")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildRecord(_Values):
    """What a target's last good build left in its saved values (module docstring).

    Read on every up-to-date check of every target, so it holds what was stored as it
    was stored (no copy), checked only for its type."""

    #: Signature part -> its digest (:func:`~metrale_orch.graph.specs.signature_parts`).
    signature: Mapping[str, str] | None = None
    outputs: tuple[str, ...] | None = None
    external: Mapping[str, Sequence[int | str]] | None = None
    plan: str | None = None

    @classmethod
    def from_values(cls, values: object) -> BuildRecord:
        """The record of a task's saved values (pure; anything else reads as empty)."""
        if not isinstance(values, Mapping):
            return cls()
        get = values.get
        return cls(
            signature=_mapping(get("signature")),  # type: ignore[arg-type]
            outputs=_strings(get("outputs")),
            external=_mapping(get("external")),  # type: ignore[arg-type]
            plan=_str(get("plan")),
        )


def refreshed_record(
    values: Mapping[str, object],
    outputs: Sequence[str] | None,
    external: Mapping[str, Sequence[int | str]] | None,
) -> dict[str, object]:
    """A task's saved values with the records of its installed and external files
    replaced where given (pure; the rest as it was)."""
    new = dict(values)
    new.update(BuildRecord(outputs=None if outputs is None else tuple(outputs)).to_values())
    if external is not None:
        new.update(BuildRecord(external={k: list(v) for k, v in external.items()}).to_values())
    return new


def pop_inputs(values: object) -> Mapping[str, str]:
    """Take a build's input digests out of the values doit is about to save (they are
    handed to the checker, never stored); {} when there are none."""
    inputs = values.pop(_INPUTS, None) if isinstance(values, dict) else None
    return inputs if isinstance(inputs, Mapping) else {}


def persisted(values: Mapping[str, object]) -> Mapping[str, object]:
    """``values`` as stored and digested: without the profile spans (the same object
    when it has none, the common case on every save)."""
    if _PROFILE not in values:
        return values
    return {k: v for k, v in values.items() if k != _PROFILE}


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryValues(_Values):
    """What a passing ``smoke:<hw>`` or ``coverage`` action returns: the lines the
    reporter prints last, and for smoke its report file and counts."""

    summary: str | None = None
    report: str | None = None
    passed: int | None = None
    skipped: int | None = None
    failed: int | None = None

    @classmethod
    def from_values(cls, values: object) -> SummaryValues:
        """The values of a dict doit handed back (pure; anything else reads as empty)."""
        if not isinstance(values, Mapping):
            return cls()
        get = values.get
        return cls(
            summary=_str(get("summary")),
            report=_str(get("report")),
            passed=_int(get("passed")),
            skipped=_int(get("skipped")),
            failed=_int(get("failed")),
        )
