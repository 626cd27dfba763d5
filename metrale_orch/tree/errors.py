"""The errors of layout resolution: :class:`LayoutError` and a subclass per case.

Each error declares its data as fields (the paths as the values hold them,
their root-relative POSIX spellings ``rel``, the manifest key, the target)
and its message as a template over them, or a ``__str__`` where the text is
computed (see :class:`~metrale_orch.errors.MetraleError`): what is wrong,
where, and what to do.
"""

from __future__ import annotations

from dataclasses import KW_ONLY
from pathlib import Path

from metrale_orch.errors import MetraleError, printable
from metrale_orch.tree.names import HARDWARE_TOML, VENDOR_EXT, name_hazard, toml_key
from metrale_orch.tree.values import Role, Target


class LayoutError(MetraleError):
    """Base of every layout resolution error; ``str()`` names the file(s) involved."""


class UnknownHardware(LayoutError):
    """``kernels/<hw>/HARDWARE.toml`` does not exist."""

    hardware: str
    path: Path
    rel: str

    template = (
        "{rel}: no such file: `{hardware}` is not a hardware tree "
        "(a hardware tree is a directory kernels/<hw>/ holding " + HARDWARE_TOML + ")"
    )


class ManifestError(LayoutError):
    """A manifest cannot be read, or a key has the wrong shape."""

    path: Path
    rel: str
    key: str | None
    problem: str

    def __str__(self) -> str:
        where = f"{self.rel}: {self.key}" if self.key else self.rel
        return f"{where}: {self.problem}"


class UnknownVendor(LayoutError):
    """``[hardware] vendor`` names no known vendor."""

    path: Path
    rel: str
    vendor: str

    template = "{rel}: [hardware] vendor = {vendor!r} is not a known vendor (known: {known})"

    @property
    def known(self) -> str:
        return ", ".join(sorted(VENDOR_EXT))


class InheritsError(LayoutError):
    """``[hardware] inherits`` names a tree that cannot be a parent."""

    path: Path
    rel: str
    hardware: str
    parent: str
    problem: str
    cause: LayoutError | None = None

    template = "{rel}: [hardware] inherits = {parent!r}: {problem}"


class RedirectError(LayoutError):
    """``[model] kernel_source`` does not name a model that owns its own sources."""

    path: Path
    rel: str
    model_dir: Path
    referent: Path
    problem: str

    template = "{rel}: [model] kernel_source: {problem}"


class UnknownModel(LayoutError):
    """``kernels/<hw>/<model>`` does not exist."""

    target: Target
    model_dir: Path
    rel: str

    template = (
        "{rel}: no such directory: `{target.model}` is not a model of "
        "kernels/{target.hardware} (target {target})"
    )


class NoKernelDirectory(LayoutError):
    """None of a target's layer directories exists."""

    target: Target
    dirs: tuple[Path, ...]
    rels: tuple[str, ...]

    template = "target {target} has no kernel directory: none of {listed} exists"

    @property
    def listed(self) -> str:
        return ", ".join(self.rels)


class SymlinkError(LayoutError):
    """A layer child or a used file is a symlink; trees hold real files only."""

    path: Path
    rel: str
    manifest: Path | None = None

    template = (
        "{rel}: is a symlink; kernel trees hold real files only "
        "(share a file with [sources] use instead)"
    )


class UseError(LayoutError):
    """A ``[sources] use`` string does not name a kernel file of the tree."""

    manifest: Path
    rel: str
    use: str
    problem: str

    template = "{rel}: [sources] use {use!r}: {problem}"


class UseCollides(LayoutError):
    """A used file's name is already an entry of the same layer."""

    manifest: Path
    rel: str
    use: str
    name: str
    existing: Path
    existing_rel: str

    template = (
        "{rel}: [sources] use {use!r}: this layer already has an entry named "
        "{name!r} ({existing_rel}); remove one of them"
    )


class UndeclaredShadow(LayoutError):
    """A win that the winner's layer does not declare in ``[shadow]``.

    ``rels`` spells the winner, the loser and the manifest root-relative;
    ``exists`` says whether that manifest exists.
    """

    _: KW_ONLY
    winner: Path
    loser: Path
    manifest: Path
    stem: str
    role: Role
    rels: tuple[str, str, str]
    exists: bool

    def __str__(self) -> str:
        w, lo, m = self.rels
        todo = "add" if self.exists else "create it with"
        return (
            f"{w} shadows {lo} but {m} does not declare it: {todo} "
            f'`[shadow] {toml_key(self.stem)} = "<reason>"` in {m}'
        )


class DeadShadow(LayoutError):
    """A ``[shadow]`` key that covers no win."""

    manifest: Path
    rel: str
    stem: str
    target: Target

    template = (
        "{rel}: [shadow] {key} declares a shadow, but no file of stem {stem!r} "
        "in this layer shadows another (target {target}); remove the key"
    )

    @property
    def key(self) -> str:
        """The ``[shadow]`` key as TOML spells it."""
        return toml_key(self.stem)


class SelfShadow(LayoutError):
    """A win of a file over itself (typically a ``use`` of a file the common role reaches)."""

    path: Path
    rel: str
    name: str
    manifest: Path
    manifest_rel: str

    template = (
        "{rel} shadows itself as {name!r} (declared through {manifest_rel}): "
        "the file is already reached; remove the [sources] use of it"
    )


class RetiredKey(LayoutError):
    """``[kernels] overrides`` in HARDWARE.toml: replacements go to ``[shadow]`` now."""

    path: Path
    rel: str
    key: str

    template = (
        "{rel}: {key} is retired: declare each replacement in [shadow] of the "
        "winner's KERNEL.toml instead, then remove the key"
    )


class UnnamableFile(LayoutError):
    """A file or directory name under ``kernels/`` is not valid UTF-8.

    Python keeps such a name's bytes as lone surrogates; doit's database, the
    cache keys and every message hold names as UTF-8, so the tree must be fixed.
    """

    path: Path
    rel: str

    def __str__(self) -> str:
        return unnamable_message(self.rel)


def unnamable_message(rel: str) -> str:
    """The one-line message for a path whose name is not valid UTF-8 (pure)."""
    return (
        f"{printable(rel)}: the name is not valid UTF-8; rename it (kernel trees, "
        "doit's database and the cache keys hold file names as UTF-8)"
    )


class UnsafeTargetName(LayoutError):
    """A directory name that breaks its target's doit task name in a CI matrix row (split
    at whitespace, matched as a pattern, or read as a doit variable)."""

    rel: str
    target: str
    hazard: str

    template = (
        "{rel}: the directory name holds {hazard}: target {target} cannot be named in a "
        "matrix row or on doit's command line (a row's build tasks are split at whitespace, "
        "`*?[]` are patterns, `=` is a doit variable); rename the directory"
    )


def unsafe_target_name(target: Target) -> UnsafeTargetName | None:
    """The first of ``target``'s directories whose name breaks its task name, or None
    (pure)."""
    parts = (target.hardware, target.model, target.quant)
    for depth, name in enumerate(parts, 1):
        hazard = name_hazard(name)
        if hazard is not None:
            rel = "/".join(("kernels", *parts[:depth]))
            return UnsafeTargetName(printable(rel), printable(str(target)), hazard)
    return None
