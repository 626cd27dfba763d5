"""Staging: copy exactly what a target's layout reaches into its own directory.

A target is staged under ``<build>/stage/<hw>/<model>/<quant>/`` with one
directory per role, preserving the tree's depth relation (SPEC 3.2)::

    common/                      the merged common role (entries + subdirectories)
    <source model>/<quant>/      the merged leaf role

so ``#include "../../common/x.cuh"`` in a leaf resolves to the staged common.
Every entry is copied under its entry name into its role directory; role
subdirectories are copied recursively. Nothing outside the layout is visible:
staging removes every file and directory that no longer belongs. Staging is
idempotent: a file whose bytes are already right is not rewritten (its mtime
stays), and each write is atomic (temporary name + ``os.replace``).

Pure: :func:`plan_stage`, :func:`role_dir`. I/O: :func:`stage`.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType

from metrale_orch.fsutil import SameBytes, bytes_digest, bytes_hash, write_atomic
from metrale_orch.paths import COMMON_DIR, root_relative
from metrale_orch.steps.errors import ContainmentError, StageError
from metrale_orch.tree import Layout, Role, redirect_manifest
from metrale_orch.tree.beyond import TREE_DIR, Beyond, IncludeMemo, find_beyond_layout

__all__ = [
    "TREE_DIR",
    "Beyond",
    "SourceBytes",
    "StagedTarget",
    "beyond_layout",
    "check_contained",
    "containment_error",
    "layer_dir",
    "plan_stage",
    "role_dir",
    "stage",
    "uncontained",
]


def uncontained(
    kernels: Path, paths: Iterable[Path], seen: dict[Path, str] | None = None
) -> list[tuple[Path, str]]:
    """(path, problem) for each path that is not a real file inside ``kernels`` (I/O: ``lstat``
    of every component below ``kernels``).

    A path is contained when it lies lexically under ``kernels`` (after ``..`` is
    resolved) and no component from ``kernels`` down to the file is a symlink, so
    what is compiled is exactly what the tree holds: a redirect, a ``use`` path or
    a symlinked directory can never bring in a file from elsewhere. Each directory
    is examined once per call; ``seen`` (path -> problem, "" for none) carries what
    was examined across the calls of one pass over an unchanging tree.
    """
    base = os.path.abspath(kernels)
    prefix = base + os.sep
    seen_dirs: dict[str, str] = {}
    out: list[tuple[Path, str]] = []
    for path in paths:
        problem = None if seen is None else seen.get(path)
        if problem is None:
            problem = _uncontained(base, prefix, os.path.abspath(path), seen_dirs)
            if seen is not None:
                seen[path] = problem
        if problem:
            out.append((path, problem))
    return out


def _uncontained(base: str, prefix: str, text: str, seen_dirs: dict[str, str]) -> str:
    """The problem of the absolute path ``text`` for :func:`uncontained`, or ""."""
    if not text.startswith(prefix):
        return "lies outside kernels/; kernel trees build only their own files"
    problem = ""
    parts = text[len(prefix) :].split(os.sep)
    current = base
    for i, part in enumerate(parts):
        current = current + os.sep + part
        last = i == len(parts) - 1
        if not last and current in seen_dirs:
            problem = seen_dirs[current]
            if problem:
                break
            continue
        try:
            mode = os.lstat(current).st_mode
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror})"
        else:
            if stat.S_ISLNK(mode):
                rel = os.path.relpath(current, os.path.dirname(base))
                problem = f"is reached through the symlink {rel}; kernel trees hold real files only"
            elif last and not stat.S_ISREG(mode):
                problem = "is not a regular file"
        if not last:
            seen_dirs[current] = problem
        if problem:
            break
    return problem


def check_contained(root: Path, layout: Layout) -> None:
    """Raise :class:`ContainmentError` for the first input of ``layout`` outside ``kernels/``
    (see :func:`uncontained`), naming it root-relative."""
    bad = uncontained(Path(root) / "kernels", layout.inputs())
    if bad:
        path, problem = bad[0]
        try:
            shown = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
        except ValueError:
            shown = os.path.abspath(path)
        raise containment_error(root, layout, path, shown, problem)


def containment_error(
    root: Path, layout: Layout, path: Path, shown: str, problem: str
) -> ContainmentError:
    """The :class:`ContainmentError` for ``path`` (an input :func:`uncontained` refused with
    ``problem``, spelled ``shown``), naming the MODEL.toml whose ``[model] kernel_source``
    led out of ``kernels/``, if one did (pure)."""
    via = ""
    kernels = os.path.abspath(Path(root) / "kernels") + os.sep
    if not os.path.abspath(path).startswith(kernels):
        manifest = redirect_manifest(layout, path)
        if manifest is not None:
            via = root_relative(manifest, Path(root))
    return ContainmentError(str(layout.target), shown, problem, via)


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedTarget:
    """A staged target: where it is and what it holds."""

    dir: Path
    #: staged relative POSIX path -> source file in the tree (sorted).
    files: Mapping[str, Path]
    #: staged relative POSIX path -> xxh3-128 hex of its bytes (sorted).
    hashes: Mapping[str, str]
    #: source file in the tree -> xxh3-64 hex of the bytes staged from it (what a
    #: build's saved state records: :func:`metrale_orch.fsutil.file_digest`).
    source_digests: Mapping[Path, str]
    #: staged paths written by this call (new or changed bytes), sorted.
    written: tuple[str, ...]
    #: staged paths (files and directories) removed by this call, sorted.
    removed: tuple[str, ...]


def role_dir(layout: Layout, role: Role) -> str:
    """The staged directory of ``role`` relative to the stage root (POSIX)."""
    if role is Role.COMMON:
        return COMMON_DIR
    return f"{layout.source_model}/{layout.target.quant}"


def layer_dir(root: Path, layout: Layout, stem_entry_layer: int) -> str:
    """The directory of layer ``stem_entry_layer`` relative to ``kernels/`` (POSIX)."""
    folder = layout.layers[stem_entry_layer].dir
    kernels = Path(root) / "kernels"
    try:
        return folder.relative_to(kernels).as_posix()
    except ValueError:
        return os.path.relpath(folder, kernels).replace(os.sep, "/")


def beyond_layout(
    root: Path,
    layout: Layout,
    read: Callable[[Path], bytes] | None = None,
    *,
    allow: Iterable[str] = (),
    memo: IncludeMemo | None = None,
    staged: Mapping[str, Path] | None = None,
) -> Beyond:
    """The tree files the target's compiles reach beyond its layout, and the includes that
    escape ``kernels/`` (SPEC 3.3.1; see :mod:`metrale_orch.tree.beyond`); includes into an
    ``allow``-ed directory (the HIP compat directory) are neither. I/O: reads the
    layout's sources (through ``read``, or ``memo``: what many targets of one pass share).
    ``staged`` is :func:`plan_stage` of ``layout`` when the caller has it."""
    if staged is None:
        staged = plan_stage(layout)
    # Per layer: (its role directory in the stage, its directory under kernels/).
    dirs = [
        (role_dir(layout, layer.role), layer_dir(root, layout, i))
        for i, layer in enumerate(layout.layers)
    ]
    modules = {}
    for _stem, entry in layout.modules():
        base, folder = dirs[entry.layer]
        modules[f"{base}/{entry.name}"] = (base, folder)
    return find_beyond_layout(
        Path(root) / "kernels",
        modules,
        staged,
        read or (lambda p: p.read_bytes()),
        allow=allow,
        memo=memo,
    )


def plan_stage(layout: Layout, extra: Mapping[str, Path] | None = None) -> Mapping[str, Path]:
    """Staged relative path -> source path for every file the target may read: the
    layout's, and ``extra`` (files beyond the layout, by path under ``kernels/``) under
    :data:`TREE_DIR`.

    Raises :class:`StageError` when two files would land on one path or a file
    on a directory of another (e.g. a source model named ``common``).
    """
    target = str(layout.target)
    if layout.source_model == COMMON_DIR:
        raise StageError(
            target,
            f"{COMMON_DIR}/{layout.target.quant}",
            f"a source model named {COMMON_DIR!r} would share the staged common directory; "
            "rename the model directory",
        )
    plan: dict[str, Path] = {}
    inputs: list[tuple[str, Path]] | None = None
    for role, entries, subdirs in (
        (Role.COMMON, layout.common, layout.common_subdirs),
        (Role.LEAF, layout.leaf, layout.leaf_subdirs),
    ):
        base = role_dir(layout, role)
        for name, entry in entries.items():
            _add(plan, f"{base}/{name}", entry.source, target)
        if subdirs and inputs is None:
            inputs = [(os.fspath(path), path) for path in layout.input_set()]
        for name, top in subdirs.items():
            # Every input lexically under the subdirectory (Path.is_relative_to, by text).
            prefix = os.path.join(os.fspath(top), "")
            for text, path in inputs or ():
                if text.startswith(prefix):
                    rel = text[len(prefix) :].replace(os.sep, "/")
                    _add(plan, f"{base}/{name}/{rel}", path, target)
    for rel, path in (extra or {}).items():
        _add(plan, f"{TREE_DIR}/{rel}", path, target)
    clash = sorted(_parent_dirs(plan).intersection(plan))
    if clash:
        raise StageError(target, clash[0], "is both a file and a directory of the stage")
    return MappingProxyType(dict(sorted(plan.items())))


def _parent_dirs(rels: Iterable[str]) -> set[str]:
    """Every proper parent directory of the staged paths ``rels`` (clean POSIX text)."""
    dirs: set[str] = set()
    for rel in rels:
        end = rel.rfind("/")
        while end > 0:
            parent = rel[:end]
            if parent in dirs:
                break  # and its own parents, already added
            dirs.add(parent)
            end = rel.rfind("/", 0, end)
    return dirs


def _add(plan: dict[str, Path], rel: str, source: Path, target: str) -> None:
    if rel in plan and plan[rel] != source:
        raise StageError(target, rel, f"both {plan[rel]} and {source} would be staged here")
    plan[rel] = source


def stage(
    layout: Layout,
    stage_dir: Path,
    extra: Mapping[str, Path] | None = None,
    dirs: Iterable[str] = (),
    same: SameBytes | None = None,
    read: Callable[[Path], bytes] | None = None,
) -> StagedTarget:
    """Make ``stage_dir`` hold exactly :func:`plan_stage`'s files with their current bytes,
    and the (possibly empty) directories ``dirs`` (stage-relative): a compile's ``-I``
    directory must exist for ``..`` to be walked through it. A file is written through
    ``same`` when given (a link to the run's earlier file of the same bytes), and read
    through ``read`` when given (:class:`SourceBytes`: what the include walk read).

    Raises :class:`StageError` when a source cannot be read or the stage
    cannot be written.
    """
    target = str(layout.target)
    plan = plan_stage(layout, extra)
    stage_dir = Path(stage_dir)
    written: list[str] = []
    hashes: dict[str, str] = {}
    digests: dict[Path, str] = {}
    try:
        stage_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StageError(target, str(stage_dir), str(exc)) from None
    dirs = sorted(set(dirs))
    removed = _remove_stale(stage_dir, plan, target, dirs)
    for rel in dirs:
        try:
            (stage_dir / rel).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StageError(target, rel, f"cannot create the directory: {exc}") from None
    read = read or Path.read_bytes
    for rel, source in plan.items():
        try:
            data = read(source)
        except OSError as exc:
            raise StageError(target, rel, f"cannot read {source}: {exc}") from None
        hashes[rel] = bytes_hash(data)
        digests[source] = bytes_digest(data)
        dest = stage_dir / rel
        try:
            if _same_bytes(dest, data):
                continue
            if same is None:
                write_atomic(dest, data)
            else:
                same.write(dest, data, hashes[rel])
        except OSError as exc:
            raise StageError(target, rel, f"cannot write {dest}: {exc}") from None
        written.append(rel)
    return StagedTarget(
        dir=stage_dir,
        files=plan,
        hashes=MappingProxyType(hashes),
        source_digests=MappingProxyType(digests),
        written=tuple(written),
        removed=tuple(sorted(removed)),
    )


class SourceBytes:
    """The bytes of each tree file as first read while one target is prepared: its include
    walk and its stage read each file once, and see the same bytes (a ``read`` for
    :func:`beyond_layout` and :func:`stage`). Raises OSError as ``Path.read_bytes``."""

    __slots__ = ("_got",)

    def __init__(self) -> None:
        self._got: dict[str, bytes] = {}

    def __call__(self, path: Path) -> bytes:
        name = os.path.abspath(path)
        data = self._got.get(name)
        if data is None:
            with open(name, "rb") as fh:
                data = self._got[name] = fh.read()
        return data


def _same_bytes(dest: Path, data: bytes) -> bool:
    """Whether ``dest`` is a regular file (not a link) holding ``data``; else it is made
    ready for :func:`write_atomic` (a directory in its place is removed)."""
    try:
        st = os.lstat(dest)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(dest)
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
        return False
    try:
        with open(dest, "rb") as fh:
            return fh.read() == data
    except OSError:
        return False


def _remove_stale(
    stage_dir: Path, plan: Mapping[str, Path], target: str, dirs: Iterable[str] = ()
) -> list[str]:
    """Remove every file or directory under ``stage_dir`` that the plan (or ``dirs``) does
    not hold."""
    wanted = [*plan, *(f"{d}/." for d in dirs)]
    keep_dirs = {str(p) for rel in wanted for p in PurePosixPath(rel).parents} - {"."}
    removed: list[str] = []
    try:
        for dirpath, dirnames, filenames in os.walk(stage_dir, topdown=True):
            base = Path(dirpath)
            rel_base = base.relative_to(stage_dir).as_posix()
            prefix = "" if rel_base == "." else rel_base + "/"
            for name in list(dirnames):
                rel = prefix + name
                path = base / name
                if path.is_symlink():
                    path.unlink()
                    removed.append(rel)
                    dirnames.remove(name)
                elif rel not in keep_dirs:
                    shutil.rmtree(path)
                    removed.append(rel)
                    dirnames.remove(name)
            for name in filenames:
                rel = prefix + name
                if rel not in plan:
                    (base / name).unlink()
                    removed.append(rel)
    except OSError as exc:
        raise StageError(target, str(stage_dir), f"cannot remove stale files: {exc}") from None
    return removed
