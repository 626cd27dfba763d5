"""HIP's view of the CUDA sources (SPEC 3.3): the warp-mask mirror and the compat directory.

hipcc compiles the CUDA trees as the reference build does: not the staged
sources themselves but a *mirror* of them, in which 32-bit warp masks are
widened for AMD's 64-lane wavefronts. For a module in role directory ``cwd``
the mirror holds every ``.cu``/``.cuh``/``.h`` of that directory, and of the
staged ``common/`` when the module is elsewhere (so ``../../common/x.cu``
reaches the mirrored copy), under ``<stage>/.hip/`` with the stage's shape. In
each mirrored file, in code (comments and string literals are left alone):

- a hex first argument of ``__shfl_sync(``, ``__shfl_up_sync(``,
  ``__shfl_down_sync(``, ``__shfl_xor_sync(`` or ``__ballot_sync(`` gets the
  suffix ``ULL``: a literal already suffixed ``LL`` (``ULL``, ``ll`` ...) is
  kept, other ``u``/``l`` suffixes are replaced (``0xffffffffu`` →
  ``0xffffffffULL``);
- ``unsigned int `` becomes ``unsigned long long `` in a statement (the code
  between ``;``, ``{`` and ``}``; a preprocessor directive is a statement of
  its own) that contains ``__activemask()``.

Nothing else changes, and ``kernels/`` is never touched: the mirror is written
from the stage. Files the compile reaches but the mirror does not hold
(subdirectories, files beyond the layout) are read from the stage through the
module's ``-I`` directories, as the reference reads them from the tree.

Keys: the mirror is a pure function of the staged bytes, so a module's key
(computed from the staged bytes) covers it once the mirror's rules are in the
key (:func:`hip_identity`, :data:`MIRROR_VERSION`); the compiler's dependency
list names mirrored files, which :func:`unmirror` maps back to the staged files
they were made from.

The compat directory is the project's (``hip_compat_dir``, relative to the
root; none by default), passed as ``-I``: its files are file dependencies of the
HIP targets and key material (their names and hashes, :func:`hip_identity`).

Pure: :func:`mirror_text`, :func:`mirror_files`, :func:`mirrored_source`,
:func:`unmirror`, :func:`hip_identity`. I/O: :func:`write_mirror`,
:func:`scan_hip_compat`.
"""

from __future__ import annotations

import itertools
import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from metrale_orch.canonical import canonical_json
from metrale_orch.fsutil import file_hash, text_hash, write_if_changed, write_own
from metrale_orch.ownership import read_own
from metrale_orch.paths import COMMON_DIR  # not staging's import chain: the no-op needs none

__all__ = [
    "MIRROR_DIR",
    "MIRROR_VERSION",
    "HipCompat",
    "hip_identity",
    "mirror_files",
    "mirror_text",
    "mirrored_source",
    "scan_hip_compat",
    "unmirror",
    "write_mirror",
]

#: The mirror's directory under the stage root (staging removes it with everything
#: else that is not staged, so a build never reads a stale mirror).
MIRROR_DIR = ".hip"
#: Version of the rules below: part of every HIP key (bump it when they change).
MIRROR_VERSION = 1
_MIRRORED_EXTS = frozenset({"cu", "cuh", "h"})

_SHFL_RE = re.compile(
    r"(?<![A-Za-z0-9_])__(?:shfl|shfl_up|shfl_down|shfl_xor|ballot)_sync\("
    r"\s*0[xX][0-9a-fA-F]+(?P<suffix>[uUlL]*)(?=\s*,)"
)
_ACTIVEMASK = "__activemask()"
_UINT = "unsigned int "
_ULL = "unsigned long long "
#: A preprocessor directive line, with its ``\\``-continued lines.
_DIRECTIVE_RE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.MULTILINE)


#: Comments and string/char literals (a ``'`` after a letter, digit or ``_`` is a digit
#: separator such as ``1'000``, not a char literal); an unterminated one runs to its end.
_NON_CODE_RE = re.compile(
    r"//(?:[^\n\\]|\\.)*"
    r"|/\*.*?(?:\*/|\Z)"
    r'|"(?:[^"\\\n]|\\.)*"?'
    r"|(?<![A-Za-z0-9_])'(?:[^'\\\n]|\\.)*'?",
    re.DOTALL,
)
_NOT_NEWLINE_RE = re.compile(r"[^\n]")
_DELIMITER_RE = re.compile(r"[;{}]")


def _blank_non_code(text: str) -> str:
    """``text`` with comments and string/char literals blanked (same length, newlines kept),
    so patterns matched on it lie in code."""
    return _NON_CODE_RE.sub(lambda m: _NOT_NEWLINE_RE.sub(" ", m.group()), text)


def _statements(code: str) -> Iterable[tuple[int, int]]:
    """(start, end) of each statement of blanked ``code``: the spans between ``;``, ``{``
    and ``}``, each preprocessor directive a span of its own."""
    cuts = {0, len(code)}
    for m in _DIRECTIVE_RE.finditer(code):
        cuts.update((m.start(), m.end()))
    cuts.update(m.start() for m in _DELIMITER_RE.finditer(code))
    edges = sorted(cuts)
    return itertools.pairwise(edges)


def mirror_text(data: bytes) -> bytes:
    """The mirrored bytes of one source or header (pure; see the module docstring).

    Works on the bytes as Latin-1 (every pattern is ASCII), so any encoding
    passes through unchanged.
    """
    text = data.decode("latin-1")
    if "_sync(" not in text and _ACTIVEMASK not in text:
        return data
    code = _blank_non_code(text)
    edits: list[tuple[int, int, str]] = []
    for m in _SHFL_RE.finditer(code):
        suffix = m["suffix"]
        if "ll" not in suffix.lower():
            edits.append((m.start("suffix"), m.end("suffix"), "ULL"))
    if _ACTIVEMASK in code:
        for start, end in _statements(code):
            if code.find(_ACTIVEMASK, start, end) < 0:
                continue
            at = code.find(_UINT, start, end)
            while at >= 0 and at + len(_UINT) <= end:
                edits.append((at, at + len(_UINT), _ULL))
                at = code.find(_UINT, at + len(_UINT), end)
    if not edits:
        return data
    pieces: list[str] = []
    last = 0
    for start, end, new in sorted(edits):
        pieces.append(text[last:start])
        pieces.append(new)
        last = end
    pieces.append(text[last:])
    return "".join(pieces).encode("latin-1")


def mirror_files(staged: Iterable[str], cwd: str) -> tuple[str, ...]:
    """The staged files (stage-relative POSIX paths) a compile in role directory ``cwd``
    mirrors: the ``.cu``/``.cuh``/``.h`` directly in ``cwd``, and in ``common/`` when
    ``cwd`` is another directory (pure; sorted)."""
    dirs = {cwd, COMMON_DIR}
    return tuple(
        sorted(
            p
            for p in staged
            if posixpath.dirname(p) in dirs and p.rpartition(".")[2] in _MIRRORED_EXTS
        )
    )


def mirrored_source(cwd: str, entry: str) -> str:
    """The mirrored copy of ``<cwd>/<entry>`` as a path relative to ``cwd`` (pure):
    ``../../.hip/<model>/<quant>/x.cu`` for a leaf, ``../.hip/common/x.cu`` for common."""
    return "../" * (cwd.count("/") + 1) + f"{MIRROR_DIR}/{cwd}/{entry}"


def unmirror(read: Sequence[str], *, stage_dir: str, cwd: str) -> list[str]:
    """The files a compile in ``cwd`` (absolute) read, with each mirrored file replaced by
    the absolute path of the staged file it was made from (pure)."""
    prefix = os.path.join(stage_dir, MIRROR_DIR) + os.sep
    out: list[str] = []
    for path in read:
        full = os.path.normpath(os.path.join(cwd, path))
        out.append(
            os.path.join(stage_dir, full[len(prefix) :]) if full.startswith(prefix) else path
        )
    return out


def write_mirror(stage_dir: Path, files: Sequence[str], hashes: Mapping[str, str]) -> None:
    """Make ``<stage_dir>/.hip/`` hold the mirror of ``files`` (stage-relative, from
    :func:`mirror_files`; ``hashes`` are the stage's own, path -> hash of the bytes
    staged), and no other file in their directories. Raises ``OSError``.

    Every module of a target mirrors much the same files, so a file is mirrored
    again only when its staged hash or the mirror file's ``stat`` differ from what
    ``.hip/.mirrored.json`` recorded when it was written (the stage is rebuilt, and
    ``.hip/`` removed, by every staging pass).
    """
    stage_dir = Path(stage_dir)
    base = stage_dir / MIRROR_DIR
    record = base / _RECORD
    known = _read_record(record)
    changed = False
    wanted: dict[str, set[str]] = {}
    for rel in files:
        digest = hashes[rel]
        dest = base / rel
        folder, _, name = rel.rpartition("/")
        wanted.setdefault(folder, set()).add(name)
        if known.get(rel) == [digest, *_stamp(dest)]:
            continue
        write_if_changed(dest, mirror_text((stage_dir / rel).read_bytes()))
        known[rel] = [digest, *_stamp(dest)]
        changed = True
    for folder, names in wanted.items():
        with os.scandir(base / folder) as entries:
            for entry in entries:
                if entry.name not in names and not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
                    known.pop(f"{folder}/{entry.name}", None)
                    changed = True
    if changed:
        doc = {"version": MIRROR_VERSION, "files": dict(sorted(known.items()))}
        write_own(record, json.dumps(doc, separators=(",", ":")).encode())


_RECORD = ".mirrored.json"


def _stamp(path: Path) -> list[int]:
    try:
        st = path.stat()
    except OSError:
        return [-1]
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_record(path: Path) -> dict[str, list[int | str]]:
    try:
        doc = json.loads(read_own(path))  # the user's own record only
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("version") != MIRROR_VERSION:
        return {}
    files = doc.get("files")
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, list)}


# ------------------------------------------------------------------------------ compat dir


@dataclass(frozen=True, slots=True, kw_only=True)
class HipCompat:
    """The project's HIP compat directory as one build sees it."""

    #: Absolute directory, or None when the project has none.
    dir: Path | None = None
    #: How argvs in keys, signatures and manifests spell it: ``{root}/<root-relative>``
    #: (the absolute path when it lies outside the root).
    spelled: str = ""
    #: Path below ``dir`` (POSIX) -> xxh3-128 of its bytes, sorted.
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Why it cannot be used ("" when it can).
    problem: str = ""

    @property
    def paths(self) -> tuple[Path, ...]:
        """Its files (absolute): file dependencies of every HIP target."""
        if self.dir is None:
            return ()
        return tuple(self.dir / rel for rel in self.files)

    @property
    def digest(self) -> str:
        """xxh3-128 of its listing and contents."""
        return text_hash(canonical_json(sorted(self.files.items())))


def scan_hip_compat(root: Path, compat_dir: Path | None) -> HipCompat:
    """Read the compat directory ``compat_dir`` (absolute, or None for none) of the project
    at ``root``: every regular file below it, by content. Never raises: a directory
    that cannot be read is a :attr:`HipCompat.problem` (the HIP targets fail with it).
    """
    if compat_dir is None:
        return HipCompat()
    folder = Path(compat_dir)
    try:
        spelled = "{root}/" + folder.relative_to(root).as_posix()
    except ValueError:
        spelled = folder.as_posix()
    files: dict[str, str] = {}
    try:
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a directory")
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames.sort()
            for name in filenames:
                path = Path(dirpath) / name
                if not path.is_file():
                    continue
                rel = path.relative_to(folder).as_posix()
                files[rel] = file_hash(os.fspath(path))
    except OSError as exc:
        return HipCompat(
            dir=folder,
            spelled=spelled,
            problem=f"the HIP compat directory {spelled} cannot be read ({exc})",
        )
    return HipCompat(
        dir=folder, spelled=spelled, files=MappingProxyType(dict(sorted(files.items())))
    )


def hip_identity(identity: str, compat: HipCompat | None) -> str:
    """The identity a HIP target's keys and signature carry (pure): the compiler's, the
    mirror's rules and the compat directory's content, which the compile reads as
    much as the compiler itself."""
    text = f"{identity} | hip mirror v{MIRROR_VERSION}"
    if compat is not None and compat.dir is not None:
        text += f" | compat {compat.spelled} {compat.digest}"
    return text
