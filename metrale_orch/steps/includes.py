"""A module's include closure, found textually over its stage (pure but for two readers).

:func:`parse_includes` lists every ``#include "..."``, ``#include <...>`` and
``__has_include(...)`` of a file, whatever ``#if`` branch it sits in (the
source is never preprocessed); :func:`include_dirs` is the compiler's search
order; :func:`resolve_closure` walks the include graph over the staged files;
:func:`module_closure` is the one closure of a module as its action key sees
it (also what ``rdeps`` reports). A quoted name resolves from the including
file's directory, then from the ``-I`` directories; an angled name from the
``-I`` directories. Only staged files can resolve; an unresolved name is a
system or toolkit header (covered by the toolchain identity). A computed
include (``#include MACRO``) makes the closure every staged file.
I/O: :func:`scan_includes` (reads the stage), :func:`effective_flags` (reads options files).
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.steps.deps import flag_files, flag_values
from metrale_orch.steps.errors import StageError
from metrale_orch.steps.plan_values import ModulePlan, TargetPlan
from metrale_orch.steps.staging import StagedTarget
from metrale_orch.tree.beyond import DIRECTIVE, SPLICE_RE

__all__ = [
    "Closure",
    "EdgeMemo",
    "Includes",
    "effective_flags",
    "include_dirs",
    "module_closure",
    "parse_includes",
    "pre_includes",
    "read_files_of",
    "resolve_closure",
    "scan_includes",
]

_INCLUDE_RE = re.compile(
    DIRECTIVE + rb'(?:"(?P<q>[^"\n]+)"|<(?P<a>[^>\n]+)>|(?P<c>[A-Za-z_]))', re.MULTILINE
)
_HAS_INCLUDE_RE = re.compile(
    rb'__has_include(?:_next)?\s*\(\s*(?:"(?P<q>[^"\n]+)"|<(?P<a>[^>\n]+)>)'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Includes:
    """The include names one file mentions (textually, every branch)."""

    quoted: tuple[str, ...] = ()
    angled: tuple[str, ...] = ()
    computed: bool = False


def parse_includes(data: bytes) -> Includes:
    """Every include directive of a file, in any ``#if`` branch (pure).

    Line splices are joined first; ``%:`` digraphs, form feeds and ``/* */``
    comments around the ``#`` are understood. Directives are matched per line, so
    a ``//``-commented one is skipped while one inside a ``/* */`` block counts
    (more, never less). This is the key's fast first guess: a hit is verified
    against what the compiler itself read (:mod:`metrale_orch.steps.deps`).
    """
    if b"\\" in data:
        data = SPLICE_RE.sub(b"", data)
    quoted: list[str] = []
    angled: list[str] = []
    computed = False
    for regex in (_INCLUDE_RE, _HAS_INCLUDE_RE):
        for m in regex.finditer(data):
            groups = m.groupdict()
            if groups.get("q"):
                quoted.append(groups["q"].decode("utf-8", "replace"))
            elif groups.get("a"):
                angled.append(groups["a"].decode("utf-8", "replace"))
            elif groups.get("c"):
                computed = True
    return Includes(
        quoted=tuple(dict.fromkeys(quoted)), angled=tuple(dict.fromkeys(angled)), computed=computed
    )


#: Directory options whose value may be glued to the option (``-Iinc``).
_GLUED_DIR_FLAGS = ("-I", "-isystem", "-iquote", "-idirafter")


def include_dirs(cwd: str, flags: Sequence[str], after: Sequence[str] = ()) -> tuple[str, ...]:
    """Stage-relative include directories of a compile in ``cwd``, in the compiler's
    search order (pure): ``-iquote`` ones, the ``-I`` ones of ``flags`` (which precede the
    role directory on the command line), the role directory itself (``-I.``), the ``-I``
    ones of ``after`` (flags placed after it), then ``-isystem`` and ``-idirafter`` ones.
    Absolute directories lie outside the stage and are skipped (files read there are
    recorded and verified by content). Remembered: every module of a target in the same
    directory asks with the same flags (a tenth of a target's preparation before).
    """
    return _include_dirs(cwd, tuple(flags), tuple(after))


@functools.lru_cache(maxsize=4096)
def _include_dirs(cwd: str, flags: tuple[str, ...], after: tuple[str, ...]) -> tuple[str, ...]:
    both = [*flags, *after]

    def rel(words: Sequence[str], names: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for _, value in flag_values(words, names, glued=_GLUED_DIR_FLAGS):
            for part in value.split(","):
                if part and not part.startswith("/"):
                    out.append(posixpath.normpath(posixpath.join(cwd, part)))
        return out

    dirs = [
        *rel(both, ("-iquote",)),
        *rel(flags, ("-I", "--include-path")),
        cwd,
        *rel(after, ("-I", "--include-path")),
        *rel(both, ("-isystem", "--system-include")),
        *rel(both, ("-idirafter",)),
    ]
    return tuple(dict.fromkeys(dirs))


#: Options whose value names the host compiler (a program or its directory).
_CCBIN_FLAGS = ("-ccbin", "--compiler-bindir")


def effective_flags(
    plan: TargetPlan, cwd_abs: str, switches_extra: Sequence[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the words the compiler sees before the role directory's ``-I.``, those after it)
    (I/O: reads options files): ``NVCC_PREPEND_FLAGS``, the target's flags with every
    options file expanded in place (nested ones too), then ``$METRALE_EXTRA_NVCC_FLAGS``
    and ``NVCC_APPEND_FLAGS``; ``-Xcompiler=a,b`` contributes ``a`` and ``b``. What the
    key's include scan must search, beyond ``plan.flags`` alone."""
    env = plan.env

    def split(text: str) -> list[str]:
        try:
            return shlex.split(text)
        except ValueError:
            return text.split()

    before = [*split(env.get("NVCC_PREPEND_FLAGS", "")), *plan.flags]
    after = [*switches_extra, *split(env.get("NVCC_APPEND_FLAGS", ""))]
    return (
        tuple(_expand_words(before, cwd_abs, split)),
        tuple(_expand_words(after, cwd_abs, split)),
    )


def _expand_words(
    words: Sequence[str], cwd_abs: str, split: Callable[[str], list[str]], depth: int = 0
) -> Iterator[str]:
    it = iter(words)
    for word in it:
        yield word
        value = None
        if word in ("--options-file", "-optf"):
            value = next(it, None)
            if value is not None:
                yield value
        elif word.startswith(("--options-file=", "-optf=")):
            value = word.split("=", 1)[1]
        elif word.startswith("-Xcompiler="):
            yield from word[len("-Xcompiler=") :].split(",")
        if value is None or depth >= 8:
            continue
        for name in value.split(","):
            path = name if name.startswith("/") else os.path.join(cwd_abs, name)
            try:
                text = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
            except OSError:
                continue
            yield from _expand_words(split(text), cwd_abs, split, depth + 1)


def read_files_of(words: Sequence[str]) -> tuple[str, ...]:
    """Files the compiler reads because of ``words`` (pure; as written): options files,
    ``-include``/``-imacros`` files, ``@response`` files, and the host compiler a
    ``-ccbin`` names. Remembered, as :func:`include_dirs` is: a target's modules ask with
    the same words."""
    return _read_files_of(tuple(words))


@functools.lru_cache(maxsize=4096)
def _read_files_of(words: tuple[str, ...]) -> tuple[str, ...]:
    out = list(flag_files(words))
    it = iter(words)
    for word in it:
        if word.startswith("@") and len(word) > 1:
            out.append(word[1:])
        for name in _CCBIN_FLAGS:
            if word == name:
                nxt = next(it, None)
                if nxt:
                    out.append(nxt)
            elif word.startswith(name + "="):
                out.append(word[len(name) + 1 :])
    return tuple(dict.fromkeys(out))


def pre_includes(flags: Sequence[str]) -> tuple[str, ...]:
    """Files flags make the compiler read: ``-include``/``--pre-include``, ``-imacros``,
    ``--options-file``/``-optf`` (pure; as written)."""
    return tuple(flag_files(flags))


def _inside(path: str) -> bool:
    return path not in (".", "") and not path.startswith("../") and path != ".."


#: Per search path, each staged file's resolved includes (None: a computed include):
#: what :func:`resolve_closure` may keep between calls over the same stage and scan.
EdgeMemo = dict[tuple[str, ...], dict[str, "tuple[str, ...] | None"]]


def resolve_closure(
    roots: Sequence[str],
    *,
    staged: Mapping[str, str],
    includes_of: Mapping[str, Includes],
    dirs: Sequence[str],
    memo: EdgeMemo | None = None,
) -> tuple[str, ...]:
    """The stage-relative files reachable from ``roots`` (pure; sorted).

    ``staged`` maps every staged path to its hash; ``includes_of`` gives each
    staged file's include names. A computed include anywhere makes the
    closure every staged file. ``memo`` keeps each file's resolved includes for the
    next call: only for calls over the same ``staged`` keys and ``includes_of``
    (one target's modules).
    """
    dirs = tuple(dirs)
    edges = {} if memo is None else memo.setdefault(dirs, {})
    seen: set[str] = set()
    todo = [r for r in roots if r in staged]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path in edges:
            found = edges[path]
        else:
            found = edges[path] = _resolved(path, includes_of.get(path, Includes()), staged, dirs)
        if found is None:
            return tuple(sorted(staged))
        todo.extend(c for c in found if c not in seen)
    return tuple(sorted(seen))


def _resolved(
    path: str, inc: Includes, staged: Mapping[str, str], dirs: tuple[str, ...]
) -> tuple[str, ...] | None:
    """The staged files ``path``'s includes name, in include order (None: computed)."""
    if inc.computed:
        return None
    here = posixpath.dirname(path)
    out: list[str] = []
    for name, search in (
        *((q, (here, *dirs)) for q in inc.quoted),
        *((a, dirs) for a in inc.angled),
    ):
        if name.startswith("/"):
            continue
        for cand in _candidates(search, name):
            if cand in staged:
                out.append(cand)
                break
    return tuple(out)


@functools.lru_cache(maxsize=1 << 16)
def _candidates(search: tuple[str, ...], name: str) -> tuple[str, ...]:
    """Where ``name`` may be in the stage, in search order (pure, remembered: every
    target's modules resolve the same includes from the same directories)."""
    joined = (posixpath.normpath(posixpath.join(base, name)) for base in search)
    return tuple(cand for cand in joined if _inside(cand))


def scan_includes(
    stage: StagedTarget, memo: dict[str, Includes] | None = None
) -> dict[str, Includes]:
    """Parse the include lines of every staged file (reads the stage)."""
    out: dict[str, Includes] = {}
    memo = {} if memo is None else memo
    for rel, digest in stage.hashes.items():
        got = memo.get(digest)
        if got is None:
            try:
                got = parse_includes((stage.dir / rel).read_bytes())
            except OSError as exc:
                raise StageError(
                    str(stage.dir), rel, f"cannot read the staged file: {exc}"
                ) from None
            memo[digest] = got
        out[rel] = got
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Closure:
    """What one module's compile reads, as far as the scan can tell."""

    #: Stage-relative files reachable from the module's entry and the staged files its
    #: flags name (sorted).
    files: tuple[str, ...]
    #: Files its flags name that lie outside the stage (options, ``-include`` and
    #: ``@response`` files, the host compiler), as written, in flag order.
    outside: tuple[str, ...] = ()


def module_closure(
    module: ModulePlan,
    *,
    staged: Mapping[str, str],
    includes_of: Mapping[str, Includes],
    before: Sequence[str],
    after: Sequence[str] = (),
    layer_include: str = "",
    memo: EdgeMemo | None = None,
) -> Closure:
    """The include closure of ``module`` over the stage (pure): the one the action key
    hashes. ``staged`` maps each staged path to its hash (or any value: only its keys are
    read); ``before``/``after`` are the words the compiler sees before and after the role
    directory's ``-I.`` (:func:`effective_flags`; ``plan.flags`` alone for a plan-only
    view); ``layer_include`` is the ``-I`` of the module's layer directory under
    ``.tree/`` when the build adds one.
    """
    dirs = include_dirs(module.cwd, before, after)
    if layer_include:
        dirs = (*dirs, posixpath.normpath(posixpath.join(module.cwd, layer_include)))
    roots = [module.staged]
    outside: list[str] = []
    for path in read_files_of((*before, *after)):
        rel = posixpath.normpath(posixpath.join(module.cwd, path))
        if not path.startswith("/") and rel in staged:
            roots.append(rel)
        else:
            outside.append(path)
    files = resolve_closure(roots, staged=staged, includes_of=includes_of, dirs=dirs, memo=memo)
    return Closure(files=files, outside=tuple(outside))
