"""The compiled code of this package's dataclass methods, kept across runs (start-up speed).

CPython 3.11's :mod:`dataclasses` writes the source of every method it generates
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, a frozen class's ``__setattr__`` and
``__delattr__``) and compiles it each time a class is made. The package's ~70 value and
error classes do that on every import: ~30 ms of the ~270 ms a cold ``doit list`` of the
real-shaped tree takes, more than resolving its 60 targets (bench/HISTORY.md, "Start-up
without compiling the dataclasses' methods"). Python keeps a module's bytecode in
``__pycache__``; this keeps the code of those generated methods the same way: one file of
code objects, keyed by the exact source text :mod:`dataclasses` generated, for this
interpreter's bytecode (its magic number and optimisation level), under the user's cache
directory (read only when the user owns it and no one else may write it). A class made
with it is the class made without it: the same source compiled the same way
(``tests/test_dataclass_code.py`` compares every method's code object).

It rests on one detail of the standard library, so it lives here alone: the doit entry
module and the command's (:mod:`metrale_orch.console`) install it (:func:`install`) before
they import anything with a dataclass, and no other module knows of it.
:mod:`dataclasses` compiles the generated source with the built-in ``exec``;
:func:`install` gives that module an ``exec`` of its own, which takes the code of a
source it has seen from the file and passes everything else to the built-in (another
library's classes, and this package's on an interpreter that makes classes another way).
The test fails loudly when a Python upgrade stops using it.

Only the standard library is imported here, :mod:`metrale_orch.ownership` (which imports
nothing else), and :mod:`metrale_orch.fsutil` when the file is written back (at exit,
after every class was made). The module has no ``from __future__`` import:
a source of another module's class goes to the built-in ``exec`` from this module's frame,
whose future flags that compile would take (postponed annotations would change such a
class's ``__init__``).
"""

import atexit
import builtins
import contextlib
import dataclasses
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from types import CodeType

from metrale_orch.ownership import read_own

__all__ = ["CodeCache", "cache_file", "install"]

#: The modules whose classes' generated code is kept (this package's).
PACKAGE = "metrale_orch"
#: Most sources kept in the file: a file that grew past it (many edits of the package's
#: classes) keeps only the sources this process used.
ENTRIES_MAX = 2048
#: The file's first bytes; then the interpreter's tag, then marshal data.
_MAGIC = b"metrale-orch dataclass code 2\n"


def _tag() -> bytes:
    """What a code object's validity depends on: the bytecode format and ``-O``."""
    return importlib.util.MAGIC_NUMBER + f" {sys.flags.optimize}\n".encode()


def cache_file(cache_home: Path) -> Path:
    """The file of this interpreter under the user's cache directory ``cache_home`` (one per
    optimisation level, as ``__pycache__`` names them: runs with and without ``-O`` do not
    replace each other's)."""
    opt = f".opt-{sys.flags.optimize}" if sys.flags.optimize else ""
    name = f"dataclass-code.{sys.implementation.cache_tag or 'python'}{opt}.marshal"
    return cache_home / "metrale-orch-code" / name


class CodeCache:
    """The code objects of the generated sources seen: those read from ``path`` (each kept
    marshalled until a class asks for it: a run makes a few hundred of the package's ~850
    methods, and reading all of them cost ~3 ms), and those compiled by this process
    (written back by :meth:`save` when there are any).

    No lock: a thread's store into a dict is atomic, and a lock held by another thread
    when doit forks a worker would stay held in the worker for good."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Source -> its code, marshalled (as read) or not (compiled or read here).
        self._code: dict[str, bytes | CodeType] = _read(path)
        self._used: set[str] = set()
        #: Sources answered from the file, and compiled here (counted without a lock:
        #: only whether any was compiled matters).
        self.hits = 0
        self.compiled = 0

    def code(self, source: str) -> CodeType:
        """The code of ``source`` (what ``exec(source)`` compiles it to)."""
        got = self._code.get(source)
        if isinstance(got, bytes):
            with contextlib.suppress(EOFError, ValueError, TypeError):
                loaded = marshal.loads(got)
                if isinstance(loaded, CodeType):
                    self._code[source] = loaded
                    got = loaded
        if isinstance(got, CodeType):
            self.hits += 1
        else:  # new, or a damaged entry
            # As exec compiles a string: file name "<string>", no future flags inherited.
            got = self._code[source] = compile(source, "<string>", "exec", dont_inherit=True)
            self.compiled += 1
        self._used.add(source)
        return got

    def save(self) -> None:
        """Write the file when this process compiled anything (atomically, readable and
        writable by the user alone; a failure to write only costs the next run the
        compiles)."""
        if not self.compiled:
            return
        kept = dict(self._code)
        if len(kept) > ENTRIES_MAX:
            kept = {s: c for s, c in kept.items() if s in self._used}
        from metrale_orch.fsutil import write_own  # at exit only: see the docstring

        with contextlib.suppress(OSError, ValueError):
            blobs = {s: c if isinstance(c, bytes) else marshal.dumps(c) for s, c in kept.items()}
            # The user's own: a file anyone else owns or may write is never read (_read).
            write_own(self.path, _MAGIC + _tag() + marshal.dumps(blobs))


def _read(path: Path) -> dict[str, bytes | CodeType]:
    """The file's marshalled code objects by source, or none when it is missing, damaged,
    another interpreter's, or one that another user owns or may write (its code would run
    here)."""
    try:
        data = read_own(path)  # the user's own file only
    except OSError:
        return {}
    head = _MAGIC + _tag()
    if not data.startswith(head):
        return {}
    try:
        blobs = marshal.loads(data[len(head) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(blobs, dict):
        return {}
    return {s: b for s, b in blobs.items() if isinstance(s, str) and isinstance(b, bytes)}


def _ours(namespace: object) -> bool:
    """Whether ``namespace`` is the globals of a module of this package."""
    name = namespace.get("__name__") if isinstance(namespace, dict) else None
    return isinstance(name, str) and (name == PACKAGE or name.startswith(PACKAGE + "."))


def install(cache_home: Path | None) -> CodeCache | None:
    """Keep the compiled code of this package's dataclass methods in the file under
    ``cache_home`` (the user's cache directory; None: nothing is kept) from now on, and
    write it back when the process exits. The cache installed, or None (no directory,
    or installed already: another ``exec`` is never replaced)."""
    if cache_home is None or getattr(dataclasses, "exec", None) is not None:
        return None
    cache = CodeCache(cache_file(cache_home))
    owner = os.getpid()

    def exec_(source: object, globals: object = None, locals: object = None, /) -> None:
        if type(source) is str and _ours(globals):
            source = cache.code(source)
        builtins.exec(source, globals, locals)  # type: ignore[arg-type]

    def save() -> None:
        if os.getpid() == owner:  # a forked worker leaves the file to its parent
            cache.save()

    dataclasses.exec = exec_  # type: ignore[attr-defined]
    atexit.register(save)
    return cache
