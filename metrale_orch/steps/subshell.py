"""What a compiler's sub-shell misreads in a path, and the check before any compile.

nvcc runs each of its steps (the host preprocessor, ``cicc``, ``ptxas``) as one
``sh -c`` command line it writes itself, with some paths in double quotes and
option values split at commas. A path holding a character that shell reads
specially is then expanded or cut: ``-o /x/a$b/k.ptx`` reaches ``cicc`` as
``/x/a/k.ptx`` and the compile fails with ``cicc: IO error``. So the build hands
the compiler every path it can relative to the module's working directory (the
artefact, the depfile, the intermediate, the include directories: see
:func:`~metrale_orch.steps.compile.run_compile`); what is left is checked here, once,
before the first compile:

- the working directory itself (below the build directory): nvcc names the
  source by its absolute path in double quotes (``--orig_src_path_name``, with
  ``"`` escaped), so a backquote, ``\\"``, ``$(`` or ``${`` there breaks every
  compile, and ``$$`` (the shell's process id) changes the names nvcc hashes
  from that path for internal-linkage device symbols on every compile; a plain
  ``$x`` is expanded in that name too, the same way every time (``extern "C"``
  entry points' artefacts are byte for byte those of a plain directory);
- absolute paths the compiler still gets from a variable (``TMPDIR``,
  ``NVCC_CCBIN``): ``$``, a backquote or ``\\"`` there breaks them;
- include directories still reached through the root (a HIP compat directory
  outside the build directory's reach): nvcc splits them at commas and quotes
  them in single quotes, so a comma, a quote or a backquote breaks them;
- the toolkit's own directories, which nvcc puts in double quotes in its
  commands: ``$``, a backquote or a double quote there breaks them.

Measured with nvcc 13.0 (``sh`` is dash). Spaces, ``;&|()<>*?!#~=:{}[]%@^+``,
tabs, newlines, backslashes and non-ASCII letters are safe in all of these
places; only the depfile, which nvcc passes unquoted in ``-Xcompiler=``, breaks
on them, and it is relative (it holds none of the checkout's path).
The ``*_problem`` functions are pure; :func:`check_compile_paths` resolves
symlinks (the compiler sees physical paths) and raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from metrale_orch.steps.errors import UnsafePathError

__all__ = [
    "PathProblem",
    "check_compile_paths",
    "cwd_problem",
    "include_problem",
    "toolkit_problem",
    "variable_problem",
]


class PathProblem(NamedTuple):
    """What in a path the compiler's sub-shell misreads."""

    #: The offending text: one character, or ``$(``, ``${``, ``$$``, ``\\"``.
    text: str
    #: Why it breaks ("nvcc's sub-shell expands as a variable").
    why: str


_SHELL = "nvcc's sub-shell"
#: In a double-quoted word of an ``sh`` command line (the working directory's path).
_IN_QUOTES: tuple[PathProblem, ...] = (
    PathProblem("`", f"{_SHELL} runs as a command substitution"),
    # nvcc escapes a double quote there, but not a backslash before one.
    PathProblem('\\"', f"ends the double quotes {_SHELL} reads the path in"),
    PathProblem("$(", f"{_SHELL} runs as a command substitution"),
    PathProblem("${", f"{_SHELL} reads as a parameter expansion"),
    PathProblem(
        "$$",
        f"{_SHELL} expands to its process id, which nvcc hashes into the names of internal "
        "device symbols: they would differ every compile",
    ),
)
#: In a toolkit directory nvcc spells in double quotes (``"$_HERE_/..."``, ``-I"..."``).
_IN_TOOLKIT: tuple[PathProblem, ...] = (
    PathProblem("`", f"{_SHELL} runs as a command substitution"),
    PathProblem('"', f"ends the double quotes {_SHELL} reads the path in"),
    PathProblem("$", f"{_SHELL} expands as a variable"),
)
#: In a path nvcc gets from a variable or an argument and quotes with ``"`` escaped
#: (``TMPDIR``, ``NVCC_CCBIN``, ``-ccbin``, the source; not ``-o``: that is quoted as
#: the toolkit is).
_IN_VARIABLE: tuple[PathProblem, ...] = (
    PathProblem("`", f"{_SHELL} runs as a command substitution"),
    PathProblem('\\"', f"ends the double quotes {_SHELL} reads the path in"),
    PathProblem("$", f"{_SHELL} expands as a variable"),
)
#: In an include directory (``-I``, ``-include``): nvcc splits it at commas and passes
#: it on in single quotes.
_IN_INCLUDE: tuple[PathProblem, ...] = (
    PathProblem("`", f"{_SHELL} runs as a command substitution"),
    PathProblem('"', f"{_SHELL} reads as a quote"),
    PathProblem("'", f"ends the single quotes {_SHELL} reads the path in"),
    PathProblem(",", "nvcc reads as a separator between option values"),
)


def _first(path: str, table: Sequence[PathProblem]) -> PathProblem | None:
    hits = [(path.find(p.text), p) for p in table if p.text in path]
    return min(hits)[1] if hits else None


def cwd_problem(path: str) -> PathProblem | None:
    """The problem for a compile's working directory, or None (pure)."""
    return _first(path, _IN_QUOTES)


def toolkit_problem(path: str) -> PathProblem | None:
    """The problem for a directory of the compiler's toolkit, or None (pure)."""
    return _first(path, _IN_TOOLKIT)


def variable_problem(path: str) -> PathProblem | None:
    """The problem for an absolute path the compiler gets from a variable
    or an argument (``TMPDIR``, ``NVCC_CCBIN``, ``-o``), or None (pure)."""
    return _first(path, _IN_VARIABLE)


def include_problem(path: str) -> PathProblem | None:
    """The problem for an include directory (``-I``), or None (pure)."""
    return _first(path, _IN_INCLUDE)


def check_compile_paths(
    *,
    build_dir: Path,
    environ: Mapping[str, str],
    toolkit: Sequence[str] = (),
    host_compiler_env: str = "",
    compat_dir: Path | None = None,
) -> None:
    """Raise :class:`UnsafePathError` for the first path the compiles of a build would
    see that the compiler's sub-shell misreads (I/O: resolves symlinks).

    ``build_dir``: where every compile runs (its stage) and writes (its ``.tmp``);
    ``toolkit``: the toolkit directories the probe found; ``host_compiler_env``: the
    variable naming another host compiler (``NVCC_CCBIN``); ``compat_dir``: the HIP
    compat directory, which a compile reaches relative to its stage.
    """
    for spelling in dict.fromkeys((os.path.abspath(build_dir), os.path.realpath(build_dir))):
        found = cwd_problem(spelling)
        if found:
            raise UnsafePathError(
                "the build directory",
                spelling,
                *found,
                "every compile runs below it: rename or move the project, or set build_dir "
                "(METRALE_ORCH_BUILD_DIR) to a directory without it",
            )
    tmpdir = environ.get("TMPDIR", "")
    found = variable_problem(tmpdir) if tmpdir else None
    if found:
        raise UnsafePathError(
            "TMPDIR", tmpdir, *found, "nvcc writes its temporary files there: set another TMPDIR"
        )
    host = environ.get(host_compiler_env, "") if host_compiler_env else ""
    found = variable_problem(host) if os.sep in host else None
    if found:
        raise UnsafePathError(
            host_compiler_env,
            host,
            *found,
            f"the host compiler is passed on to every step: point {host_compiler_env} at a "
            "path without it",
        )
    for folder in toolkit:
        found = toolkit_problem(folder)
        if found:
            raise UnsafePathError(
                "the compiler's toolkit",
                folder,
                *found,
                "install the toolkit (or the virtual environment holding it) in a directory "
                "without it",
            )
    if compat_dir is not None:
        rel = os.path.relpath(os.path.realpath(compat_dir), os.path.realpath(build_dir))
        found = include_problem(rel)
        if found:
            raise UnsafePathError(
                "the HIP compat directory",
                os.fspath(compat_dir),
                *found,
                "compiles reach it from the build directory: keep both inside the project "
                "and rename the directory holding it",
            )
