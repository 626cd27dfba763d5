"""The build steps' errors: one base (:class:`BuildError`) and a class per case.

Each error keeps its data as attributes (fields, see
:class:`~metrale_orch.errors.MetraleError`) and says what and where in its text
(file and key, target and module, the command line and the compiler's
output). Imports nothing of the build steps, so every step may raise them; the
toolchain's own errors (:mod:`metrale_orch.toolchain.errors`) are named here too.
"""

from __future__ import annotations

from collections.abc import Sequence

from metrale_orch.errors import FileProblem, MetraleError
from metrale_orch.proc import format_argv
from metrale_orch.toolchain.errors import ToolchainError, ToolchainMissing

__all__ = [
    "BuildConfigError",
    "BuildError",
    "CompileError",
    "ContainmentError",
    "HistoryError",
    "HistoryMissing",
    "MissRefused",
    "ModuleFailure",
    "ProfileError",
    "ProfileMissing",
    "StageError",
    "ToolchainError",
    "ToolchainMissing",
    "UnsafePathError",
]


class BuildError(MetraleError):
    """Base of every error of the build steps (toolchains, staging, compiling)."""

    exit_code = 1


class BuildConfigError(BuildError):
    """A build setting in a manifest is wrong; names the file and the key."""

    exit_code = 2

    path: str
    key: str
    problem: str

    template = "{path}: {key}: {problem}"


class CompileError(BuildError):
    """The compiler failed on one module (or wrote no output)."""

    def __init__(
        self,
        *,
        target: str,
        module: str,
        argv: Sequence[str],
        returncode: int | None,
        output: str,
        reason: str = "",
        source: str = "",
        assigned: str = "",
    ) -> None:
        self.target = target
        self.module = module
        #: The module's source in the tree (root-relative), when known: the compiler's
        #: messages name the staged copy in the role directory.
        self.source = source
        self.argv = tuple(argv)
        #: Variables the toolchain sets for the command (``HIP_PLATFORM=amd``), "" for none.
        self.assigned = assigned
        self.returncode = returncode
        self.output = output
        self.reason = reason or (
            f"exited with status {returncode}" if returncode is not None else "did not finish"
        )
        where = f" ({source})" if source else ""
        text = f"{target}: module {module}{where}: the compiler {self.reason}\n  $ {self.command}"
        if output.strip():
            text += "\n" + output.rstrip()
        super().__init__(text)

    @property
    def command(self) -> str:
        """The command line as a shell would run it, with the toolchain's variables."""
        line = format_argv(self.argv)
        return f"{self.assigned} {line}" if self.assigned else line

    def to_dict(self) -> dict[str, str | int | None]:
        return {
            "target": self.target,
            "module": self.module,
            "source": self.source,
            "command": self.command,
            "exit_code": self.returncode,
            "reason": self.reason,
            "output": self.output,
        }


class MissRefused(BuildError):
    """``require_hits``: every cache tier missed a module, so it would compile here; it is
    not compiled. A smoke job on a GPU runner sets it: the build job of the hardware (on a
    CPU runner) should have filled the shared cache, and a miss means it did not."""

    target: str
    module: str
    #: The module's source in the tree (root-relative).
    source: str
    key: str
    #: What was asked, in words (:meth:`metrale_orch.cache.Cache.tiers`).
    tiers: str
    #: Whether an entry of the key was found but recorded other inputs than these.
    rejected: bool = False

    def __str__(self) -> str:
        found = "only an entry compiled from other inputs" if self.rejected else "no entry"
        return (
            f"{self.target}: module {self.module} ({self.source}): NOT COMPILED: require_hits "
            f"is set and the shared cache did not have key {self.key}: {found}; asked "
            f"{self.tiers}. The build job for this hardware must run first and share the cache "
            "(the same cache URL and the same toolchain install: the key includes it), or "
            "unset require_hits to compile here"
        )

    def to_dict(self) -> dict[str, str | int | None]:
        return {
            "target": self.target,
            "module": self.module,
            "source": self.source,
            "key": self.key,
            "reason": "require_hits: not in the cache",
        }


#: A failure of one module that does not stop the target's other modules.
ModuleFailure = CompileError | MissRefused


class StageError(BuildError):
    """A target cannot be staged (colliding staged paths, unwritable build dir)."""

    target: str
    path: str
    problem: str

    template = "{target}: staging {path}: {problem}"


class ContainmentError(StageError):
    """A file the build would stage lies outside ``kernels/`` or is reached through a symlink.

    ``via`` is the root-relative MODEL.toml whose ``[model] kernel_source`` led there
    ("" when no redirect did): the file and the key to change.
    """

    exit_code = 2

    via: str = ""

    template = "{target}: {detail}"

    @property
    def detail(self) -> str:
        """The message without the target: the file reached, why, and where to fix it."""
        text = f"{self.path}: {self.problem}"
        if self.via:
            text += (
                f" (reached through [model] kernel_source of {self.via}); "
                "point that kernel_source at a model directory inside kernels/"
            )
        return text


class UnsafePathError(BuildError):
    """A path every compile would see holds text the compiler's sub-shell misreads
    (:mod:`~metrale_orch.steps.subshell`); raised before any compile."""

    exit_code = 2

    #: What the path is ("the build directory", "TMPDIR", ...).
    what: str
    path: str
    #: The offending text (one character, or ``$(``/``${``) and why it breaks.
    text: str
    why: str
    hint: str

    template = "{what} {path} contains {text!r}, which {why}; {hint}"


class ProfileMissing(BuildError):
    """No build has written its profile (``<build_dir>/profile.json``) yet."""

    path: str

    template = "no build profile yet: run doit build"


class ProfileError(FileProblem, BuildError):
    """``profile.json`` cannot be read as a trace-event file; names the file."""

    template = "{path}: {problem} (run doit build to write a new profile)"


class HistoryMissing(BuildError):
    """No build has written the build history (``<build_dir>/.state/profile-history.json``)."""

    path: str

    template = "no build history yet ({path}): run doit build"


class HistoryError(BuildError):
    """The build history is not one this package wrote; names the file and the entry
    (``builds[3].finished: ...``)."""

    exit_code = 2

    path: str
    problem: str

    template = "{path}: {problem} (the next doit build that runs something starts a new one)"
