"""Whether a file is the user's own: the one check, as ssh's ``StrictModes`` makes it.

A file whose content can change what a build serves or how it keys (the toolkit-hash
memo, probe records and plans, the task cache, arch-check verdicts, the kept dataclass
code) and a private key are used only when this process's user owns them and no one
else may write them (a private key: nor read them). Anyone else's file there is
ignored (a memo) or refused (a key). A directory such a file is written into must be
owned by the user; its modes do not matter (umask 002 makes every directory
group-writable), because the file is written new and private and checked again on every
read.

:func:`read_own` reads a file on that condition (:func:`metrale_orch.fsutil.write_own`
writes one). Only the standard library is imported: the kept dataclass code and the
early dry runs use this before anything else of the package is imported.
"""

import errno
import os
import stat
from pathlib import Path

__all__ = ["not_own", "read_own", "read_regular"]


def not_own(st: os.stat_result, *, secret: bool = False, directory: bool = False) -> str:
    """Why the file whose stat is ``st`` is not the user's own, or "" when it is (pure).

    ``secret`` (a private key): not readable by group or others either. ``directory``
    (where such a file is written): only the owner is checked. Where the system has no
    user ids (Windows) every file is the user's own."""
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return ""
    uid = getuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if directory:
        return ""
    if st.st_mode & 0o022:
        return "writable by group or others"
    if secret and st.st_mode & 0o044:
        return "readable by group or others"
    return ""


def read_own(path: Path | str) -> bytes:
    """The bytes of the regular file at ``path`` when it is the user's own (owned by this
    user, writable by no one else: :func:`not_own`), checked on
    the file read. Raises OSError: ``PermissionError`` saying why for anyone else's file,
    and for anything but a regular file (a FIFO there is not waited on)."""
    return _read_regular(path, own=True)


def read_regular(path: Path | str, *, follow: bool = True, most: int = -1) -> bytes:
    """The bytes of the regular file at ``path``, whoever owns it: for a file that decides
    no byte of a build (kept compile times, the build history), which is checked for what
    it holds; ``follow=False`` refuses a symbolic link there (``ELOOP``), ``most`` reads at
    most that many bytes. Raises OSError, and for anything but a regular file (a FIFO
    there is not waited on)."""
    return _read_regular(path, own=False, follow=follow, most=most)


def _read_regular(path: Path | str, *, own: bool, follow: bool = True, most: int = -1) -> bytes:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags if follow else flags | getattr(os, "O_NOFOLLOW", 0))
    try:  # checked before a file object is made of it: one refuses a directory itself
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        problem = not_own(st) if own else ""
        if problem:
            raise PermissionError(errno.EPERM, problem, os.fspath(path))
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(most)
    finally:
        os.close(fd)
