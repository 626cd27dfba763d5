"""Where a toolchain's compiler is installed (I/O: the file system and ``environ``).

:func:`find_program` searches the toolchain's variables, fixed paths, ``PATH``,
install prefixes and pip wheels in that order; :func:`find_root` finds the
toolkit root of a compiler picked per arch (``{root}/.../{arch}/...``);
:func:`locate_toolchain` raises :class:`~metrale_orch.toolchain.errors.ToolchainMissing`
with the text the build skips with. Nothing here runs the compiler
(:mod:`~metrale_orch.toolchain.probe` does).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.errors import ToolchainError, ToolchainMissing

__all__ = ["executable", "find_program", "find_root", "locate_toolchain"]


def _site_dirs() -> list[Path]:
    seen: list[Path] = []
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key])
        if p not in seen:
            seen.append(p)
    return seen


def executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_program(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    site_dirs: Iterable[Path] | None = None,
    arch: str = "",
) -> Path | None:
    """Where the toolchain's program is (for ``arch``, when it is picked per arch), or None.

    Order: each ``program_env`` variable that is set, then each
    ``program_paths`` entry, then ``PATH`` (from ``environ``), then ``$VAR/bin``
    for each ``home_env`` variable, then each ``pip_dirs`` entry under the
    running Python's site-packages (``site_dirs`` overrides them for tests). A
    program under ``{root}`` is looked for in the root :func:`find_root` finds.
    Raises :class:`ToolchainError` naming the variable when a ``program_env`` or
    ``root_env`` variable is set to something unusable.
    """
    return _locate(toolchain, environ, site_dirs, arch)[0]


def _locate(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    site_dirs: Iterable[Path] | None,
    arch: str,
) -> tuple[Path | None, str]:
    """(the program or None, why it is missing: "" for the plain "not found")."""
    program = toolchain.program
    if "{root}" in program:
        root = find_root(toolchain, environ)
        if root is None:
            where = ", ".join([*(f"${v}" for v in toolchain.root_env), *toolchain.root_globs])
            return None, f"no {toolchain.name} root was found ({where})"
        if not arch:
            raise ToolchainError(
                f"toolchain {toolchain.name!r}",
                "program",
                f"{program!r} is picked by [hardware] arch; set arch in HARDWARE.toml",
            )
        cand = Path(program.format(root=root, arch=arch))
        if executable(cand):
            return cand, ""
        rel = program.format(root="", arch=arch).lstrip("/")
        return None, f"{toolchain.name} at {root} has no compiler for {arch} ({rel})"
    for var in toolchain.program_env:
        value = environ.get(var)
        if value:
            cand = Path(os.path.expanduser(value))
            if not executable(cand):
                raise ToolchainError(
                    f"environment {var}",
                    "",
                    f"{value!r} is not an executable {toolchain.program}; "
                    f"point it at one, or unset it",
                )
            return cand, ""
    for path in toolchain.program_paths:
        cand = Path(os.path.expanduser(path))
        if executable(cand):
            return cand, ""
    if os.sep in program:
        p = Path(program)
        return (p if executable(p) else None), ""
    found = shutil.which(program, path=environ.get("PATH", os.defpath))
    if found:
        return Path(found), ""
    for var in toolchain.home_env:
        home = environ.get(var)
        if home:
            cand = Path(home) / "bin" / program
            if executable(cand):
                return cand, ""
    for site in _site_dirs() if site_dirs is None else site_dirs:
        for rel in toolchain.pip_dirs:
            cand = Path(site) / rel / program
            if executable(cand):
                return cand, ""
    return None, ""


def find_root(toolchain: Toolchain, environ: Mapping[str, str]) -> Path | None:
    """The toolkit root of a toolchain whose program lies under ``{root}``, or None.

    The first ``root_env`` variable that is set decides (it must be a root:
    hold every ``root_markers`` path); otherwise the ``root_globs`` in order,
    each one's matches newest version first (``scale-1.10`` before
    ``scale-1.9``), the first that is a root. ``~`` is ``environ``'s ``HOME``.
    Raises :class:`ToolchainError` naming the variable for a set one that is not
    a root.
    """
    for var in toolchain.root_env:
        value = environ.get(var)
        if value:
            root = Path(_expand_home(value, environ))
            missing = _missing_markers(toolchain, root)
            if missing:
                raise ToolchainError(
                    f"environment {var}",
                    "",
                    f"{value!r} is not a {toolchain.name} root (it has no {missing}); "
                    "point it at the installation's root directory, or unset it",
                )
            return root
    for pattern in toolchain.root_globs:
        expanded = _expand_home(pattern, environ)
        for match in sorted(glob.glob(expanded), key=_version_order, reverse=True):
            if not _missing_markers(toolchain, Path(match)):
                return Path(match)
    return None


def _expand_home(path: str, environ: Mapping[str, str]) -> str:
    if path == "~" or path.startswith("~/"):
        home = environ.get("HOME") or os.path.expanduser("~")
        return home + path[1:]
    return path


def _missing_markers(toolchain: Toolchain, root: Path) -> str:
    """The first marker ``root`` lacks ("" when it is a root)."""
    for marker in toolchain.root_markers:
        path = root / marker.rstrip("/")
        ok = path.is_dir() if marker.endswith("/") else path.exists()
        if not ok:
            return marker
    return "" if root.is_dir() else "directory"


def _version_order(path: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key comparing the digit runs of a name as numbers (``1.10`` > ``1.9``)."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part)
        for part in re.split(r"(\d+)", os.path.basename(path.rstrip("/")))
        if part
    )


def locate_toolchain(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    site_dirs: Iterable[Path] | None = None,
    arch: str = "",
) -> Path:
    """The program :func:`find_toolchain` would probe, without running it (``check``).

    Raises :class:`ToolchainMissing` with the very text the build skips with, or
    :class:`ToolchainError` as :func:`find_program`.
    """
    program, detail = _locate(toolchain, environ, site_dirs, arch)
    if program is None:
        raise ToolchainMissing(
            toolchain.name, toolchain.program, toolchain.install_hint, detail=detail
        )
    return program
