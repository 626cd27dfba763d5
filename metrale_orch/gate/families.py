"""The kernels a hardware's server loads by name, as its common layers declare them.

Two files of the tree (beside the format's manifests, for the serving side) name kernels
as ``(module, function)`` pairs, module names after ``[modules]`` renames:

- ``KERNEL_FAMILIES.toml``: ``[[family]] kernels = ["module::function", ...]``;
- ``FUSIONS.toml``: ``[[rule]] kernels = [{ module = "...", func = "..." }, ...]`` and,
  under a rule, ``[[rule.run]] launches = [...]`` of the same shape.

:func:`family_kernels` and :func:`fusion_kernels` read a parsed document (pure); other
tables and keys of these files belong to other tools and are ignored. :class:`KernelLists`
reads the files of a target's common layers (own and inherited), each file once.
A misshapen list is a :class:`~metrale_orch.gate.errors.KernelListError` naming the file
and the key.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from metrale_orch.fsutil import parse_toml
from metrale_orch.gate.errors import KernelListError
from metrale_orch.paths import rel_posix

__all__ = [
    "FAMILIES_NAME",
    "FUSIONS_NAME",
    "KernelLists",
    "NamedKernel",
    "family_kernels",
    "fusion_kernels",
]

FAMILIES_NAME = "KERNEL_FAMILIES.toml"
FUSIONS_NAME = "FUSIONS.toml"

#: A module name as ``[modules]`` renames allow it; a function as PTX spells an entry.
_MODULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_FUNC = re.compile(r"[A-Za-z_$][\w$]*")


class NamedKernel(NamedTuple):
    """A kernel a list names: its module, its function, and the file naming it
    (root-relative)."""

    module: str
    func: str
    source: str


def family_kernels(doc: Mapping[str, object], where: str) -> list[NamedKernel]:
    """The kernels of ``[[family]] kernels = ["module::function", ...]`` (pure)."""
    out: list[NamedKernel] = []
    for i, family in enumerate(_tables(doc, "family", where, "[[family]]")):
        items = _array(family, "kernels", where, f"family[{i}].kernels")
        for j, item in enumerate(items):
            key = f"family[{i}].kernels[{j}]"
            if not isinstance(item, str):
                raise KernelListError(
                    where, key, f'must be a "module::function" string, got {type(item).__name__}'
                )
            module, _, func = item.partition("::")
            out.append(_named(module, func, where, key, item))
    return out


def fusion_kernels(doc: Mapping[str, object], where: str) -> list[NamedKernel]:
    """The kernels of ``[[rule]] kernels`` and ``[[rule.run]] launches`` (pure): each an
    array of ``{ module = "...", func = "..." }`` tables."""
    out: list[NamedKernel] = []
    for i, rule in enumerate(_tables(doc, "rule", where, "[[rule]]")):
        key = f"rule[{i}].kernels"
        out += _refs(_array(rule, "kernels", where, key), where, key)
        for k, run in enumerate(_tables(rule, "run", where, f"rule[{i}].run")):
            key = f"rule[{i}].run[{k}].launches"
            out += _refs(_array(run, "launches", where, key), where, key)
    return out


def _tables(doc: Mapping[str, object], name: str, where: str, key: str) -> list[dict[str, object]]:
    value = doc.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise KernelListError(where, key, f"must be an array of tables ([[{name}]] blocks)")
    return value


def _array(table: Mapping[str, object], name: str, where: str, key: str) -> list[object]:
    value = table.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise KernelListError(where, key, f"must be an array, got {type(value).__name__}")
    return value


def _refs(items: list[object], where: str, key: str) -> list[NamedKernel]:
    out = []
    for j, item in enumerate(items):
        at = f"{key}[{j}]"
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("module", "func")
        ):
            raise KernelListError(
                where, at, 'must be a table { module = "...", func = "..." } of two strings'
            )
        module, func = item["module"], item["func"]
        assert isinstance(module, str) and isinstance(func, str)
        out.append(_named(module, func, where, at, f"{module}::{func}"))
    return out


def _named(module: str, func: str, where: str, key: str, shown: str) -> NamedKernel:
    if not _MODULE.fullmatch(module) or not _FUNC.fullmatch(func):
        raise KernelListError(
            where,
            key,
            f"{shown!r} is not a module name and a function name (module::function, "
            "the module as it is built: after [modules] renames)",
        )
    return NamedKernel(module, func, where)


@dataclass(slots=True)
class KernelLists:
    """The named kernels of directories of one tree, each file read once."""

    root: Path
    _memo: dict[Path, tuple[NamedKernel, ...]] = field(default_factory=dict)

    def of(self, dirs: Iterable[Path]) -> tuple[NamedKernel, ...]:
        """The kernels the family and fusion files of ``dirs`` name, sorted by (module,
        function), each pair once (the first file in ``dirs`` order naming it).
        Raises :class:`KernelListError`."""
        found: dict[tuple[str, str], NamedKernel] = {}
        for directory in dirs:
            for named in self._read(directory):
                found.setdefault((named.module, named.func), named)
        return tuple(found[k] for k in sorted(found))

    def _read(self, directory: Path) -> tuple[NamedKernel, ...]:
        if directory not in self._memo:
            named: list[NamedKernel] = []
            for name, reader in ((FAMILIES_NAME, family_kernels), (FUSIONS_NAME, fusion_kernels)):
                path = directory / name
                if path.is_file():
                    where = rel_posix(path, self.root)
                    named += reader(_load(path, where), where)
            self._memo[directory] = tuple(named)
        return self._memo[directory]


def _load(path: Path, where: str) -> dict[str, object]:
    try:
        return parse_toml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KernelListError(where, "(file)", f"cannot be read: {exc}") from None
