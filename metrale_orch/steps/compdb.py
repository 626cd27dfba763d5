"""The JSON Compilation Database editors read: ``<build_dir>/compile_commands.json``.

clangd (VS Code, CLion, Neovim) finds it in the ``build/`` directory of an ancestor of
the file it opens (https://clang.llvm.org/docs/JSONCompilationDatabase.html). One entry
per tree source file a build compiles: ``file`` is the file under ``kernels/`` (what
the person edits), ``directory`` and ``arguments`` are those of one compile of it, and
``output`` is what that compile writes. A file that several targets compile gets the
first of them in sorted order; ``metrale-orch compdb TARGET`` writes the database of a
chosen target instead. Entries are sorted by ``file``.

**Which directories resolve quoted includes.** The build compiles the staged copy in its
role directory (``<build_dir>/stage/<target>/common`` or ``…/<model>/<quant>``) with
``-I.``; an entry is the same command in the same directory, on the tree file instead of
the staged copy (the build's ``-I`` flags, the layer directory under ``.tree/`` when the
module reaches files beyond its layout, SPEC 3.3.1). The compiler looks next to the
including file first, the tree file's own directory (a sibling included as ``"x.cuh"``),
then in ``-I.``: the staged role directory, which holds what the build sees (a parent
tree's common header, a ``use``-d file), and from which ``../../common/`` reaches the
staged common role. Headers found there are the staged copies, so their own includes
resolve exactly as in the build. One difference cannot be avoided: when the tree file's
own directory holds a namesake that the build replaced (an own-over-parent win by file
name), the editor sees that namesake, as no compiler searches any directory before the
includer's own for a quoted include; ``metrale-orch compdb`` names each such include of
the entries it writes (:func:`editor_differences`).

Left out: the dependency-list flags (the build's bookkeeping, into a temporary
directory). HIP entries compile the tree file, not its mirror; a two-step toolchain
(Metal) contributes its first step, whose output is the intermediate file. A toolchain
that sets variables for its compiles (hipcc's ``HIP_PLATFORM=amd``) runs through
``env VAR=value …``, as the format has no environment.

**Absolute paths.** The database is a local file for this checkout's editors, never a
key, a manifest or anything shared: ``directory`` (the real path of the staged role
directory), ``file`` and ``output`` are absolute, as clangd expects. ``arguments`` keep
the build's spellings, relative to ``directory`` as the format allows (so nvcc's
sub-shell never sees the checkout's path), the program's absolute path first.

**Parts.** Every build of a target writes its commands, after staging and before
compiling (a target whose compile fails keeps its entries; one restored from the cache
writes them too), to ``<build_dir>/.state/compdb/<hw>/<model>/<quant>.json``, with
paths relative to the root or the build directory, so a moved checkout keeps them
valid. The doit reporter merges the parts of the tree's buildable targets at the end of
a run that built something; a no-op run reads and writes nothing. A part is written and
read as the user's own file (:mod:`metrale_orch.ownership`): another user's is never
merged, as its program is what an editor runs.

Pure: :func:`merge_commands`, :func:`entry_targets`, :func:`encode_database`,
:func:`part_path`. I/O: :func:`target_commands` (real paths), :func:`editor_differences`
(what lies beside the tree files), :func:`write_part`, :func:`read_part`,
:func:`write_database`, :func:`write_database_from_parts`.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.canonical import canonical_json, readable_json
from metrale_orch.fsutil import file_hash, write_if_changed, write_own
from metrale_orch.ownership import read_own
from metrale_orch.paths import COMPDB_NAME, compdb_part, root_relative, stage_dir, target_dir
from metrale_orch.steps.compile import step_argv
from metrale_orch.steps.includes import Includes
from metrale_orch.steps.plan_values import ModulePlan, TargetPlan
from metrale_orch.steps.staging import StagedTarget
from metrale_orch.tree import Target

__all__ = [
    "CompileCommand",
    "Difference",
    "TargetCommands",
    "Written",
    "editor_differences",
    "encode_database",
    "entry_targets",
    "merge_commands",
    "part_path",
    "read_part",
    "stored_targets",
    "target_commands",
    "write_database",
    "write_database_from_parts",
    "write_part",
]

_SCHEMA = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileCommand:
    """One module's compile as a part records it (every path portable)."""

    #: The tree source file, root-relative POSIX (``kernels/…``).
    file: str
    #: The compile's working directory (the staged role directory), relative to the
    #: build directory (POSIX).
    directory: str
    #: The command: the program's absolute path (after ``env VAR=value …`` for a toolchain
    #: that sets variables), then every path relative to ``directory``.
    arguments: tuple[str, ...]
    #: What the command writes, relative to the build directory (POSIX).
    output: str

    def to_dict(self) -> dict[str, object]:
        return {
            "arguments": list(self.arguments),
            "directory": self.directory,
            "file": self.file,
            "output": self.output,
        }

    @classmethod
    def from_dict(cls, doc: object) -> CompileCommand:
        """Raises ValueError for anything :meth:`to_dict` does not write."""
        if not isinstance(doc, Mapping):
            raise ValueError("not an object")
        args = doc.get("arguments")
        texts = [doc.get(k) for k in ("file", "directory", "output")]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in (*args, *texts)):
            raise ValueError("a field is missing or not text")
        file, directory, output = (str(t) for t in texts)
        return cls(file=file, directory=directory, arguments=tuple(args), output=output)


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetCommands:
    """A target's part of the database: one command per module, in plan order."""

    target: Target
    commands: tuple[CompileCommand, ...]

    def encode(self) -> bytes:
        doc = {
            "schema": _SCHEMA,
            "target": str(self.target),
            "commands": [c.to_dict() for c in self.commands],
        }
        return (canonical_json(doc) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> TargetCommands:
        """Raises ValueError for bytes :meth:`encode` did not write (this schema)."""
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("schema") != _SCHEMA:
            raise ValueError("not a part of this schema")
        commands = doc.get("commands")
        if not isinstance(commands, list):
            raise ValueError("no commands")
        return cls(
            target=Target.parse(str(doc.get("target", ""))),
            commands=tuple(CompileCommand.from_dict(c) for c in commands),
        )


def target_commands(
    root: Path,
    build_dir: Path,
    plan: TargetPlan,
    *,
    program: str,
    layer_includes: Mapping[str, str],
) -> TargetCommands:
    """The compile commands of ``plan``'s modules as the build runs them in its stage
    (``layer_includes``: :attr:`~metrale_orch.steps.compile.BuildContext.layer_includes`),
    on each module's tree file (I/O: the real paths of the role directories and outputs;
    the role directories exist once the target is staged)."""
    t = plan.target
    parts = (t.hardware, t.model, t.quant)
    stage = stage_dir(Path(build_dir), *parts)
    stage_rel = stage_dir(Path(), *parts).as_posix()
    dest_rel = target_dir(Path(), *parts).as_posix()
    # Inputs are contained (no symlink below kernels/: check_contained), and the staged
    # role directories and the artefact directory are the build's own: from each real
    # role directory, one relative path to the real root and one to the real artefact
    # directory spell every module's source and output (string work per module).
    real_root = os.path.realpath(root)
    real_dest = os.path.realpath(target_dir(Path(build_dir), *parts))
    bases: dict[str, tuple[str, str, str]] = {}
    link = plan.toolchain.link_argv
    # The variables the toolchain sets for its compiles (hipcc's HIP_PLATFORM=amd) go
    # before the program, through env(1): the format has no environment, and the command
    # must run as it is. clangd takes env's operands for inputs, which it drops.
    env = (
        ("env", *(f"{k}={v}" for k, v in plan.toolchain.env_set)) if plan.toolchain.env_set else ()
    )
    out: list[CompileCommand] = []
    for module in plan.modules:
        base = bases.get(module.cwd)
        if base is None:
            here = os.path.realpath(stage / module.cwd)
            base = (here, os.path.relpath(real_root, here), os.path.relpath(real_dest, here))
            bases[module.cwd] = base
        here, to_root, to_dest = base
        written = f"{module.name}.{plan.toolchain.intermediate_extension}" if link else ""
        argv = env + step_argv(
            plan,
            program=program,
            here=here,
            source=f"{to_root}/{module.source_rel}",
            output=f"{to_dest}/{module.artefact}",
            intermediate=f"{to_dest}/{written}" if written else "",
            layer_include=layer_includes.get(module.staged, ""),
        )
        out.append(
            CompileCommand(
                file=module.source_rel,
                directory=f"{stage_rel}/{module.cwd}",
                arguments=argv,
                output=f"{dest_rel}/{written or module.artefact}",
            )
        )
    return TargetCommands(target=t, commands=tuple(out))


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """A quoted include that an editor, opening an entry's tree file, resolves to another
    file than the build's compile of the staged copy (paths root-relative)."""

    #: The entry's tree file.
    file: str
    #: The tree file whose ``#include`` it is (the entry's file or a header it reaches).
    includer: str
    #: The include as spelled.
    name: str
    #: What an editor reads.
    editor: str
    #: What the build reads ("" when the build finds nothing: a system header).
    build: str

    def __str__(self) -> str:
        where = "" if self.includer == self.file else f" (in {self.includer})"
        build = self.build or "no file of the tree"
        return (
            f'{self.file}: "{self.name}"{where} is {self.editor} in an editor, {build} in the '
            "build (a namesake beside the tree file comes first; open the staged copy to "
            "see the build's)"
        )


def editor_differences(
    root: Path,
    module: ModulePlan,
    *,
    staged: StagedTarget,
    includes: Mapping[str, Includes],
    dirs: Sequence[str],
) -> tuple[Difference, ...]:
    """The quoted includes that resolve differently for an editor of ``module``'s tree file
    than for its build (``dirs``: the compile's stage-relative search directories,
    :func:`~metrale_orch.steps.includes.include_dirs`).

    The two read the same files until the editor takes a file beside a tree file that is
    not the one the build stages there (a namesake the build replaced, or one the stage
    does not hold); a file of the same bytes is no difference. I/O: whether a file lies
    beside each tree file reached, and the bytes of a differing namesake."""
    out: list[Difference] = []
    file = module.source_rel
    todo = [(Path(module.source), module.staged)]
    seen: set[str] = set()
    while todo:
        tree_file, built_file = todo.pop()
        if built_file in seen:
            continue
        seen.add(built_file)
        inc = includes.get(built_file)
        for name in () if inc is None or inc.computed else inc.quoted:
            if name.startswith("/"):
                continue
            built = _staged_include(staged.hashes, (posixpath.dirname(built_file), *dirs), name)
            beside = Path(os.path.normpath(tree_file.parent / name))
            if beside.is_file():
                source = staged.files.get(built) if built else None
                if source is not None and (
                    source == beside or _hash_of(beside) == staged.hashes[built or ""]
                ):
                    todo.append((beside, built or ""))
                    continue
                editor = root_relative(beside, root)
            else:  # the editor searches the -I directories, as the build does after its own
                found = _staged_include(staged.hashes, dirs, name)
                if found == built:
                    continue
                editor = _shown(root, staged, found)
            out.append(
                Difference(
                    file=file,
                    includer=root_relative(tree_file, root),
                    name=name,
                    editor=editor,
                    build=_shown(root, staged, built),
                )
            )
    return tuple(sorted(out, key=lambda d: (d.includer, d.name)))


def _staged_include(hashes: Mapping[str, str], search: Sequence[str], name: str) -> str | None:
    """The staged file a quoted ``name`` resolves to over ``search`` (as
    :func:`~metrale_orch.steps.includes.resolve_closure` resolves it), or None."""
    for base in search:
        cand = posixpath.normpath(posixpath.join(base, name))
        if not cand.startswith("../") and cand in hashes:
            return cand
    return None


def _shown(root: Path, staged: StagedTarget, path: str | None) -> str:
    """A staged file as its tree file, root-relative ("" for none)."""
    source = staged.files.get(path) if path else None
    return "" if source is None else root_relative(source, root)


def _hash_of(path: Path) -> str:
    try:
        return file_hash(os.fspath(path))
    except OSError:
        return ""


def part_path(build_dir: Path, target: Target) -> Path:
    """Where a target's part lives (pure; :func:`~metrale_orch.paths.compdb_part`)."""
    return compdb_part(Path(build_dir), target.hardware, target.model, target.quant)


def write_part(build_dir: Path, commands: TargetCommands) -> None:
    """Write a target's part as the user's own file (:func:`~metrale_orch.fsutil.write_own`)
    unless it already is one holding these bytes. Raises OSError (``PermissionError``
    where its directory is another user's)."""
    path, data = part_path(build_dir, commands.target), commands.encode()
    with contextlib.suppress(OSError):
        if read_own(path) == data:
            return
    write_own(path, data)


def read_part(build_dir: Path, target: Target) -> TargetCommands | None:
    """A target's part, or None when it has none (never built since parts exist), is not
    the user's own (:func:`~metrale_orch.ownership.read_own`: its compiler is what an
    editor runs) or holds anything but a part of ``target`` (left by another version:
    rebuilt later)."""
    try:
        part = TargetCommands.decode(read_own(part_path(build_dir, target)))
    except (OSError, ValueError):
        return None
    return part if part.target == target else None


def merge_commands(parts: Iterable[TargetCommands]) -> tuple[CompileCommand, ...]:
    """One command per tree file: that of the first target in sorted order whose part
    has one; sorted by file (pure)."""
    return tuple(command for _target, command in _chosen(parts))


def entry_targets(parts: Iterable[TargetCommands]) -> dict[str, Target]:
    """Tree file -> the target whose command :func:`merge_commands` takes (pure)."""
    return {command.file: target for target, command in _chosen(parts)}


def _chosen(parts: Iterable[TargetCommands]) -> list[tuple[Target, CompileCommand]]:
    """:func:`merge_commands` with the target each command comes from."""
    chosen: dict[str, tuple[Target, CompileCommand]] = {}
    for part in sorted(parts, key=lambda p: p.target):
        for command in part.commands:
            chosen.setdefault(command.file, (part.target, command))
    return [chosen[name] for name in sorted(chosen)]


def encode_database(commands: Sequence[CompileCommand], *, root: str, build: str) -> bytes:
    """The database's bytes (pure): ``root`` as editors spell the project (absolute),
    ``build`` the real path of the build directory. JSON, keys sorted, one entry per
    command in the given order."""
    entries = [
        {
            "arguments": list(c.arguments),
            "directory": os.path.join(build, c.directory),
            "file": os.path.join(root, c.file),
            "output": os.path.join(build, c.output),
        }
        for c in commands
    ]
    return (readable_json(entries) + "\n").encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """A database written (or found already holding those bytes)."""

    path: Path
    entries: int
    #: Targets whose commands the entries come from, sorted.
    targets: tuple[Target, ...]
    #: False when the file already held these bytes (left untouched).
    changed: bool


def write_database(root: Path, build_dir: Path, parts: Iterable[TargetCommands]) -> Written:
    """Merge ``parts`` (:func:`merge_commands`) into ``<build_dir>/compile_commands.json``;
    the file is rewritten only when its bytes change (an editor watching it reloads
    nothing). Raises OSError."""
    chosen = _chosen(parts)
    data = encode_database(
        [command for _target, command in chosen],
        root=os.path.abspath(root),
        build=os.path.realpath(build_dir),
    )
    path = Path(build_dir) / COMPDB_NAME
    changed = write_if_changed(path, data)
    used = tuple(sorted({target for target, _command in chosen}))
    return Written(path=path, entries=len(chosen), targets=used, changed=changed)


def stored_targets(build_dir: Path) -> list[Target]:
    """The targets that have a part on disk under ``build_dir`` (sorted; a file whose path
    names no target is passed over). I/O: lists the parts' directory."""
    top = compdb_part(Path(build_dir), "h", "m", "q").parents[2]
    found = []
    for path in sorted(top.glob("*/*/*.json")):
        try:
            found.append(Target.parse(f"{path.parent.parent.name}/{path.parent.name}/{path.stem}"))
        except ValueError:
            continue
    return found


def write_database_from_parts(root: Path, build_dir: Path, targets: Iterable[Target]) -> Written:
    """:func:`write_database` of the parts ``targets`` have on disk (those without one
    contribute nothing). Raises OSError."""
    found = (read_part(build_dir, t) for t in targets)
    return write_database(root, build_dir, [p for p in found if p is not None])
