"""The record of a module's key parts kept with its cache entry, and what two records differ in.

A cache key is a hash: it says *that* two compiles differ, never *how*. So every entry a
build stores carries, in its meta (:data:`~metrale_orch.cache.records.RECORD_META`), a
small record of the parts its key hashed (:func:`key_record`): the toolchain and its
identity, the arch, the argv, the environment allow-list (each value as a digest: a shared
bucket never holds a variable's text), the module's entry and artefact, and each file of its
include closure by its path and content hash (with the tree file it was staged from). No
key changes: the record is written beside the key, never into it.

:func:`record_changes` names what differs between the record of a module's current key and
a stored one, by part: the source, which header, which flag or define, the arch, which part
of the toolchain's identity, which environment variable. :func:`nearest` picks, among stored
records of the same module, the one with the fewest differences. All pure.

A target's build keeps a record of the same form, of its plan (:func:`plan_record`: the
arch, the toolchain, the merged flags, the environment, the modules' names) with its
record in doit's database, so ``metrale-orch why`` names, with the same
:func:`record_changes`, the values behind the signature parts that changed since.
"""

from __future__ import annotations

import posixpath
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import text_hash
from metrale_orch.paths import rel_posix
from metrale_orch.steps.plan_values import TargetPlan

__all__ = [
    "RECORD_SCHEMA",
    "Change",
    "Stored",
    "key_record",
    "nearest",
    "plan_record",
    "record_changes",
    "same_module",
    "staged_sources",
]

#: The record's own layout version (not part of any key): a record of another version is
#: not compared.
RECORD_SCHEMA = 1

#: The parts of :func:`~metrale_orch.steps.keys.module_key_parts` the record spells out;
#: any other part is kept as a digest and named when it differs.
_KNOWN = frozenset(
    {
        "plan_schema",
        "toolchain",
        "identity",
        "arch",
        "argv",
        "env",
        "module",
        "inputs",
        "flag_inputs",
        "checkout",
        "layer_include",
    }
)

#: What a difference is about.
Part = Literal[
    "source",
    "header",
    "flag",
    "define",
    "arch",
    "toolchain",
    "environment",
    "flag input",
    "input",
    "signature",
    "checkout",
    "layer include",
    "module",
    "namespace",
    "schema",
    "other",
]

#: Flags whose value is the next word when not glued (``-D X``, ``--Werror all-warnings``).
_VALUED = frozenset(
    {
        "-D",
        "-U",
        "-I",
        "-isystem",
        "-include",
        "-imacros",
        "-o",
        "-x",
        "-t",
        "-arch",
        "-code",
        "-gencode",
        "-ccbin",
        "-std",
        "-Xptxas",
        "-Xcompiler",
        "-Xlinker",
        "-Xnvlink",
        "-Xcudafe",
        "-maxrregcount",
        "-optf",
        "--std",
        "--threads",
        "--Werror",
        "--options-file",
        "--pre-include",
        "--define-macro",
        "--undefine-macro",
        "--include-path",
        "--system-include",
        "--compiler-bindir",
        "--compiler-options",
        "--ptxas-options",
        "--linker-options",
        "--generate-code",
        "--gpu-architecture",
        "--gpu-code",
        "--maxrregcount",
        "--output-file",
    }
)
_DEFINE_FLAGS = ("-D", "--define-macro")


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One difference between the current key's record and a stored one."""

    part: Part
    #: What changed, in words: ``header kernels/hw/common/p.h changed``.
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"part": self.part, "text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Stored:
    """A stored entry's key and its record."""

    key: str
    record: Mapping[str, object]


def key_record(
    parts: Mapping[str, object],
    *,
    namespace: str,
    target: str,
    hardware: str,
    module: str,
    source: str,
    tree: Callable[[str], str],
) -> dict[str, object]:
    """The record of ``parts`` (a module's key parts) stored with its entry (pure).

    ``target``, ``hardware``, ``module`` and ``source`` (root-relative) name the module
    (which stored entries are "the same module"); ``tree`` maps a closure path (relative to
    the module's directory, as the key spells it) to the tree file it was staged from,
    root-relative ("" when unknown).
    """
    mod = parts.get("module")
    names = mod if isinstance(mod, Mapping) else {}
    env = parts.get("env")
    record: dict[str, object] = {
        "schema": RECORD_SCHEMA,
        "namespace": namespace,
        "target": target,
        "hardware": hardware,
        "module": module,
        "source": source,
        "plan_schema": parts.get("plan_schema"),
        "toolchain": parts.get("toolchain"),
        "identity": parts.get("identity"),
        "arch": parts.get("arch"),
        "argv": list(_strings(parts.get("argv"))),
        "env": {
            str(k): text_hash(str(v)) for k, v in (env.items() if isinstance(env, Mapping) else ())
        },
        "entry": str(names.get("entry", "")),
        "artefact": str(names.get("artefact", "")),
        "inputs": [[path, digest, tree(path)] for path, digest in _pairs(parts.get("inputs"))],
        "flag_inputs": [list(pair) for pair in _pairs(parts.get("flag_inputs"))],
        "checkout": str(parts.get("checkout", "")),
        "layer_include": str(parts.get("layer_include", "")),
        "other": {
            name: text_hash(canonical_json(value))
            for name, value in sorted(parts.items())
            if name not in _KNOWN
        },
    }
    return record


def plan_record(plan: TargetPlan) -> dict[str, object]:
    """The record of what a target's ``plan`` builds with, in :func:`key_record`'s terms
    (pure): the arch, the toolchain and its identity, the merged flags (as an argv after
    the program), the environment allow-list (each value as a digest) and the modules'
    names (``modules``, which no module's record has)."""
    return {
        "schema": RECORD_SCHEMA,
        "target": str(plan.target),
        "hardware": plan.hardware,
        "arch": plan.arch,
        "toolchain": plan.toolchain.name,
        "identity": plan.identity,
        "argv": [plan.toolchain.program, *plan.flags],
        "env": {str(k): text_hash(str(v)) for k, v in plan.env.items()},
        "modules": sorted(m.name for m in plan.modules),
    }


def staged_sources(files: Mapping[str, Path], root: Path, cwd: str) -> Callable[[str], str]:
    """The ``tree`` of :func:`key_record` for a module whose directory is ``cwd`` in a stage
    of ``files`` (stage path -> tree file): a closure path's tree file, root-relative."""

    def tree(path: str) -> str:
        source = files.get(posixpath.normpath(posixpath.join(cwd, path)))
        return "" if source is None else rel_posix(source, root)

    return tree


def same_module(record: Mapping[str, object], current: Mapping[str, object]) -> bool:
    """Whether a stored ``record`` is of the module ``current`` is the record of: the same
    hardware and module name, or the same hardware and source file (a renamed module)."""
    if record.get("schema") != RECORD_SCHEMA or record.get("hardware") != current.get("hardware"):
        return False
    return record.get("module") == current.get("module") or (
        bool(record.get("source")) and record.get("source") == current.get("source")
    )


def nearest(
    current: Mapping[str, object], stored: Iterable[Stored]
) -> tuple[Stored, tuple[Change, ...]] | None:
    """The stored record of the same module (:func:`same_module`) with the fewest
    differences from ``current``, and those differences; ties go to an entry stored by the
    same target, then to the smaller key. None when no stored record is of this module."""
    best: tuple[tuple[int, bool, str], Stored, tuple[Change, ...]] | None = None
    for entry in stored:
        if not same_module(entry.record, current):
            continue
        changes = record_changes(current, entry.record)
        rank = (len(changes), entry.record.get("target") != current.get("target"), entry.key)
        if best is None or rank < best[0]:
            best = (rank, entry, changes)
    return None if best is None else (best[1], best[2])


def record_changes(
    current: Mapping[str, object], stored: Mapping[str, object]
) -> tuple[Change, ...]:
    """What ``stored`` (a stored entry's record) differs from ``current`` in, one
    :class:`Change` per difference, sorted by text (pure)."""
    changes = [
        *_scalar_changes(current, stored),
        *_toolchain_changes(current, stored),
        *_argv_changes(current, stored),
        *_env_changes(current.get("env"), stored.get("env")),
        *_input_changes(current, stored),
        *_flag_input_changes(current.get("flag_inputs"), stored.get("flag_inputs")),
        *_module_changes(current.get("modules"), stored.get("modules")),
        *_other_changes(current.get("other"), stored.get("other")),
    ]
    return tuple(sorted(set(changes), key=lambda c: (c.text, c.part)))


# ------------------------------------------------------------------------------ the parts


def _scalar_changes(
    current: Mapping[str, object], stored: Mapping[str, object]
) -> Iterator[Change]:
    simple: tuple[tuple[str, Part, str], ...] = (
        ("arch", "arch", "arch"),
        ("namespace", "namespace", "cache namespace"),
        ("plan_schema", "schema", "plan schema"),
        ("entry", "module", "entry file name"),
        ("artefact", "module", "artefact name"),
        ("layer_include", "layer include", "layer include"),
    )
    for name, part, label in simple:
        now, then = current.get(name), stored.get(name)
        if now != then:
            yield Change(part=part, text=f"{label} changed: {_shown(then)} -> {_shown(now)}")
    now, then = current.get("checkout"), stored.get("checkout")
    if now != then:
        yield Change(
            part="checkout",
            text=f"checkout changed (flags embed absolute paths): {_shown(then)} -> {_shown(now)}",
        )


def _toolchain_changes(
    current: Mapping[str, object], stored: Mapping[str, object]
) -> Iterator[Change]:
    """The toolchain's name, then which part of its identity (``<version> | host: <host
    compiler> | <digest>``, :func:`~metrale_orch.toolchain.probe.probe_toolchain`)."""
    if current.get("toolchain") != stored.get("toolchain"):
        yield Change(
            part="toolchain",
            text=f"toolchain changed: {_shown(stored.get('toolchain'))} -> "
            f"{_shown(current.get('toolchain'))}",
        )
    now, then = str(current.get("identity", "")), str(stored.get("identity", ""))
    if now == then:
        return
    (version, host, _), (old_version, old_host, _) = _identity(now), _identity(then)
    if version != old_version:
        was, now_line = _first_difference(old_version, version)
        yield Change(
            part="toolchain",
            text=f"toolchain compiler version changed: {_shown(was)} -> {_shown(now_line)}",
        )
    if host != old_host:
        yield Change(
            part="toolchain",
            text=f"toolchain host compiler changed: {_shown(old_host)} -> {_shown(host)}",
        )
    if version == old_version and host == old_host:
        yield Change(
            part="toolchain",
            text="toolchain identity changed with the same versions (the compilers' files, "
            "their dry run or the environment they read)",
        )


def _identity(text: str) -> tuple[str, str, str]:
    """(version, host compiler, digest) of a probed identity."""
    head, _, digest = text.rpartition(" | ")
    if not head:
        return text, "", ""
    version, _, host = head.partition(" | host: ")
    return version, host, digest


def _first_difference(old: str, new: str) -> tuple[str, str]:
    """The first line at which two texts differ, in each (the whole text when one ends)."""
    for a, b in zip(old.splitlines(), new.splitlines(), strict=False):
        if a != b:
            return a.strip(), b.strip()
    return old.strip(), new.strip()


def _argv_changes(current: Mapping[str, object], stored: Mapping[str, object]) -> Iterator[Change]:
    """Defines by name, then the other flags as a multiset (each word with its value); the
    arch's own words, the source and the output are other parts."""
    now_arch, old_arch = str(current.get("arch", "")), str(stored.get("arch", ""))
    names = {str(current.get(n, "")) for n in ("entry", "artefact")}
    names |= {str(stored.get(n, "")) for n in ("entry", "artefact")}
    old_argv = [_rearched(w, old_arch, now_arch) for w in _strings(stored.get("argv"))]
    now_opts = _options(list(_strings(current.get("argv"))), names)
    old_opts = _options(old_argv, names)
    now_defs, now_rest = _split_defines(now_opts)
    old_defs, old_rest = _split_defines(old_opts)
    for name in sorted(now_defs.keys() | old_defs.keys()):
        now, then = now_defs.get(name), old_defs.get(name)
        if then is None:
            yield Change(part="define", text=f"define added: {now}")
        elif now is None:
            yield Change(part="define", text=f"define removed: {then}")
        elif _value(now) != _value(then):
            yield Change(
                part="define",
                text=f"define {name} changed: {_shown(_value(then))} -> {_shown(_value(now))}",
            )
    added = Counter(now_rest) - Counter(old_rest)
    removed = Counter(old_rest) - Counter(now_rest)
    for option in sorted(added):
        yield Change(part="flag", text=f"flag added: {option}")
    for option in sorted(removed):
        yield Change(part="flag", text=f"flag removed: {option}")
    if not added and not removed and now_rest != old_rest:
        yield Change(part="flag", text="flag order changed: " + " ".join(now_rest))


def _rearched(word: str, old: str, new: str) -> str:
    """``word`` of the stored argv with the stored arch spelled as the current one (the
    arch is its own part: ``-arch=sm_90a`` is not also a flag change)."""
    if not old or old == new or old not in word:
        return word
    word = word.replace(old, new)
    if old.startswith("sm_") and new.startswith("sm_"):
        word = word.replace("compute_" + old[3:], "compute_" + new[3:])
    return word


def _options(argv: Sequence[str], names: set[str]) -> list[str]:
    """The argv's options after the program, each flag with its separate value, without the
    source and output names."""
    out: list[str] = []
    words = list(argv[1:])
    i = 0
    while i < len(words):
        word = words[i]
        if word in _VALUED and i + 1 < len(words):
            option = f"{word} {words[i + 1]}"
            i += 2
        else:
            option = word
            i += 1
        if option in names or (option.startswith("-o ") and option[3:] in names):
            continue
        out.append(option)
    return out


def _split_defines(options: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(name -> each define as written, ``NAME`` or ``NAME=value``; the other options); the
    last define of a name wins."""
    defines: dict[str, str] = {}
    rest: list[str] = []
    for option in options:
        body = ""
        for flag in _DEFINE_FLAGS:
            for glue in (" ", "=", ""):
                if glue == "" and flag != "-D":
                    continue
                if option.startswith(flag + glue) and len(option) > len(flag + glue):
                    body = option[len(flag + glue) :]
                    break
            if body:
                break
        if not body:
            rest.append(option)
            continue
        defines[body.partition("=")[0]] = body
    return defines, rest


def _value(define: str) -> str:
    """The value a define gives its name (``-DX`` defines X as 1)."""
    _, eq, value = define.partition("=")
    return value if eq else "1"


def _env_changes(now: object, then: object) -> Iterator[Change]:
    current = now if isinstance(now, Mapping) else {}
    stored = then if isinstance(then, Mapping) else {}
    for name in sorted(current.keys() | stored.keys()):
        if name not in stored:
            yield Change(part="environment", text=f"environment {name} set")
        elif name not in current:
            yield Change(part="environment", text=f"environment {name} unset")
        elif current[name] != stored[name]:
            yield Change(part="environment", text=f"environment {name} changed")


def _input_changes(current: Mapping[str, object], stored: Mapping[str, object]) -> Iterator[Change]:
    """The closure's files: the module's source, else a header, by the tree file it was
    staged from (its path below the module's directory when unknown)."""
    now = _inputs(current.get("inputs"))
    then = _inputs(stored.get("inputs"))
    entry = str(current.get("entry", ""))
    for path in sorted(now.keys() | then.keys()):
        got, had = now.get(path), then.get(path)
        shown = (got or had or ("", ""))[1] or path
        kind: Part = "source" if path == entry else "header"
        if had is None:
            yield Change(part=kind, text=f"{kind} {shown} now included")
        elif got is None:
            yield Change(part=kind, text=f"{kind} {shown} no longer included")
        elif got[0] != had[0]:
            yield Change(part=kind, text=f"{kind} {shown} changed")


def _inputs(value: object) -> dict[str, tuple[str, str]]:
    """path -> (digest, tree file) of a record's ``inputs``."""
    out: dict[str, tuple[str, str]] = {}
    for item in value if isinstance(value, list) else ():
        if isinstance(item, list) and len(item) == 3 and all(isinstance(x, str) for x in item):
            out[item[0]] = (item[1], item[2])
    return out


def _flag_input_changes(now: object, then: object) -> Iterator[Change]:
    current, stored = dict(_pairs(now)), dict(_pairs(then))
    for path in sorted(current.keys() | stored.keys()):
        if current.get(path) != stored.get(path):
            state = (
                "now read"
                if path not in stored
                else "no longer read"
                if path not in current
                else "changed"
            )
            yield Change(part="flag input", text=f"file named by a flag {path} {state}")


def _module_changes(now: object, then: object) -> Iterator[Change]:
    """The modules a target builds, by name (a :func:`plan_record`'s ``modules``)."""
    current, stored = set(_strings(now)), set(_strings(then))
    for name in sorted(current - stored):
        yield Change(part="module", text=f"added {name}")
    for name in sorted(stored - current):
        yield Change(part="module", text=f"removed {name}")


def _other_changes(now: object, then: object) -> Iterator[Change]:
    current = now if isinstance(now, Mapping) else {}
    stored = then if isinstance(then, Mapping) else {}
    for name in sorted(current.keys() | stored.keys()):
        if current.get(name) != stored.get(name):
            yield Change(part="other", text=f"key part {name} changed")


# ------------------------------------------------------------------------------ small helpers


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, list | tuple):
        for item in value:
            yield str(item)


def _pairs(value: object) -> Iterator[tuple[str, str]]:
    if isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, list | tuple) and len(item) >= 2:
                yield str(item[0]), str(item[1])


def _shown(value: object) -> str:
    """A value in a line: quoted where spaces or emptiness would hide it."""
    text = "" if value is None else str(value)
    if not text:
        return "(none)"
    return shlex.quote(text) if any(c.isspace() for c in text) else text
