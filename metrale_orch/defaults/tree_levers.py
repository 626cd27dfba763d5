"""``kernels/LEVERS.toml``: the levers a tree declares of its own (SPEC 2.5).

:func:`parse_tree_levers` is pure and checks every ``[[lever]]`` rule;
:func:`read_tree_levers` is the one door that reads the file, for the check
and the build. Tree levers behave exactly like the built-in rows and come
after them; an identical re-declaration of a built-in lever is dropped.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.defaults.errors import (
    LEVERS_PATH,
    LEVERS_TOML,
    DefaultsError,
    LeverDeclarationError,
    seen,
)
from metrale_orch.defaults.levers import (
    LEVERS,
    RULE_KIND,
    BadValue,
    EntryValue,
    Kind,
    Lever,
    Rule,
    builtin_index,
    check_value,
)

__all__ = ["DeclaredLevers", "parse_tree_levers", "read_tree_levers"]


#: The keys a ``[[lever]]`` entry may hold (``about``: the docs' description).
_ENTRY_KEYS = (
    "name",
    "type",
    "baseline",
    "variables",
    "kill",
    "rule",
    "points",
    "summary_name",
    "about",
)
_LEVER_NAME = re.compile(r"[a-z][a-z0-9_]*")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_POINT_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
#: Names a tree lever may not take: the JSON's other keys and the header's other macros.
_RESERVED = frozenset({"hw", "sm_count", "target_hw", "target_sm_count", "target_defaults_h"})


@dataclass(frozen=True, slots=True, kw_only=True)
class DeclaredLevers:
    """What ``kernels/LEVERS.toml`` declares (:func:`read_tree_levers`)."""

    #: The file read; None when the tree has none.
    file: Path | None
    #: The tree's own levers, in file order (identical re-declarations of built-in ones dropped).
    levers: tuple[Lever, ...]

    def to_dict(self) -> list[dict[str, EntryValue]]:
        """JSON view: each tree lever as its entry declares it."""
        return [row.declaration() for row in self.levers]


def _entry_error(
    path: str, lever: str, key: str, problem: str, item: str = ""
) -> LeverDeclarationError:
    return LeverDeclarationError(path=path, lever=lever, key=key, problem=problem, item=item)


class _BadName(Exception):
    """A bad element of a list of names: ``item`` (``[i]``) and the problem's text."""

    def __init__(self, item: str, problem: str) -> None:
        self.item = item
        self.problem = problem
        super().__init__(f"{item} {problem}")


def _names_list(
    value: object, *, pattern: re.Pattern[str], what: tuple[str, str]
) -> tuple[str, ...]:
    """A tuple of unique strings matching ``pattern``; ``what``: (plural, one).

    Raises:
        _BadName: not an array, an element that is no such name, or a repeat.
    """
    plural, one = what
    if not isinstance(value, list):
        raise _BadName("", f"must be an array of {plural}, got {seen(value)}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not pattern.fullmatch(item):
            raise _BadName(f"[{i}]", f"must be {one} ({pattern.pattern}), got {seen(item)}")
        if item in out:
            raise _BadName(f"[{i}]", f"repeats {item!r}")
        out.append(item)
    return tuple(out)


def _parse_entry(entry: object, number: int, *, path: str, names: Mapping[str, int]) -> Lever:
    where = f"#{number}"
    if not isinstance(entry, Mapping):
        raise _entry_error(path, where, "[[lever]]", f"must be a table, got {seen(entry)}")
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise _entry_error(
            path,
            where,
            ", ".join(unknown),
            f"{'is not a key' if len(unknown) == 1 else 'are not keys'} of a lever "
            f"(the keys: {', '.join(_ENTRY_KEYS)})",
        )
    for key in ("name", "type", "baseline", "variables", "rule"):
        if key not in entry:
            raise _entry_error(
                path,
                where,
                key,
                "is missing (every lever has name, type, baseline, variables and rule)",
            )
    name = entry["name"]
    if not isinstance(name, str) or not _LEVER_NAME.fullmatch(name):
        raise _entry_error(
            path,
            where,
            "name",
            f"must be a lower-case name ([a-z][a-z0-9_]*), got {seen(name)}",
        )
    if name in _RESERVED:
        raise _entry_error(path, where, "name", f"{name!r} is reserved; choose another name")
    if name in names:
        raise _entry_error(
            path, repr(name), "name", f"is declared twice (entries #{names[name]} and {where})"
        )
    lever = repr(name)

    def fail(key: str, problem: str, item: str = "") -> LeverDeclarationError:
        return _entry_error(path, lever, key, problem, item)

    kinds = {kind.value: kind for kind in Kind}
    rules = {rule.value: rule for rule in Rule}
    kind_text, rule_text = entry["type"], entry["rule"]
    if not isinstance(kind_text, str) or kind_text not in kinds:
        raise fail("type", f"must be one of {', '.join(kinds)}, got {seen(kind_text)}")
    if not isinstance(rule_text, str) or rule_text not in rules:
        raise fail("rule", f"must be one of {', '.join(rules)}, got {seen(rule_text)}")
    kind, rule = kinds[kind_text], rules[rule_text]
    if RULE_KIND[rule] is not kind:
        raise fail(
            "rule",
            f"{rule.value!r} works on {RULE_KIND[rule].value} levers, not {kind.value} "
            f"(a {kind.value} lever takes rule "
            f"{' or '.join(repr(r.value) for r in Rule if RULE_KIND[r] is kind)})",
        )
    try:
        variables = _names_list(
            entry["variables"],
            pattern=_VARIABLE_NAME,
            what=("environment variable names", "an environment variable name"),
        )
    except _BadName as bad:
        raise fail("variables", bad.problem, bad.item) from None
    kill = entry.get("kill")
    if kill is not None:
        if rule is not Rule.TOGGLE:
            raise fail("kill", "is for toggles only (a kill switch forces a bool lever off)")
        if not isinstance(kill, str) or not _VARIABLE_NAME.fullmatch(kill):
            raise fail("kill", f"must be an environment variable name, got {seen(kill)}")
    points: tuple[tuple[str, ...], ...] = ()
    if rule is Rule.POINTS:
        points = _parse_bands(entry.get("points"), fail)
    elif "points" in entry:
        raise fail("points", 'is for points levers only (type and rule "points")')
    try:
        value = check_value(kind, entry["baseline"], bands=points)
    except BadValue as bad:
        raise fail("baseline", str(bad)) from None
    summary_name = entry.get("summary_name")
    if summary_name is not None and (
        not isinstance(summary_name, str) or not _LEVER_NAME.fullmatch(summary_name)
    ):
        raise fail(
            "summary_name",
            f"must be a lower-case name ([a-z][a-z0-9_]*), got {seen(summary_name)}",
        )
    if summary_name in _RESERVED:
        raise fail("summary_name", f"{summary_name!r} is reserved; choose another name")
    about = entry.get("about", "")
    if not isinstance(about, str):
        raise fail("about", f"must be a string, got {seen(about)}")
    return Lever(
        name=name,
        kind=kind,
        baseline=value,
        rule=rule,
        variables=variables,
        kill=kill,
        points=points,
        summary_name=summary_name,
        about=about.strip(),
    )


def _parse_bands(
    value: object, fail: Callable[[str, str, str], LeverDeclarationError]
) -> tuple[tuple[str, ...], ...]:
    example = 'e.g. points = [["mb1", "mb1_ku2"], ["mb4"]]'
    if value is None:
        raise fail("points", f"is missing: a points lever lists each band's names ({example})", "")
    if not isinstance(value, list) or not value:
        raise fail(
            "points",
            f"must be a non-empty array of bands ({example}), got {seen(value)}",
            "",
        )
    bands: list[tuple[str, ...]] = []
    for i, band in enumerate(value):
        try:
            names = _names_list(band, pattern=_POINT_NAME, what=("point names", "a point name"))
        except _BadName as bad:
            raise fail("points", bad.problem, f"[{i}]{bad.item}") from None
        if not names:
            raise fail("points", "is empty: a band accepts at least one name", f"[{i}]")
        bands.append(names)
    return tuple(bands)


def _shown(value: object) -> str:
    return "absent" if value is None else json.dumps(value)


def _redeclared(row: Lever, builtin: Lever) -> str | None:
    """The first key where ``row`` declares ``builtin`` differently, or None (a
    ``summary_name`` equal to the name is the default spelled out)."""
    mine, theirs = row.declaration(), builtin.declaration()
    for key in ("type", "rule", "baseline", "variables", "kill", "points"):
        if mine.get(key) != theirs.get(key):
            return key
    return None if row.label == builtin.label else "summary_name"


def parse_tree_levers(doc: Mapping[str, object], *, path: str = LEVERS_PATH) -> tuple[Lever, ...]:
    """The tree's own levers in a parsed ``kernels/LEVERS.toml`` (pure), in file order.

    An identical re-declaration of a built-in lever is dropped.

    Raises:
        DefaultsError: a top-level key other than ``lever``, or ``lever`` not an
            array of tables.
        LeverDeclarationError: a bad entry (a missing, unknown or ill-typed key, a
            name declared twice or reserved, a type/rule mismatch, a baseline
            that does not fit, a built-in lever declared differently, a summary
            name another lever prints under).
    """
    extra = sorted(key for key in doc if key != "lever")
    if extra:
        raise DefaultsError(
            f"{path}: {', '.join(extra)}: not a key of this file (it holds [[lever]] "
            f"tables only); fix the file",
            path=path,
            key=", ".join(extra),
        )
    entries = doc.get("lever", [])
    if not isinstance(entries, list):
        raise DefaultsError(
            f"{path}: lever must be an array of tables ([[lever]]), got {seen(entries)}; "
            f"fix the file",
            path=path,
            key="lever",
        )
    names: dict[str, int] = {}
    levers: list[Lever] = []
    builtin_labels = {row.label for row in LEVERS} | set(builtin_index())
    previous_label = ""
    labels: dict[str, str] = {}
    for number, entry in enumerate(entries, start=1):
        row = _parse_entry(entry, number, path=path, names=names)
        names[row.name] = number
        builtin = builtin_index().get(row.name)
        if builtin is not None:
            key = _redeclared(row, builtin)
            if key is not None:
                mine, theirs = row.declaration().get(key), builtin.declaration().get(key)
                raise _entry_error(
                    path,
                    repr(row.name),
                    key,
                    f"is {_shown(mine)} here but {_shown(theirs)} in the built-in "
                    f"lever of that name; declare it as built in (or drop the entry)",
                )
            continue
        label_key = "name" if row.summary_name is None else "summary_name"
        if row.label in builtin_labels:
            raise _entry_error(
                path,
                repr(row.name),
                label_key,
                f"{row.label!r} already prints in the summary line for a built-in lever; "
                f"choose another",
            )
        if row.label in labels and row.label != previous_label:
            raise _entry_error(
                path,
                repr(row.name),
                label_key,
                f"{row.label!r} already prints in the summary line for {labels[row.label]!r}; "
                f"levers sharing a summary name are declared one after another",
            )
        labels.setdefault(row.label, row.name)
        previous_label = row.label
        levers.append(row)
    return tuple(levers)


def read_tree_levers(kernels_dir: Path | str) -> DeclaredLevers:
    """Read and validate ``<kernels_dir>/LEVERS.toml`` (absent: no tree levers).

    The one door for the check and the build: every [[lever]] rule of SPEC 2.5.

    Raises:
        DefaultsError: the file is a symlink or not a regular file, does not
            parse, or holds a bad entry (:func:`parse_tree_levers`).
    """
    file = Path(kernels_dir) / LEVERS_TOML
    path = LEVERS_PATH
    if file.is_symlink():
        raise DefaultsError(f"{path}: is a symlink; make it a regular file in the tree", path=path)
    if not file.exists():
        return DeclaredLevers(file=None, levers=())
    if not file.is_file():
        what = "a directory" if file.is_dir() else "not a regular file"
        raise DefaultsError(f"{path}: is {what}, not a TOML file: make it a file", path=path)
    try:
        doc = tomllib.loads(file.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DefaultsError(f"{path}: does not parse ({exc}); fix the file", path=path) from None
    return DeclaredLevers(file=file, levers=parse_tree_levers(doc, path=path))
