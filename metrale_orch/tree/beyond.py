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
import os
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from metrale_orch.errors import MetraleError

__all__ = [
    "TREE_DIR",
    "Beyond",
    "EscapingInclude",
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


def find_beyond_layout(
    kernels: Path,
    modules: Mapping[str, tuple[str, str]],
    staged: Mapping[str, Path],
    read: Callable[[Path], bytes],
    *,
    allow: Iterable[str] = (),
) -> Beyond:
    """Walk the quoted includes of every module's compile and collect the tree files it
    reaches beyond the layout (see the module docstring).

    ``modules``: each module's staged source path -> (its working directory, its
    layer directory relative to ``kernels``), both stage-relative POSIX;
    ``staged``: staged path -> tree file (the layout's files); ``read`` returns a
    file's bytes (memoise it across targets). Never raises for the tree: escaping
    includes are returned, each once.
    """
    base = os.path.abspath(kernels)
    prefix = base + os.sep
    allowed = tuple(os.path.abspath(a).rstrip(os.sep) + os.sep for a in allow)
    files: dict[str, Path] = {}
    errors: dict[tuple[str, int, str], EscapingInclude] = {}
    for source, (cwd, layer_dir) in sorted(modules.items()):
        layer_abs = os.path.join(base, *layer_dir.split("/")) if layer_dir else base
        # (staged path or None, tree path) of each file this module's compile reads
        todo: list[tuple[str | None, str]] = [(source, os.path.abspath(staged[source]))]
        seen: set[str] = set()
        while todo:
            at_stage, at_tree = todo.pop()
            key = at_stage if at_stage is not None else at_tree
            if key in seen:
                continue
            seen.add(key)
            try:
                data = read(Path(at_tree))
            except OSError:
                continue
            where = os.path.relpath(at_tree, os.path.dirname(base)).replace(os.sep, "/")
            for line, name in quoted_includes(data):
                found = _resolve(name, at_stage, at_tree, cwd, layer_abs, staged)
                if found is None:
                    continue
                next_stage, next_tree = found
                if next_stage is not None:
                    todo.append((next_stage, next_tree))
                    continue
                if allowed and next_tree.startswith(allowed):
                    continue  # the HIP compat directory: passed to the compiler as it is
                if not next_tree.startswith(prefix):
                    err = EscapingInclude(where, line, name, next_tree)
                    errors.setdefault((where, line, name), err)
                    continue
                rel = next_tree[len(prefix) :].replace(os.sep, "/")
                files[rel] = Path(next_tree)
                todo.append((None, next_tree))
    return Beyond(
        files=dict(sorted(files.items())),
        errors=tuple(errors[k] for k in sorted(errors)),
    )


def _resolve(
    name: str,
    at_stage: str | None,
    at_tree: str,
    cwd: str,
    layer_abs: str,
    staged: Mapping[str, Path],
) -> tuple[str | None, str] | None:
    """Where the compiler finds quoted include ``name``: (staged path, tree path) for a
    file of the layout, (None, tree path) for a file of the tree beyond it (or outside
    ``kernels/``), None when nowhere (left to the compiler)."""
    if name.startswith("/"):
        return (None, os.path.normpath(name)) if os.path.isfile(name) else None
    # 1. next to the including file: in the stage for a staged file, else in the tree
    if at_stage is not None:
        cand = posixpath.normpath(posixpath.join(posixpath.dirname(at_stage), name))
        if cand in staged:
            return cand, os.path.abspath(staged[cand])
    else:
        cand_tree = os.path.normpath(os.path.join(os.path.dirname(at_tree), name))
        if os.path.isfile(cand_tree):
            return None, cand_tree
    # 2. the role directory of the stage (-I.)
    cand = posixpath.normpath(posixpath.join(cwd, name))
    if cand in staged:
        return cand, os.path.abspath(staged[cand])
    # 3. the module's layer directory in the tree (the reference's -I)
    cand_tree = os.path.normpath(os.path.join(layer_abs, name))
    if os.path.isfile(cand_tree):
        return None, cand_tree
    return None
