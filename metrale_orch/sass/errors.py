"""The errors of the SASS diff: one base, a subclass per case, each naming what to do."""

from __future__ import annotations

from metrale_orch.errors import EXIT_FAILURE, EXIT_USAGE, FileProblem, MetraleError

__all__ = ["ArtefactMismatch", "DisassemblerMissing", "SassError", "UndisassemblableArtefact"]


class SassError(MetraleError):
    """Base of the SASS diff's errors."""


class DisassemblerMissing(SassError):
    """Neither ``cuobjdump`` nor ``nvdisasm`` is installed (exit 2: the machine lacks a
    tool, nothing was compared)."""

    searched: str

    exit_code = EXIT_USAGE
    template = (
        "sass-diff needs cuobjdump or nvdisasm (not found on {searched}); install them with "
        "`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` "
        "(or `pip install 'metrale-orch[sass]'`)"
    )


class UndisassemblableArtefact(FileProblem, SassError):
    """An artefact the manifest lists cannot be read, or the disassembler refuses it."""

    exit_code = EXIT_FAILURE


class ArtefactMismatch(SassError):
    """An artefact a build directory's manifest lists is missing, unreadable, or not the
    bytes the manifest's hash names (exit 2: that directory is not the build its manifest
    describes, so nothing it holds can be compared)."""

    path: str
    manifest: str
    #: What is wrong: "is missing", "cannot be read (...)", "is not the bytes ...".
    problem: str

    exit_code = EXIT_USAGE
    template = (
        "sass-diff: {path}, listed in {manifest}, {problem}; that build directory is not "
        "the build its manifest describes: copy it again whole, or rebuild it"
    )
