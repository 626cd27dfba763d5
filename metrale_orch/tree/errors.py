"""The errors of layout resolution: :class:`LayoutError` and a subclass per case.

Each error keeps its data as attributes (the paths as the values hold them,
the manifest key, the target) and its message, built once from root-relative
POSIX spellings, says what is wrong, where, and what to do.
"""

from __future__ import annotations

from pathlib import Path

from metrale_orch.errors import MetraleError, printable
from metrale_orch.tree.names import HARDWARE_TOML, VENDOR_EXT, toml_key
from metrale_orch.tree.values import Role, Target


class LayoutError(MetraleError):
    """Base of every layout resolution error; ``str()`` names the file(s) involved."""


class UnknownHardware(LayoutError):
    """``kernels/<hw>/HARDWARE.toml`` does not exist."""

    def __init__(self, hardware: str, path: Path, rel: str) -> None:
        self.hardware = hardware
        self.path = path
        super().__init__(
            f"{rel}: no such file: `{hardware}` is not a hardware tree "
            f"(a hardware tree is a directory kernels/<hw>/ holding {HARDWARE_TOML})"
        )


class ManifestError(LayoutError):
    """A manifest cannot be read, or a key has the wrong shape."""

    def __init__(self, path: Path, rel: str, key: str | None, problem: str) -> None:
        self.path = path
        self.key = key
        self.problem = problem
        where = f"{rel}: {key}" if key else rel
        super().__init__(f"{where}: {problem}")


class UnknownVendor(LayoutError):
    """``[hardware] vendor`` names no known vendor."""

    def __init__(self, path: Path, rel: str, vendor: str) -> None:
        self.path = path
        self.vendor = vendor
        known = ", ".join(sorted(VENDOR_EXT))
        super().__init__(
            f"{rel}: [hardware] vendor = {vendor!r} is not a known vendor (known: {known})"
        )


class InheritsError(LayoutError):
    """``[hardware] inherits`` names a tree that cannot be a parent."""

    def __init__(
        self,
        path: Path,
        rel: str,
        hardware: str,
        parent: str,
        problem: str,
        cause: LayoutError | None = None,
    ) -> None:
        self.path = path
        self.hardware = hardware
        self.parent = parent
        self.problem = problem
        self.cause = cause
        super().__init__(f"{rel}: [hardware] inherits = {parent!r}: {problem}")


class RedirectError(LayoutError):
    """``[model] kernel_source`` does not name a model that owns its own sources."""

    def __init__(self, path: Path, rel: str, model_dir: Path, referent: Path, problem: str) -> None:
        self.path = path
        self.model_dir = model_dir
        self.referent = referent
        self.problem = problem
        super().__init__(f"{rel}: [model] kernel_source: {problem}")


class UnknownModel(LayoutError):
    """``kernels/<hw>/<model>`` does not exist."""

    def __init__(self, target: Target, model_dir: Path, rel: str) -> None:
        self.target = target
        self.model_dir = model_dir
        super().__init__(
            f"{rel}: no such directory: `{target.model}` is not a model of "
            f"kernels/{target.hardware} (target {target})"
        )


class NoKernelDirectory(LayoutError):
    """None of a target's layer directories exists."""

    def __init__(self, target: Target, dirs: tuple[Path, ...], rels: tuple[str, ...]) -> None:
        self.target = target
        self.dirs = dirs
        super().__init__(
            f"target {target} has no kernel directory: none of {', '.join(rels)} exists"
        )


class SymlinkError(LayoutError):
    """A layer child or a used file is a symlink; trees hold real files only."""

    def __init__(self, path: Path, rel: str, manifest: Path | None = None) -> None:
        self.path = path
        self.manifest = manifest
        super().__init__(
            f"{rel}: is a symlink; kernel trees hold real files only "
            "(share a file with [sources] use instead)"
        )


class UseError(LayoutError):
    """A ``[sources] use`` string does not name a kernel file of the tree."""

    def __init__(self, manifest: Path, rel: str, use: str, problem: str) -> None:
        self.manifest = manifest
        self.use = use
        self.problem = problem
        super().__init__(f"{rel}: [sources] use {use!r}: {problem}")


class UseCollides(LayoutError):
    """A used file's name is already an entry of the same layer."""

    def __init__(
        self, manifest: Path, rel: str, use: str, name: str, existing: Path, existing_rel: str
    ) -> None:
        self.manifest = manifest
        self.use = use
        self.name = name
        self.existing = existing
        super().__init__(
            f"{rel}: [sources] use {use!r}: this layer already has an entry named "
            f"{name!r} ({existing_rel}); remove one of them"
        )


class UndeclaredShadow(LayoutError):
    """A win that the winner's layer does not declare in ``[shadow]``."""

    def __init__(
        self,
        *,
        winner: Path,
        loser: Path,
        manifest: Path,
        stem: str,
        role: Role,
        rels: tuple[str, str, str],
        exists: bool,
    ) -> None:
        self.winner = winner
        self.loser = loser
        self.manifest = manifest
        self.stem = stem
        self.role = role
        w, lo, m = rels
        todo = "add" if exists else "create it with"
        super().__init__(
            f"{w} shadows {lo} but {m} does not declare it: {todo} "
            f'`[shadow] {toml_key(stem)} = "<reason>"` in {m}'
        )


class DeadShadow(LayoutError):
    """A ``[shadow]`` key that covers no win."""

    def __init__(self, manifest: Path, rel: str, stem: str, target: Target) -> None:
        self.manifest = manifest
        self.stem = stem
        self.target = target
        super().__init__(
            f"{rel}: [shadow] {toml_key(stem)} declares a shadow, but no file of stem "
            f"{stem!r} in this layer shadows another (target {target}); remove the key"
        )


class SelfShadow(LayoutError):
    """A win of a file over itself (typically a ``use`` of a file the common role reaches)."""

    def __init__(self, path: Path, rel: str, name: str, manifest: Path, manifest_rel: str) -> None:
        self.path = path
        self.name = name
        self.manifest = manifest
        super().__init__(
            f"{rel} shadows itself as {name!r} (declared through {manifest_rel}): "
            "the file is already reached; remove the [sources] use of it"
        )


class RetiredKey(LayoutError):
    """``[kernels] overrides`` in HARDWARE.toml: replacements go to ``[shadow]`` now."""

    def __init__(self, path: Path, rel: str, key: str) -> None:
        self.path = path
        self.key = key
        super().__init__(
            f"{rel}: {key} is retired: declare each replacement in [shadow] of the "
            "winner's KERNEL.toml instead, then remove the key"
        )


class UnnamableFile(LayoutError):
    """A file or directory name under ``kernels/`` is not valid UTF-8.

    Python keeps such a name's bytes as lone surrogates; doit's database, the
    cache keys and every message hold names as UTF-8, so the tree must be fixed.
    """

    def __init__(self, path: Path, rel: str) -> None:
        self.path = path
        super().__init__(unnamable_message(rel))


def unnamable_message(rel: str) -> str:
    """The one-line message for a path whose name is not valid UTF-8 (pure)."""
    return (
        f"{printable(rel)}: the name is not valid UTF-8; rename it (kernel trees, "
        "doit's database and the cache keys hold file names as UTF-8)"
    )
