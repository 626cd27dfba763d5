"""The per-target manifest (``<build_dir>/<hw>/<model>/<quant>/manifest.json``, SPEC 4.1).

One frozen value, :class:`Manifest`, written by the build (last, after every
artefact it vouches for) and read by smoke and ``status``. ``to_dict()`` is
the JSON document exactly as the build has always written it (:meth:`Manifest.encode`
gives its bytes: two-space indent, sorted keys, trailing newline);
:meth:`Manifest.from_dict` and :func:`read_manifest` read it back, checking its
schema. Paths in it are root-relative POSIX. Imports nothing of the package
but its errors, so readers need not import the build machinery.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, cast, get_args

from metrale_orch.errors import MetraleError

__all__ = [
    "MANIFEST_SCHEMA",
    "Manifest",
    "ManifestError",
    "ManifestModule",
    "ManifestShadow",
    "ModuleOutcome",
    "odd_artefact",
    "read_manifest",
]

#: Version of the manifest's layout; a reader refuses any other.
MANIFEST_SCHEMA = 1

#: How a module was obtained by the build that wrote the manifest.
ModuleOutcome = Literal["compiled", "local", "remote", "failed"]
_OUTCOMES: tuple[str, ...] = get_args(ModuleOutcome)


class ManifestError(MetraleError, ValueError):
    """A manifest cannot be read back: wrong schema, a missing or mistyped field."""

    exit_code = 1

    problem: str

    template = "{problem}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestModule:
    """One module's artefact as installed."""

    name: str
    stem: str
    #: The module's source, root-relative.
    source: str
    #: The artefact's file name in the target's directory.
    artefact: str
    #: xxh3-128 hex of the artefact's bytes.
    xxh3: str
    #: The action key it was compiled or fetched under.
    key: str
    outcome: ModuleOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestShadow:
    """A file of the layout that shadows another (root-relative paths)."""

    role: str
    name: str
    winner: str
    loser: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """What was built for one target, from what, with which tools."""

    schema: int = MANIFEST_SCHEMA
    target: str
    arch: str
    toolchain_name: str
    #: The toolchain's probed identity (version text and digest).
    toolchain_identity: str
    flags: tuple[str, ...]
    modules: tuple[ManifestModule, ...]
    shadows: tuple[ManifestShadow, ...] = ()
    #: ``(module, kernel)`` pairs a leaf fork drops from its common namesake, sorted.
    shadowed_dropped: tuple[tuple[str, str], ...] = ()
    #: The baked defaults (``target_defaults.json``'s document).
    defaults: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def to_dict(self) -> dict[str, object]:
        """The JSON document (round-trips through :meth:`from_dict`)."""
        return {
            "schema": self.schema,
            "target": self.target,
            "arch": self.arch,
            "toolchain": {"name": self.toolchain_name, "identity": self.toolchain_identity},
            "flags": list(self.flags),
            # An entry's fields in their order (dataclasses.asdict).
            "modules": [asdict(m) for m in self.modules],
            "shadows": [asdict(s) for s in self.shadows],
            "shadowed_dropped": [list(pair) for pair in self.shadowed_dropped],
            "defaults": dict(self.defaults),
        }

    def encode(self) -> bytes:
        """The file's bytes, as the build writes them."""
        return (json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> Manifest:
        """Read a manifest document back. Raises :class:`ManifestError` naming the field."""
        schema = doc.get("schema")
        if schema != MANIFEST_SCHEMA:
            raise ManifestError(f"schema {schema!r}, expected {MANIFEST_SCHEMA}")
        toolchain = _mapping(doc, "toolchain")
        modules = []
        for i, item in enumerate(_list(doc, "modules")):
            where = f"modules[{i}]"
            entry = _as_mapping(item, where)
            outcome = _str(entry, "outcome", where)
            if outcome not in _OUTCOMES:
                raise ManifestError(f"{where}.outcome: unknown outcome {outcome!r}")
            modules.append(
                ManifestModule(
                    name=_str(entry, "name", where),
                    stem=_str(entry, "stem", where),
                    source=_str(entry, "source", where),
                    artefact=_str(entry, "artefact", where),
                    xxh3=_str(entry, "xxh3", where),
                    key=_str(entry, "key", where),
                    outcome=cast(ModuleOutcome, outcome),  # checked against _OUTCOMES
                )
            )
        shadows = []
        for i, item in enumerate(_list(doc, "shadows")):
            where = f"shadows[{i}]"
            entry = _as_mapping(item, where)
            shadows.append(ManifestShadow(**{k: _str(entry, k, where) for k in _SHADOW_FIELDS}))
        dropped = []
        for i, item in enumerate(_list(doc, "shadowed_dropped")):
            pair = item if isinstance(item, list) else []
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                raise ManifestError(f"shadowed_dropped[{i}]: must be [module, kernel]")
            dropped.append((str(pair[0]), str(pair[1])))
        return cls(
            schema=MANIFEST_SCHEMA,
            target=_str(doc, "target", ""),
            arch=_str(doc, "arch", ""),
            toolchain_name=_str(toolchain, "name", "toolchain"),
            toolchain_identity=_str(toolchain, "identity", "toolchain"),
            flags=tuple(_strs(doc, "flags")),
            modules=tuple(modules),
            shadows=tuple(shadows),
            shadowed_dropped=tuple(dropped),
            defaults=MappingProxyType(dict(_mapping(doc, "defaults"))),
        )


_SHADOW_FIELDS = ("role", "name", "winner", "loser", "reason")


def odd_artefact(manifest: Manifest) -> str | None:
    """The first artefact of ``manifest`` named other than as a plain file name of the
    target's directory (a path, "", "." or ".."), else None (pure): a reader that joins it
    to the directory refuses such a manifest."""
    for module in manifest.modules:
        if "/" in module.artefact or module.artefact in ("", ".", ".."):
            return module.artefact
    return None


def read_manifest(path: Path) -> Manifest:
    """The manifest at ``path``. Raises ``OSError`` when it cannot be read and
    :class:`ManifestError` when it is not a manifest of this schema."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"not JSON: {exc}") from None
    return Manifest.from_dict(_as_mapping(doc, "(document)"))


def _as_mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where}: must be an object")
    return value


def _mapping(doc: Mapping[str, object], key: str) -> Mapping[str, object]:
    return _as_mapping(doc.get(key), key)


def _list(doc: Mapping[str, object], key: str) -> Sequence[object]:
    value = doc.get(key)
    if not isinstance(value, list):
        raise ManifestError(f"{key}: must be an array")
    return value


def _str(doc: Mapping[str, object], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise ManifestError(f"{where + '.' if where else ''}{key}: must be a string")
    return value


def _strs(doc: Mapping[str, object], key: str) -> list[str]:
    value = _list(doc, key)
    if not all(isinstance(v, str) for v in value):
        raise ManifestError(f"{key}: must be an array of strings")
    return [str(v) for v in value]
