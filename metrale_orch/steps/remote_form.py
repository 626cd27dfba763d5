"""A module compile's remote form (REAPI): what a worker needs and nothing else (I/O: which).

:func:`remote_form` turns a compile rendered for this machine into the
:class:`~metrale_orch.executor.RemoteForm` a remote executor sends: the stage as the
input root, the module's directory as the working directory, the outputs at fixed
paths under :data:`OUT_DIR` (so the same compile is the same remote action in every
run), the program's absolute path (the worker must have the same toolkit at the same
place; the platform properties pin its identity), and a minimal environment: ``PATH``
(the compiler's and the host compiler's directories first) and the variables the
toolchain reads. A compile
that names a file outside the input root and the toolchain's own directories cannot
be honoured remotely: its form says why (``local_reason``) and it runs here.
"""

from __future__ import annotations

import functools
import os
import platform as platform_mod
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale_orch.executor import RemoteForm
from metrale_orch.toolchain.argv import keyed_environment
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.probe import host_compiler

__all__ = ["OUT_DIR", "outside_input_root", "platform_properties", "remote_form"]

#: Where a remote compile writes, under its working directory.
OUT_DIR = ".metrale-out"

#: ``platform.machine()`` -> the REAPI ``ISA`` spelling (Bazel's, Buildbarn's).
_ISA = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "aarch64", "arm64": "aarch64"}

#: The directories a remote ``PATH`` always ends with.
_SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def platform_properties(toolchain: str, identity: str, container_image: str = "") -> dict[str, str]:
    """The platform a worker must offer to run this toolchain's compiles (sorted): the OS
    and ISA, the toolchain's name, version text and identity digest (what a worker's
    toolkit must be, byte for byte), and the container image when one is set."""
    human, _, digest = identity.rpartition(" | ")
    props = {
        "OSFamily": platform_mod.system().lower() or "linux",
        "ISA": _ISA.get(platform_mod.machine().lower(), platform_mod.machine().lower()),
        "metrale-toolchain": toolchain,
        "metrale-toolchain-id": digest or identity,
        "metrale-toolchain-version": " ".join((human or identity).split()),
    }
    if container_image:
        props["container-image"] = container_image
    return dict(sorted(props.items()))


#: A path after an option's name in one piece of a word (``-I/x``, ``-isystem/x``,
#: ``--include-path`` then ``=/x``): the option's letters, then ``/`` or ``..``.
_AFTER_OPTION = re.compile(r"^-+[A-Za-z_-]*?(/.*|\.\.(?:/.*)?)$")


def _paths_in(word: str) -> list[str]:
    """Every path a compiler word may name: its pieces between ``=``, ``,`` and (in a
    search path) ``:``, each as it is or after an option's name (pure)."""
    out: list[str] = []
    for piece in re.split(r"[=,:]", word):
        if piece.startswith("/") or piece == ".." or piece.startswith("../"):
            out.append(piece)
        elif piece.startswith("-"):
            found = _AFTER_OPTION.match(piece)
            if found:
                out.append(found.group(1))
    return out


@functools.lru_cache(maxsize=1024)
def _words(value: str) -> tuple[str, ...]:
    """A variable's or flag's words as the compiler driver splits them (shell-like; pure,
    remembered: every module of a target has the same environment)."""
    try:
        return tuple(shlex.split(value))
    except ValueError:
        return tuple(value.split())


def outside_input_root(
    words: Sequence[str], env: Mapping[str, str], *, cwd: str, allowed: Sequence[str]
) -> str:
    """What in ``words`` (the argv after the program) or ``env`` names a place outside the
    input root (``cwd`` is the working directory relative to it) and outside the
    ``allowed`` absolute directories (the toolchain's own), or "" (pure).

    Conservative: any absolute path anywhere in a word (``-Xcompiler=-I/x``, a list after
    a comma, a search path's entries) counts, and every word of a variable's value (the
    ``NVCC_*_FLAGS`` are flag lists): a directory the worker lacks is silently skipped by
    the compiler, so a header there could shadow another without anything failing.
    """
    tops = tuple(os.path.normpath(a) for a in allowed if a)

    def outside(path: str) -> bool:
        if path.startswith("/"):
            norm = os.path.normpath(path)
            return not any(norm == t or norm.startswith(t.rstrip("/") + "/") for t in tops)
        norm = posixpath.normpath(posixpath.join(cwd, path))
        return norm == ".." or norm.startswith("../")

    def first_outside(word: str) -> str:
        return next((path for path in _paths_in(word) if outside(path)), "")

    for word in words:
        hit = first_outside(word)
        if hit:
            return f"the command names {hit!r}, outside the input root"
    for name, value in sorted(env.items()):
        if name == "PATH":
            continue
        for word in _words(value):
            hit = first_outside(word)
            if hit:
                return f"{name} names {hit!r}, outside the input root"
    return ""


def remote_form(
    *,
    root: Path,
    files: Mapping[str, str],
    cwd: str,
    argv: Sequence[str],
    outputs: Mapping[str, Path],
    toolchain: Toolchain,
    identity: str,
    environ: Mapping[str, str],
    allowed: Sequence[str],
    container_image: str = "",
    reason: str = "",
) -> RemoteForm:
    """The remote form of one compile step (see the module docstring). ``argv`` is the
    step rendered with its outputs under :data:`OUT_DIR`; ``reason`` a cause already
    known why it must run here."""
    env = keyed_environment(toolchain, environ)
    program = Path(argv[0])
    # The host compiler is pinned by PATH alone (its directory right after the compiler's,
    # as the local PATH finds it first), not by NVCC_CCBIN: setting that would override a
    # toolkit profile's compiler-bindir and could pick another compiler than here.
    host = host_compiler(toolchain, environ)
    dirs = [str(program.parent)] + ([str(host.parent)] if host is not None else [])
    env["PATH"] = os.pathsep.join(dict.fromkeys([*dirs, *_SYSTEM_PATH]))
    if not reason:
        reason = outside_input_root(argv[1:], env, cwd=cwd, allowed=[*allowed, *dirs])
    if not reason and any(f"{OUT_DIR}/" in f"/{f}/" for f in files):
        reason = f"the stage holds a {OUT_DIR}/ directory, where remote compiles write"
    return RemoteForm(
        root=root,
        files=files,
        cwd=cwd,
        argv=tuple(argv),
        env=dict(sorted(env.items())),
        outputs=dict(sorted(outputs.items())),
        platform=platform_properties(toolchain.name, identity, container_image),
        local_reason=reason,
    )
