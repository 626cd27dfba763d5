"""Shadow drops (SPEC 3.3.2): the kernels a leaf source drops from its common namesake.

A leaf source that wins over a common source of the same stem replaces it
whole, not kernel by kernel: a kernel the common file defines and the leaf
fork lacks is not compiled for that target. This module finds those kernels
on the staged texts, so the manifest can record them (``shadowed_dropped``)
and the build can warn about every pair a ``[shadow_exempt]`` table does not
list.

What a file defines is read as the reference build reads it (a source-level
scan, never the compiler):

- an entry point is ``__global__`` as a whole word followed by whitespace
  (in a ``.metal`` root: ``kernel`` at the start of a line, blanks allowed
  before it), then the declarator's name: ``__launch_bounds__(...)`` is
  stepped over, and ``NAME(args)(`` is a paste macro whose arguments are
  expanded, then pasted (``CONCAT(KERNEL_NAME, _64)``, as the two-level
  ``CONCAT``/``CONCAT_`` idiom does);
- quoted includes are followed up to :data:`MAX_INCLUDE_DEPTH` levels (each
  file once), next to the including file, then from the compile's ``-I``
  directories; the dialect is the root file's;
- object-like ``#define NAME value`` bindings (first one wins, across the
  root and everything it includes) rename a name up to
  :data:`MAX_MACRO_HOPS` times; a function-like macro whose body declares a
  kernel declares one per invocation in the same file
  (``#define INST(K) __global__ void wy##K(...)`` + ``INST(5)`` is ``wy5``);
- ``#if`` and its kin are ignored: every branch counts, on both sides (a
  common kernel compiled out for the target is still reported; a leaf kernel
  compiled out still counts as present).

The analysis never decides what is compiled or cached: it reads the stage
after staging and only produces manifest entries and warnings.

Pure: :func:`entry_points`, :func:`missing_kernels`, :func:`shadow_drops`,
:func:`shadow_exemptions`, :func:`drop_warnings`. I/O: :func:`scan_drops`
(reads the staged files).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from metrale_orch.errors import printable
from metrale_orch.paths import root_relative
from metrale_orch.steps.staging import StagedTarget, role_dir
from metrale_orch.tree import Entry, Layout, Role

__all__ = [
    "MAX_INCLUDE_DEPTH",
    "MAX_MACRO_HOPS",
    "Dialect",
    "Drop",
    "Exemptions",
    "Reader",
    "drop_warnings",
    "entry_points",
    "missing_kernels",
    "scan_drops",
    "shadow_drops",
    "shadow_exemptions",
]

#: How deep quoted includes are followed below the root file (each file is read once).
MAX_INCLUDE_DEPTH = 8
#: How many times a name is rewritten through object-like ``#define``s.
MAX_MACRO_HOPS = 8

#: How a root file spells an entry point: ``__global__`` (CUDA, HIP) or ``kernel`` (Metal).
Dialect = Literal["cuda", "metal"]

#: A stage-relative POSIX path -> the file's text, or None when there is no such file.
Reader = Callable[[str], str | None]

_KEYWORD: Mapping[Dialect, str] = {"cuda": "__global__", "metal": "kernel"}
_BLANKS = " \t\n\r\f\v"


def _dialect_of(name: str) -> Dialect:
    return "metal" if name.endswith(".metal") else "cuda"


def _is_ident_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def _is_ident(text: str) -> bool:
    return bool(text) and all(map(_is_ident_char, text)) and not text[0].isdigit()


# --------------------------------------------------------------------------- one file


@dataclass(slots=True)
class _FnMacro:
    params: list[str]
    body: str


@dataclass(slots=True)
class _Scan:
    """What a root file and everything it includes declare, unexpanded."""

    #: object-like ``#define NAME value``; the first definition wins.
    defines: dict[str, str]
    #: each declaration's name as written: a name, or the arguments of a paste macro.
    decls: list[str | tuple[str, ...]]


def entry_points(
    path: str,
    read: Reader,
    *,
    dirs: Sequence[str] = (),
    dialect: Dialect | None = None,
) -> frozenset[str]:
    """The kernel entry points the file at stage path ``path`` defines (pure given ``read``).

    ``dirs`` are the compile's stage-relative ``-I`` directories, searched after
    the including file's own directory; ``dialect`` defaults to the root's
    extension. A file ``read`` cannot supply defines nothing.
    """
    scan = _Scan(defines={}, decls=[])
    _walk(
        posixpath.normpath(path),
        dialect or _dialect_of(path),
        0,
        read,
        tuple(dirs),
        set(),
        scan,
    )
    out: set[str] = set()
    for decl in scan.decls:
        name = _resolve(decl, scan.defines)
        if name is not None:
            out.add(name)
    return frozenset(out)


def missing_kernels(
    common: str,
    leaf: str,
    read: Reader,
    *,
    common_dirs: Sequence[str] = (),
    leaf_dirs: Sequence[str] = (),
) -> tuple[str, ...]:
    """The kernels the common file defines and the leaf file does not, sorted (pure given
    ``read``); both are stage paths, searched with their own ``-I`` directories."""
    dialect = _dialect_of(leaf)
    have = entry_points(leaf, read, dirs=leaf_dirs, dialect=dialect)
    return tuple(sorted(entry_points(common, read, dirs=common_dirs, dialect=dialect) - have))


def _walk(
    path: str,
    dialect: Dialect,
    depth: int,
    read: Reader,
    dirs: tuple[str, ...],
    seen: set[str],
    scan: _Scan,
) -> None:
    if depth > MAX_INCLUDE_DEPTH or path in seen:
        return
    seen.add(path)
    text = read(path)
    if text is None:
        return
    here = posixpath.dirname(path)
    includes: list[str] = []
    fn_macros: dict[str, _FnMacro] = {}
    # Declarations are looked for in everything but directives, except that an
    # object-like #define stays (its value may spell a declaration) and the bodies
    # of kernel-declaring function-like macros go (they are expanded per use).
    decl_text: list[str] = []
    logical: list[str] = []
    for line in text.split("\n"):
        stripped = line.rstrip()
        logical.append(stripped.rstrip("\\"))
        if stripped.endswith("\\"):
            logical.append("\n")
            continue
        directive = "".join(logical)
        logical = []
        trimmed = directive.lstrip()
        if not trimmed.startswith("#"):
            decl_text.append(directive)
            continue
        rest = trimmed[1:].lstrip()
        if rest.startswith("define"):
            if not _record_define(rest[len("define") :], dialect, scan.defines, fn_macros):
                decl_text.append(directive)
        elif rest.startswith("include"):
            name = _quoted(rest[len("include") :])
            if name is not None:
                includes.append(name)
    _collect_decls("\n".join(decl_text) + "\n", dialect, scan.decls)
    _collect_instantiations(text, dialect, fn_macros, scan.decls)
    for name in includes:
        found = _find_include(name, here, dirs, read)
        if found is not None:
            _walk(found, dialect, depth + 1, read, dirs, seen, scan)


def _find_include(name: str, here: str, dirs: tuple[str, ...], read: Reader) -> str | None:
    """The stage path a quoted include names: next to the including file, then each
    ``-I`` directory; None when it is not staged (a system header, or outside the stage)."""
    if name.startswith("/"):
        return None
    for base in (here, *dirs):
        cand = posixpath.normpath(posixpath.join(base, name))
        if cand == ".." or cand.startswith("../"):
            continue
        if read(cand) is not None:
            return cand
    return None


def _quoted(body: str) -> str | None:
    """The name of ``#include "name"`` (angled includes are system headers: not followed)."""
    body = body.lstrip()
    if not body.startswith('"'):
        return None
    end = body.find('"', 1)
    return body[1:end] if end > 0 else None


def _record_define(
    body: str, dialect: Dialect, defines: dict[str, str], fn_macros: dict[str, _FnMacro]
) -> bool:
    """Record one ``#define``; True when it is a kernel-declaring function-like macro
    (its body then stays out of the declaration scan)."""
    if body[:1] in (" ", "\t"):
        body = body[1:]
    n = 0
    while n < len(body) and _is_ident_char(body[n]):
        n += 1
    if n == 0:
        return False
    name, rest = body[:n], body[n:]
    if rest.startswith("("):
        close = _balanced_end(rest, 0)
        if close is None:
            return False
        macro_body = rest[close:]
        if _KEYWORD[dialect] not in macro_body:
            return False
        params = [p.strip() for p in rest[1 : close - 1].split(",") if p.strip()]
        fn_macros[name] = _FnMacro(params=params, body=macro_body)
        return True
    defines.setdefault(name, rest.strip())
    return False


def _collect_decls(text: str, dialect: Dialect, out: list[str | tuple[str, ...]]) -> None:
    """Every declaration's name expression, as written, in ``text``."""
    keyword = _KEYWORD[dialect]
    start = 0
    while True:
        idx = text.find(keyword, start)
        if idx < 0:
            return
        start = idx + 1
        end = idx + len(keyword)
        if idx > 0 and _is_ident_char(text[idx - 1]):
            continue
        if end >= len(text) or text[end] not in _BLANKS:
            continue
        if dialect == "metal":
            before = text[:idx].rstrip(" \t")
            if before and not before.endswith("\n"):
                continue
        expr = _name_expr(text[end:])
        if expr is not None:
            out.append(expr)


def _name_expr(tail: str) -> str | tuple[str, ...] | None:
    """The declarator's name after the keyword: a name, or a paste macro's arguments."""
    pos = 0
    for _ in range(MAX_MACRO_HOPS):
        open_ = tail.find("(", pos)
        if open_ < 0:
            return None
        head = tail[pos:open_].split()
        ident = head[-1].lstrip("*") if head else ""
        if not _is_ident(ident):
            return None
        close = _balanced_end(tail, open_)
        if close is None:
            return None
        if ident == "__launch_bounds__":
            pos = close
            continue
        # ``NAME(...)(``: the first list is a paste macro's arguments, the second the
        # kernel's parameters. ``NAME(...)``: NAME is the kernel.
        if tail[close:].lstrip().startswith("("):
            args = tuple(a.strip() for a in tail[open_ + 1 : close - 1].split(",") if a.strip())
            return args or None
        return ident
    return None


def _balanced_end(text: str, open_: int) -> int | None:
    """The index just past the ``)`` matching the ``(`` at ``open_``."""
    depth = 0
    for i in range(open_, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _collect_instantiations(
    text: str,
    dialect: Dialect,
    fn_macros: Mapping[str, _FnMacro],
    out: list[str | tuple[str, ...]],
) -> None:
    """The kernels kernel-declaring function-like macros declare, one per invocation."""
    for name in sorted(fn_macros):
        mac = fn_macros[name]
        for args in _invocations(text, name):
            if len(args) != len(mac.params):
                continue
            body = mac.body
            for param, arg in zip(mac.params, args, strict=True):
                body = _replace_word(body, param, arg)
            _collect_decls(body.replace("##", ""), dialect, out)


def _replace_word(text: str, word: str, replacement: str) -> str:
    """``text`` with every whole-word ``word`` replaced (a macro parameter by its argument)."""
    pattern = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(word) + r"(?![A-Za-z0-9_])")
    return pattern.sub(lambda _m: replacement, text)


def _invocations(text: str, name: str) -> list[list[str]]:
    """The argument lists of every ``name(...)`` outside a directive line."""
    out: list[list[str]] = []
    start = 0
    while True:
        idx = text.find(name, start)
        if idx < 0:
            return out
        start = idx + 1
        if idx > 0 and _is_ident_char(text[idx - 1]):
            continue
        line_start = text.rfind("\n", 0, idx) + 1
        if text[line_start:idx].lstrip().startswith("#"):
            continue
        after = idx + len(name)
        if not text.startswith("(", after):
            continue
        close = _balanced_end(text, after)
        if close is None:
            continue
        out.append([a.strip() for a in text[after + 1 : close - 1].split(",")])


def _resolve(decl: str | tuple[str, ...], defines: Mapping[str, str]) -> str | None:
    """The identifier the compiler emits for a declaration's name expression."""
    if isinstance(decl, str):
        return _expand(decl, defines)
    parts = [_expand(arg, defines) for arg in decl]
    if any(p is None for p in parts):
        return None
    name = "".join(p for p in parts if p is not None)
    return name if _is_ident(name) else None


def _expand(token: str, defines: Mapping[str, str]) -> str | None:
    """``token`` rewritten through the object-like defines, at most MAX_MACRO_HOPS times.

    Only the character set is checked, so a paste argument such as ``64`` passes
    (:func:`_resolve` checks a pasted whole).
    """
    cur = token
    for _ in range(MAX_MACRO_HOPS):
        nxt = defines.get(cur)
        if nxt is None or nxt == cur:
            break
        cur = nxt.strip()
    return cur if cur and all(map(_is_ident_char, cur)) else None


# --------------------------------------------------------------------------- a target


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Drop:
    """A kernel of a common source that the leaf source of the same stem lacks."""

    #: The module's name (after ``[modules]`` renames), as the manifest and
    #: ``[shadow_exempt]`` name it.
    module: str
    kernel: str
    #: The winning leaf source and the common source it replaces, in the tree.
    leaf: Path
    common: Path


def shadow_drops(
    layout: Layout,
    names: Mapping[str, str],
    read: Reader,
    *,
    dirs: Callable[[str, Entry], Sequence[str]] | None = None,
) -> tuple[Drop, ...]:
    """Every kernel that ``layout``'s leaf sources drop from their common namesakes, sorted
    by (module, kernel) (pure given ``read``, which reads the target's stage).

    ``names`` maps each module's stem to its name; ``dirs`` gives the stage-relative
    ``-I`` directories a root file (its role directory, its entry) is searched with
    (default: the role directory alone).
    """
    ext = layout.hardware.source_ext
    common_dir = role_dir(layout, Role.COMMON)
    leaf_dir = role_dir(layout, Role.LEAF)
    out: list[Drop] = []
    for stem, entry in layout.modules():
        if layout.role_of(entry) is not Role.LEAF:
            continue
        common = layout.common.get(f"{stem}.{ext}")
        if common is None:
            continue
        kernels = missing_kernels(
            f"{common_dir}/{common.name}",
            f"{leaf_dir}/{entry.name}",
            read,
            common_dirs=dirs(common_dir, common) if dirs else (common_dir,),
            leaf_dirs=dirs(leaf_dir, entry) if dirs else (leaf_dir,),
        )
        module = names.get(stem, stem)
        out.extend(
            Drop(module=module, kernel=k, leaf=entry.source, common=common.source) for k in kernels
        )
    return tuple(sorted(out))


def scan_drops(
    layout: Layout,
    staged: StagedTarget,
    names: Mapping[str, str],
    *,
    dirs: Callable[[str, Entry], Sequence[str]] | None = None,
) -> tuple[Drop, ...]:
    """:func:`shadow_drops` over the staged files of ``staged`` (I/O: reads the stage).

    Only files the stage holds are read; an unreadable one defines nothing.
    """
    texts: dict[str, str | None] = {}

    def read(rel: str) -> str | None:
        if rel not in staged.hashes:
            return None
        if rel not in texts:
            try:
                data = (staged.dir / rel).read_bytes()
            except OSError:
                texts[rel] = None
            else:
                texts[rel] = data.decode("utf-8", "replace")
        return texts[rel]

    return shadow_drops(layout, names, read, dirs=dirs)


# --------------------------------------------------------------------------- exemptions


@dataclass(frozen=True, slots=True, kw_only=True)
class Exemptions:
    """``[shadow_exempt]`` of a target's KERNEL.toml files, unioned."""

    #: (module, kernel) pairs exempted from the drop warning.
    pairs: frozenset[tuple[str, str]]
    #: (file, key, problem) of each malformed entry, in file then key order.
    problems: tuple[tuple[str, str, str], ...] = ()


_EXAMPLE = '["<kernel>", ...]'


def shadow_exemptions(docs: Iterable[tuple[str, Mapping[str, object]]]) -> Exemptions:
    """The union of ``[shadow_exempt] <module> = ["<kernel>", ...]`` over ``docs``
    (root-relative path, parsed KERNEL.toml), and every malformed entry (pure).

    A table that is not a table, a value that is not an array, or an element
    that is not a kernel name (an identifier) is a problem naming the file and
    the key; the caller raises the first (the build) or reports them all (check).
    """
    pairs: set[tuple[str, str]] = set()
    problems: list[tuple[str, str, str]] = []
    for path, doc in docs:
        table = doc.get("shadow_exempt")
        if table is None:
            continue
        where = printable(path)
        if not isinstance(table, Mapping):
            problems.append((where, "[shadow_exempt]", f"must be a table of <module> = {_EXAMPLE}"))
            continue
        for module, kernels in table.items():
            key = f"[shadow_exempt] {_toml_key(module)}"
            if not isinstance(kernels, list):
                problems.append(
                    (
                        where,
                        key,
                        f"must be an array of kernel names, e.g. {_toml_key(module)} = "
                        f'["{module}_fast"], got {_got(kernels)} (quote a module name '
                        "holding a dot)",
                    )
                )
                continue
            for i, kernel in enumerate(kernels):
                if not isinstance(kernel, str) or not _is_ident(kernel):
                    problems.append(
                        (
                            where,
                            f"{key}[{i}]",
                            f"must be a kernel name (an identifier), got {_got(kernel)}",
                        )
                    )
                    continue
                pairs.add((module, kernel))
    return Exemptions(pairs=frozenset(pairs), problems=tuple(problems))


def _got(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    return f"{type(value).__name__} {value!r}"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(name: str) -> str:
    return name if _BARE_KEY.fullmatch(name) else '"' + name.replace('"', '\\"') + '"'


def drop_warnings(
    target: str, drops: Iterable[Drop], exempt: Exemptions, root: Path
) -> tuple[str, ...]:
    """One warning line per drop that ``exempt`` does not list, naming the target, the
    module, the kernel and both files (pure; paths root-relative)."""
    out: list[str] = []
    for drop in sorted(drops):
        if (drop.module, drop.kernel) in exempt.pairs:
            continue
        key = _toml_key(drop.module)
        out.append(
            printable(
                f"{target}: module {drop.module} drops kernel {drop.kernel}: "
                f"{root_relative(drop.leaf, root)} replaces "
                f"{root_relative(drop.common, root)}, which defines "
                f'it; if intended, list it in a KERNEL.toml: [shadow_exempt] {key} = ["'
                f'{drop.kernel}"]'
            )
        )
    return tuple(out)
