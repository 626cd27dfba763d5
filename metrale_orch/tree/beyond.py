"""Includes beyond the layout (SPEC 3.3.1): cross-model includes inside ``kernels/``.

Real trees reach across models: ``gb10/deepseek-v4-flash/nvfp4/kquant_moe.cu``
includes ``../../../gb10/qwen3.6-27b/nvfp4/q4k_vendor/mma.cuh``. The reference
compiles each module with ``-I<the module's layer directory>`` in the tree, so
a quoted include resolves next to the including file, then from that
directory. The stage is where metrale-orch compiles, so what the reference
reads from the tree is mirrored into the stage:

- every file so reached (and what it includes in turn) is staged at
  ``.tree/<its path under kernels/>`` (:data:`TREE_DIR`), and each module's
  compile gets ``-I<relative path to .tree/<its layer directory>>``, so the
  same spelling finds the mirrored copy; nothing outside the layout and these
  files is visible;
- such files are inputs of the target (file dependencies, key material, and
  checked by every run) like the layout's own;
- a quoted include that resolves outside ``kernels/`` (absolute, or by ``..``)
  is an error naming the file and line; one that resolves nowhere is left to
  the compiler (a system header).

:func:`find_beyond_layout` does the walk (I/O: reads the staged sources from the
tree and what they reach); :func:`layer_include` is the per-module ``-I``.
"""

from __future__ import annotations

import functools
import operator
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from metrale_orch.errors import MetraleError

__all__ = [
    "TREE_DIR",
    "Beyond",
    "EscapingInclude",
    "IncludeMemo",
    "find_beyond_layout",
    "layer_include",
]

#: Stage subdirectory mirroring the tree files reached beyond the layout.
TREE_DIR = ".tree"

#: Backslash-newline line splices, joined before directives are matched.
SPLICE_RE = re.compile(rb"\\[ \t]*\r?\n")
#: The start of an include directive, up to its operand: optional blanks and ``/* */``
#: comments, ``#`` or its digraph ``%:``, then ``include``/``include_next``/``import``
#: (the one spelling of it: the key's scan in ``compile`` builds on it too).
DIRECTIVE = (
    rb"^[ \t\f\v]*(?:/\*.*?\*/[ \t\f\v]*)*(?:#|%:)[ \t\f\v]*(?:/\*.*?\*/[ \t\f\v]*)*"
    rb"(?:include_next|include|import)\b[ \t\f\v]*(?:/\*.*?\*/[ \t\f\v]*)*"
)
_QUOTED_RE = re.compile(DIRECTIVE + rb'"(?P<q>[^"\n]+)"', re.MULTILINE)


class EscapingInclude(MetraleError):
    """A quoted include resolves outside ``kernels/``; names the file and the line."""

    exit_code = 2

    where: str
    line: int
    name: str
    resolved: str

    template = (
        '{where}:{line}: #include "{name}" resolves to {resolved}, outside kernels/; '
        "a kernel tree builds only its own files: copy the header into kernels/ "
        "(or include it with <...> from a system directory)"
    )


@dataclass(frozen=True, slots=True)
class Beyond:
    """What a target's compiles reach beyond its layout."""

    #: Path under ``kernels/`` (POSIX) -> the file in the tree, sorted.
    files: Mapping[str, Path] = field(default_factory=dict)
    #: Every escaping include found (all of them, in file then line order).
    errors: tuple[EscapingInclude, ...] = ()


@functools.lru_cache(maxsize=8192)
def quoted_includes(data: bytes) -> tuple[tuple[int, str], ...]:
    """(line number, name) of every quoted include directive of a file, any branch (pure;
    memoised by content: the targets of a tree share most of their files).

    Line splices are joined (numbers then count the joined lines), ``%:`` and
    comments around the ``#`` understood.
    """
    out: list[tuple[int, str]] = []
    if b"\\" in data:
        data = SPLICE_RE.sub(b"", data)
    for m in _QUOTED_RE.finditer(data):
        line = data.count(b"\n", 0, m.start()) + 1
        out.append((line, m.group("q").decode("utf-8", "surrogateescape")))
    return tuple(out)


def layer_include(cwd: str, layer_dir: str) -> str:
    """The ``-I`` value (relative to the module's working directory ``cwd``, both
    stage-relative) that makes ``.tree/<layer_dir>`` the module's layer directory (pure)."""
    return posixpath.relpath(posixpath.join(TREE_DIR, layer_dir), cwd)


class _ModuleWalk(NamedTuple):
    """A module's walk as :class:`IncludeMemo` keeps it."""

    #: The staged paths it looked up, and the tree file (absolute) each held, or None.
    rels: tuple[str, ...]
    trees: tuple[str | None, ...]
    #: The files beyond the layout it reached: (path under ``kernels/``, tree file).
    files: tuple[tuple[str, str], ...]
    #: Its escaping includes, in the walk's order.
    errors: tuple[EscapingInclude, ...]


#: What a module's walk depends on besides the stage: its staged source, that source's
#: tree file, its working directory, its layer directory (absolute), the allowed prefixes.
_WalkKey = tuple[str, str, str, str, tuple[str, ...]]


class IncludeMemo:
    """What the include walks of one pass share: each file's quoted includes, its name
    under the root, where an include spelling lands from a directory, which files exist,
    and each module's walk.

    A module's walk depends on the tree (fixed for the pass) and on the target's stage
    only through the staged paths it looks up; it is kept with those lookups and
    reused for another target whose stage answers each of them the same way (the
    way ccache's direct mode reuses a result whose recorded inputs are unchanged).
    One memo per pass over an unchanging tree (``check`` shares one across targets; a
    build step makes a fresh one per call)."""

    __slots__ = (
        "_abs",
        "_base",
        "_includes",
        "_is_file",
        "_joined",
        "_read",
        "_stage_joined",
        "_walks",
        "_where",
    )

    def __init__(self, kernels: Path, read: Callable[[Path], bytes]) -> None:
        self._base = os.path.dirname(os.path.abspath(kernels))
        self._read = read
        self._includes: dict[str, tuple[tuple[int, str], ...] | None] = {}
        self._where: dict[str, str] = {}
        self._is_file: dict[str, bool] = {}
        self._joined: dict[tuple[str, str], str] = {}
        self._stage_joined: dict[tuple[str, str], str] = {}
        self._abs: dict[Path, str] = {}
        self._walks: dict[_WalkKey, list[_ModuleWalk]] = {}

    def includes(self, path: str) -> tuple[tuple[int, str], ...] | None:
        """:func:`quoted_includes` of the file ``path``; None when it cannot be read."""
        try:
            return self._includes[path]
        except KeyError:
            pass
        try:
            found: tuple[tuple[int, str], ...] | None = quoted_includes(self._read(Path(path)))
        except OSError:
            found = None
        self._includes[path] = found
        return found

    def where(self, path: str) -> str:
        """``path`` relative to the root, POSIX (how an escaping include names its file)."""
        got = self._where.get(path)
        if got is None:
            got = self._where[path] = os.path.relpath(path, self._base).replace(os.sep, "/")
        return got

    def is_file(self, path: str) -> bool:
        got = self._is_file.get(path)
        if got is None:
            got = self._is_file[path] = os.path.isfile(path)
        return got

    def joined(self, directory: str, name: str) -> str:
        """``name`` from the tree directory ``directory``, normalised (``os.path``)."""
        key = (directory, name)
        got = self._joined.get(key)
        if got is None:
            got = self._joined[key] = os.path.normpath(os.path.join(directory, name))
        return got

    def stage_joined(self, directory: str, name: str) -> str:
        """``name`` from the stage directory ``directory``, normalised (POSIX)."""
        key = (directory, name)
        got = self._stage_joined.get(key)
        if got is None:
            got = posixpath.normpath(posixpath.join(directory, name))
            self._stage_joined[key] = got
        return got

    def absolute(self, path: Path) -> str:
        got = self._abs.get(path)
        if got is None:
            got = self._abs[path] = os.path.abspath(path)
        return got

    def known_walk(self, key: _WalkKey, stage: dict[str, str]) -> _ModuleWalk | None:
        """A walk kept for ``key`` whose every staged lookup ``stage`` (staged path ->
        tree file) answers the same way, or None."""
        walks = self._walks.get(key)
        if walks is not None:
            get = stage.get
            for walk in walks:
                if all(map(operator.eq, map(get, walk.rels), walk.trees)):
                    return walk
        return None

    def keep_walk(self, key: _WalkKey, walk: _ModuleWalk) -> None:
        self._walks.setdefault(key, []).append(walk)


def find_beyond_layout(
    kernels: Path,
    modules: Mapping[str, tuple[str, str]],
    staged: Mapping[str, Path],
    read: Callable[[Path], bytes],
    *,
    allow: Iterable[str] = (),
    memo: IncludeMemo | None = None,
) -> Beyond:
    """Walk the quoted includes of every module's compile and collect the tree files it
    reaches beyond the layout (see the module docstring).

    ``modules``: each module's staged source path -> (its working directory, its
    layer directory relative to ``kernels``), both stage-relative POSIX;
    ``staged``: staged path -> tree file (the layout's files); ``read`` returns a
    file's bytes; ``memo`` shares the files' includes and the modules' walks across
    the targets of one pass (``read`` is then the memo's). Never raises for the tree:
    escaping includes are returned, each once (as the first module to meet it
    resolves it).
    """
    memo = memo if memo is not None else IncludeMemo(kernels, read)
    base = os.path.abspath(kernels)
    allowed = tuple(os.path.abspath(a).rstrip(os.sep) + os.sep for a in allow)
    absolute = memo.absolute
    stage = {rel: absolute(path) for rel, path in staged.items()}
    files: dict[str, Path] = {}
    errors: dict[tuple[str, int, str], EscapingInclude] = {}
    layers: dict[str, str] = {}  # a target has a few layer directories, many modules
    for source, (cwd, layer_dir) in sorted(modules.items()):
        layer_abs = layers.get(layer_dir)
        if layer_abs is None:
            layer_abs = os.path.join(base, *layer_dir.split("/")) if layer_dir else base
            layers[layer_dir] = layer_abs
        key = (source, stage.get(source, ""), cwd, layer_abs, allowed)
        walk = memo.known_walk(key, stage)
        if walk is None:
            walk = _Walker(memo, stage, base, allowed).walk(source, cwd, layer_abs)
            memo.keep_walk(key, walk)
        for rel, tree in walk.files:
            if rel not in files:
                files[rel] = Path(tree)
        for err in walk.errors:
            errors.setdefault((err.where, err.line, err.name), err)
    return Beyond(
        files=dict(sorted(files.items())),
        errors=tuple(errors[k] for k in sorted(errors)),
    )


class _Walker:
    """One module's walk over the quoted includes its compile reads, recording the staged
    paths it looks up (what makes the walk reusable, see :class:`IncludeMemo`)."""

    __slots__ = ("allowed", "base", "lookups", "memo", "prefix", "stage")

    def __init__(
        self, memo: IncludeMemo, stage: dict[str, str], base: str, allowed: tuple[str, ...]
    ) -> None:
        self.memo = memo
        self.stage = stage
        self.base = base
        self.prefix = base + os.sep
        self.allowed = allowed
        self.lookups: dict[str, str | None] = {}

    def staged(self, rel: str) -> str | None:
        got = self.stage.get(rel)
        self.lookups[rel] = got
        return got

    def walk(self, source: str, cwd: str, layer_abs: str) -> _ModuleWalk:
        memo, prefix, allowed = self.memo, self.prefix, self.allowed
        files: dict[str, str] = {}
        errors: list[EscapingInclude] = []
        # (staged path or None, tree path) of each file this module's compile reads
        todo: list[tuple[str | None, str]] = [(source, self.stage.get(source, ""))]
        seen: set[str] = set()
        while todo:
            at_stage, at_tree = todo.pop()
            key = at_stage if at_stage is not None else at_tree
            if key in seen:
                continue
            seen.add(key)
            for line, name in memo.includes(at_tree) or ():
                found = self.resolve(name, at_stage, at_tree, cwd, layer_abs)
                if found is None:
                    continue
                next_stage, next_tree = found
                if next_stage is not None:
                    todo.append((next_stage, next_tree))
                    continue
                if allowed and next_tree.startswith(allowed):
                    continue  # the HIP compat directory: passed to the compiler as it is
                if not next_tree.startswith(prefix):
                    errors.append(EscapingInclude(memo.where(at_tree), line, name, next_tree))
                    continue
                files.setdefault(next_tree[len(prefix) :].replace(os.sep, "/"), next_tree)
                todo.append((None, next_tree))
        lookups = self.lookups
        return _ModuleWalk(
            tuple(lookups), tuple(lookups.values()), tuple(files.items()), tuple(errors)
        )

    def resolve(
        self, name: str, at_stage: str | None, at_tree: str, cwd: str, layer_abs: str
    ) -> tuple[str | None, str] | None:
        """Where the compiler finds quoted include ``name``: (staged path, tree path) for a
        file of the layout, (None, tree path) for a file of the tree beyond it (or outside
        ``kernels/``), None when nowhere (left to the compiler)."""
        memo = self.memo
        if name.startswith("/"):
            return (None, os.path.normpath(name)) if memo.is_file(name) else None
        # 1. next to the including file: in the stage for a staged file, else in the tree
        if at_stage is not None:
            cand = memo.stage_joined(posixpath.dirname(at_stage), name)
            tree = self.staged(cand)
            if tree is not None:
                return cand, tree
        else:
            cand_tree = memo.joined(os.path.dirname(at_tree), name)
            if memo.is_file(cand_tree):
                return None, cand_tree
        # 2. the role directory of the stage (-I.)
        cand = memo.stage_joined(cwd, name)
        tree = self.staged(cand)
        if tree is not None:
            return cand, tree
        # 3. the module's layer directory in the tree (the reference's -I)
        cand_tree = memo.joined(layer_abs, name)
        if memo.is_file(cand_tree):
            return None, cand_tree
        return None
