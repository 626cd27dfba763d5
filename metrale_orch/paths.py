"""One home for the facts every area shares.

The build directory's layout (``<build_dir>/<hw>/<model>/<quant>/manifest.json``,
``<build_dir>/.state/``), the names of doit's database and of the task
families, and the one root-relative spelling of a path. Imports nothing of the
package, so every layer may use it.
"""

from __future__ import annotations

import functools
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "BUILD_TASK",
    "CHECK_TASK",
    "COMMON_DIR",
    "COMPDB_NAME",
    "COVERAGE_TASK",
    "DB_NAME",
    "LOG_NAME",
    "MANIFEST_NAME",
    "PROFILE_HISTORY_NAME",
    "PROFILE_NAME",
    "SMOKE_TASK",
    "STAGE_DIR",
    "STATE_DIR",
    "STATS_NAME",
    "TMP_DIR",
    "TREE_TASK",
    "compdb_part",
    "profile_history",
    "rel_posix",
    "root_relative",
    "stage_dir",
    "stage_relpath",
    "target_dir",
    "user_cache_home",
]

#: doit's dependency database, at the project root (``dep_file`` in ``DOIT_CONFIG``).
DB_NAME = ".doit.db"
#: The build's own state under ``build_dir``: probes, file hashes, the task cache, logs.
STATE_DIR = ".state"
#: A hardware's shared role directory, in the tree and in a stage.
COMMON_DIR = "common"
#: Written last into each target's directory: what was built, from what, with which tools.
MANIFEST_NAME = "manifest.json"
#: Cache statistics of the last build, in ``build_dir``.
STATS_NAME = "cache-stats.json"
#: The last build's profile (Chrome trace events: where its time went), in ``build_dir``.
PROFILE_NAME = "profile.json"
#: The summaries of the last builds that ran something (``metrale-orch profile --list``),
#: under ``<build_dir>/.state`` (:func:`profile_history`).
PROFILE_HISTORY_NAME = "profile-history.json"
#: The JSON Compilation Database editors read (clangd: VS Code, CLion, Neovim), in
#: ``build_dir``; its per-target parts live in ``<build_dir>/.state/compdb/``.
COMPDB_NAME = "compile_commands.json"
#: The shared build log, in ``build_dir``.
LOG_NAME = "metrale-orch.log"

#: Under ``build_dir``: each target's staged copy of what its layout reaches.
STAGE_DIR = "stage"
#: Under ``build_dir``: the compiles' temporary directories.
TMP_DIR = ".tmp"

#: Task base names, as users type them (``doit build:hopper/*``, ``doit smoke:hopper``).
BUILD_TASK = "build"
SMOKE_TASK = "smoke"
CHECK_TASK = "check"
COVERAGE_TASK = "coverage"
#: The task that stands for the whole tree when it does not resolve.
TREE_TASK = "(tree)"


def user_cache_home(environ: Mapping[str, str]) -> Path | None:
    """The user's cache directory (``XDG_CACHE_HOME``, else ``~/.cache``), or None when
    the environment names neither (pure). A relative ``XDG_CACHE_HOME`` is ignored, as the
    XDG specification says (it would name a directory under wherever a run starts)."""
    xdg = environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg)
    home = environ.get("HOME")
    return Path(home) / ".cache" if home else None


def target_dir(build_dir: Path, hardware: str, model: str, quant: str) -> Path:
    """Where one target's artefacts and manifest are installed (pure)."""
    return build_dir / hardware / model / quant


def compdb_part(build_dir: Path, hardware: str, model: str, quant: str) -> Path:
    """Where one target's part of the compilation database is kept:
    ``<build_dir>/.state/compdb/<hw>/<model>/<quant>.json`` (pure)."""
    return build_dir / STATE_DIR / "compdb" / hardware / model / f"{quant}.json"


def profile_history(build_dir: Path) -> Path:
    """Where the build history is kept: ``<build_dir>/.state/profile-history.json`` (pure)."""
    return build_dir / STATE_DIR / PROFILE_HISTORY_NAME


def stage_dir(build_dir: Path, hardware: str, model: str, quant: str) -> Path:
    """Where one target is staged: ``<build_dir>/stage/<hw>/<model>/<quant>`` (pure)."""
    return build_dir / STAGE_DIR / hardware / model / quant


def root_relative(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` as POSIX text, lexically when it is spelled under
    ``root``, else after resolving both (symlinks, ``..``: I/O); ``path`` as POSIX text
    when it lies outside ``root``. How manifests, errors and warnings name a tree file;
    :func:`rel_posix` is the string-only spelling doit's ``file_dep`` holds."""
    text = os.fspath(path)
    prefix = os.fspath(root)
    if not prefix.endswith(os.sep):
        prefix += os.sep
    if text.startswith(prefix) and len(text) > len(prefix):
        text = text[len(prefix) :]
        return text if os.sep == "/" else text.replace(os.sep, "/")
    path, root = Path(path), Path(root)
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        pass
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def rel_posix(path: Path | str, root: Path | str) -> str:
    """``path`` relative to ``root`` as POSIX text when it lies under ``root``, else ``path``
    as POSIX text (pure: string work only, no ``resolve``; this runs once per edge on every
    doit invocation). A relative ``path`` is returned as given."""
    text = os.fspath(path)
    if os.sep != "/":
        text = text.replace(os.sep, "/")
    if not text.startswith("/"):
        return text
    base = os.fspath(root)
    if os.sep != "/":
        base = base.replace(os.sep, "/")
    prefix = base.rstrip("/") + "/"
    return text[len(prefix) :] if text.startswith(prefix) else text


def stage_relpath(path: str, start: str) -> str:
    """``posixpath.relpath(path, start)`` of two stage-relative POSIX paths, without the two
    reads of the working directory relpath makes for relative ones: by string work when
    ``path`` lies under ``start`` (an output under its compile's directory), remembered
    otherwise (a key names every file of a module's closure, and the same headers recur
    in every module of every target). Pure."""
    if path.startswith("/") or start.startswith("/") or ".." in f"/{path}/{start}/":
        return posixpath.relpath(path, start)  # the answer may depend on the directory
    # A clean path under ``start`` (a clean path cannot begin with an unclean one + "/").
    prefix = "" if start == "." else f"{start}/"
    if start and path.startswith(prefix) and posixpath.normpath(path) == path:
        return path[len(prefix) :]
    return _within(path, start)


@functools.lru_cache(maxsize=1 << 16)
def _within(path: str, start: str) -> str:
    return posixpath.relpath(path, start)
