"""The runner map, ``ci/runners.toml``: runner classes and where each hardware runs.

:func:`parse_runners` is pure (a parsed document in, :class:`Runners` out);
:func:`load_runners` reads the file. A hardware builds on one runner class and smokes
on another when the map says so (:class:`Placement`)::

    [runners.h100]                       # a runner class
    labels = ["self-hosted", "linux", "gpu-h100"]
    toolchains = ["nvcc"]                # toolchain names installed on it

    [runners.cpu]
    labels = ["self-hosted", "linux", "cpu"]
    toolchains = ["nvcc"]

    [hardware]                           # hardware tree -> runner class(es)
    hopper = { build = "cpu", smoke = "h100" }   # compile on CPU, smoke on the GPU
    b200 = "h100"                        # one class builds and smokes

    [default]                            # optional: for unlisted hardware
    runner = "h100"                      # or build = "cpu" and smoke = "h100"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from metrale_orch.fsutil import parse_toml
from metrale_orch.matrix.errors import RunnersError

__all__ = [
    "DEFAULT_RUNNERS_FILE",
    "Placement",
    "RunnerClass",
    "Runners",
    "load_runners",
    "parse_runners",
]

#: Where ``metrale-orch matrix`` looks for the runner map, relative to the root.
DEFAULT_RUNNERS_FILE = "ci/runners.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerClass:
    """A kind of CI machine: the labels that select it and the toolchains installed on it."""

    name: str
    labels: tuple[str, ...]
    toolchains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a hardware's CI jobs run: the runner class that builds it and the one that
    smoke-tests it (the same class for a plain ``hw = "<class>"`` entry)."""

    build: str
    smoke: str

    @classmethod
    def both(cls, name: str) -> Placement:
        """One class builds and smokes."""
        return cls(build=name, smoke=name)

    @property
    def split(self) -> bool:
        """Whether the smoke runs on another class than the build (then from cache hits)."""
        return self.build != self.smoke


def _no_classes() -> Mapping[str, RunnerClass]:
    return MappingProxyType({})


def _no_hardware() -> Mapping[str, Placement]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Runners:
    """The parsed runner map: runner classes, hardware -> placement, the default placement."""

    #: The file as named in messages (root-relative where possible).
    path: str = DEFAULT_RUNNERS_FILE
    classes: Mapping[str, RunnerClass] = field(default_factory=_no_classes)
    hardware: Mapping[str, Placement] = field(default_factory=_no_hardware)
    default: Placement | None = None

    def placement_for(self, hw: str) -> Placement | None:
        """Where ``hw`` builds and smokes: its own entry, else the default, else None."""
        return self.hardware.get(hw, self.default)


def _str_list(value: object, path: str, key: str, *, non_empty: bool) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RunnersError(path, key, "must be an array of non-blank strings")
    if non_empty and not value:
        raise RunnersError(path, key, "must name at least one label")
    if len(set(value)) != len(value):
        raise RunnersError(path, key, "lists a value twice")
    return tuple(value)


def parse_runners(doc: Mapping[str, object], path: str = DEFAULT_RUNNERS_FILE) -> Runners:
    """Validate a parsed ``runners.toml``. Raises :class:`RunnersError` naming the key."""
    for key in sorted(doc):
        if key not in ("runners", "hardware", "default"):
            raise RunnersError(
                path, key, "unknown table (known: [runners.<class>], [hardware], [default])"
            )
    classes = _parse_classes(doc.get("runners", {}), path)
    hw_doc = doc.get("hardware", {})
    if not isinstance(hw_doc, dict):
        raise RunnersError(
            path,
            "hardware",
            'must be a table of <hardware> = "<runner class>" or '
            '{ build = "<class>", smoke = "<class>" }',
        )
    hardware = {
        hw: _parse_placement(hw_doc[hw], f"hardware.{hw}", classes, path) for hw in sorted(hw_doc)
    }
    return Runners(
        path=path,
        classes=MappingProxyType(classes),
        hardware=MappingProxyType(hardware),
        default=_parse_default(doc.get("default", {}), classes, path),
    )


def _parse_classes(classes_doc: object, path: str) -> dict[str, RunnerClass]:
    """The ``[runners.<class>]`` tables."""
    if not isinstance(classes_doc, dict):
        raise RunnersError(path, "runners", "must be a table of [runners.<class>] tables")
    classes: dict[str, RunnerClass] = {}
    for name in sorted(classes_doc):
        table = classes_doc[name]
        key = f"runners.{name}"
        if not isinstance(table, dict):
            raise RunnersError(path, key, "must be a table with labels = [...]")
        for k in sorted(table):
            if k not in ("labels", "toolchains"):
                raise RunnersError(path, f"{key}.{k}", "unknown key (known: labels, toolchains)")
        if "labels" not in table:
            raise RunnersError(path, f"{key}.labels", "missing (the runs-on labels of the class)")
        toolchains = _str_list(
            table.get("toolchains", []), path, f"{key}.toolchains", non_empty=False
        )
        classes[name] = RunnerClass(
            name=name,
            labels=_str_list(table["labels"], path, f"{key}.labels", non_empty=True),
            toolchains=tuple(sorted(toolchains)),
        )
    return classes


def _class_ref(value: object, key: str, classes: Mapping[str, RunnerClass], path: str) -> str:
    if not isinstance(value, str):
        raise RunnersError(path, key, "must be the name of a [runners.<class>] table")
    if value not in classes:
        known = ", ".join(sorted(classes)) or "none defined"
        raise RunnersError(path, key, f"unknown runner class {value!r} (classes: {known})")
    return value


def _parse_placement(
    value: object, key: str, classes: Mapping[str, RunnerClass], path: str
) -> Placement:
    """A ``[hardware]`` entry: ``"<class>"`` (builds and smokes there) or
    ``{ build = "<class>", smoke = "<class>" }``."""
    if not isinstance(value, dict):
        return Placement.both(_class_ref(value, key, classes, path))
    for k in sorted(value):
        if k not in ("build", "smoke"):
            raise RunnersError(path, f"{key}.{k}", "unknown key (known: build, smoke)")
    for k in ("build", "smoke"):
        if k not in value:
            raise RunnersError(
                path,
                f"{key}.{k}",
                f"missing: name the class that {'builds' if k == 'build' else 'smoke-tests'} "
                f'it, or give one class for both ({key.split(".", 1)[1]} = "<class>")',
            )
    return Placement(
        build=_class_ref(value["build"], f"{key}.build", classes, path),
        smoke=_class_ref(value["smoke"], f"{key}.smoke", classes, path),
    )


def _parse_default(
    default_doc: object, classes: Mapping[str, RunnerClass], path: str
) -> Placement | None:
    """``[default]``: ``runner`` (both), ``build`` and ``smoke`` (each overriding it)."""
    if not isinstance(default_doc, dict):
        raise RunnersError(
            path, "default", 'must be a table: [default] runner = "<class>" (or build, smoke)'
        )
    for k in sorted(default_doc):
        if k not in ("runner", "build", "smoke"):
            raise RunnersError(path, f"default.{k}", "unknown key (known: runner, build, smoke)")
    if not default_doc:
        return None
    named = {
        k: _class_ref(default_doc[k], f"default.{k}", classes, path)
        for k in ("runner", "build", "smoke")
        if k in default_doc
    }
    for k in ("build", "smoke"):
        if k not in named and "runner" not in named:
            raise RunnersError(
                path,
                f"default.{k}",
                f"missing: with [default] {'smoke' if k == 'build' else 'build'} = ..., "
                f'name the {k} class too, or runner = "<class>" for both',
            )
    return Placement(
        build=named.get("build", named.get("runner", "")),
        smoke=named.get("smoke", named.get("runner", "")),
    )


def load_runners(file: Path, root: Path) -> Runners:
    """Read and validate a runner map. Raises :class:`RunnersError`."""
    try:
        shown = file.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        shown = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunnersError(
            shown, "(file)", "does not exist; create it (see ci/README.md) or pass --runners PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunnersError(shown, "(file)", f"cannot be read: {exc}") from None
    try:
        doc = parse_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise RunnersError(shown, "(file)", f"is not valid TOML: {exc}") from None
    return parse_runners(doc, shown)
