"""The package's error base, the interrupt it raises for a signal, and how both end a run.

Every error that leaves ``metrale_orch`` derives from :class:`MetraleError`;
each package area has its own base below it (``LayoutError``,
``DefaultsError``, ``ConfigError``, ...), and a subclass per case that carries
its data as attributes. A case declares its data as fields and renders its
message in ``__str__``; :class:`MetraleError` makes it a dataclass of them (see
there). The CLI and the doit action wrapper are the only places that catch
broadly; they print ``str(error)`` as one line and exit with ``error.exit_code``.

Exit statuses (README): :data:`EXIT_OK`, :data:`EXIT_FAILURE` (a build or
check that ran and failed), :data:`EXIT_USAGE` (usage, tree or configuration
error), and ``128 + signal`` for a run stopped by Ctrl-C (130) or SIGTERM (143).

Messages may name files whose names are not valid UTF-8 (``os.fsdecode``
keeps their bytes as lone surrogates); :func:`printable` is how any such text
is shown, so printing one never fails.
"""

from __future__ import annotations

import inspect
import re
import signal
import threading
from dataclasses import dataclass
from types import FrameType
from typing import ClassVar, NoReturn, dataclass_transform

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "FileProblem",
    "Interrupted",
    "MetraleError",
    "UsageError",
    "install_sigterm_handler",
    "interrupt_exit_code",
    "is_printable",
    "printable",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


@dataclass_transform(eq_default=False)
class MetraleError(Exception):
    """Base of every error this package raises on purpose.

    A subclass that declares fields (annotated class attributes) becomes a
    dataclass of them: its constructor takes them in order and keeps each as an
    attribute. Its message is rendered from them when it is shown: from
    :attr:`template`, a :meth:`str.format` template over the error's attributes
    (``"{rel}: [sources] use {use!r}: {problem}"``), or from its own ``__str__``
    where the text is computed. So a case states only its data and its text.

    Equality stays identity (``eq=False``: errors stay hashable) and instances
    stay mutable (Python sets ``__traceback__`` and ``__notes__`` on them). A
    subclass without fields (an area's base, a case that changes only its text
    or :attr:`exit_code`) keeps ``Exception``'s constructor: ``UsageError("...")``.
    """

    #: Exit status the CLI uses for this error (2: usage or tree error). Subclasses
    #: set it (and :attr:`template`) without an annotation: an annotated name is a field.
    exit_code: ClassVar[int] = EXIT_USAGE
    #: The message as a template over the attributes; "" for ``Exception``'s own text.
    template: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if inspect.get_annotations(cls):
            dataclass(eq=False)(cls)

    def __str__(self) -> str:
        if self.template:
            return self.template.format_map(_Attributes(self))
        return super().__str__()


class _Attributes:
    """An error's attributes (fields and properties) by name, for ``str.format_map``."""

    __slots__ = ("_error",)

    def __init__(self, error: MetraleError) -> None:
        self._error = error

    def __getitem__(self, name: str) -> object:
        return getattr(self._error, name)


class FileProblem(MetraleError):
    """A file that cannot be used as it is: the file (``path``) and what is wrong with it
    (``problem``). The cases of every area share it, beside their area's base
    (``class BadManifest(FileProblem, ResourcesError)``), and set their own
    :attr:`exit_code` and, where the line says more, :attr:`template`."""

    path: str
    problem: str

    template = "{path}: {problem}"


class UsageError(MetraleError):
    """The command line asked for something that cannot be done as asked."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM) turned into ``KeyboardInterrupt`` so a run ends as Ctrl-C ends it.

    ``signum`` is the signal's number. Built from its number, or from its own
    text (``"signal 15"``: doit's process pool re-raises a worker's interrupt
    as ``type(exc)(str(exc))``).
    """

    def __init__(self, signum: int | str = int(signal.SIGINT)) -> None:
        if isinstance(signum, str):
            found = re.search(r"\d+", signum)
            signum = int(found.group()) if found else int(signal.SIGINT)
        self.signum = int(signum)
        super().__init__(f"signal {self.signum}")

    @property
    def exit_code(self) -> int:
        """``128 + signum``, as a shell reports a process the signal ended."""
        return 128 + self.signum


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    """The SIGTERM handler of the ``metrale-orch`` commands: raise :class:`Interrupted`."""
    raise Interrupted(signum)


def install_sigterm_handler() -> bool:
    """Make SIGTERM end this process as Ctrl-C does (:func:`on_sigterm`); returns whether
    it was installed (only the main thread can set a handler).

    The doit side installs its own equivalent (``metrale_orch.tasks.actions``), which
    raises the same :class:`Interrupted`; this one spares the commands doit's import.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not on_sigterm:
        signal.signal(signal.SIGTERM, on_sigterm)
    return True


def interrupt_exit_code(exc: BaseException) -> int:
    """The exit status of a run that ``exc`` (a ``KeyboardInterrupt``) stopped: 130 for
    Ctrl-C, ``128 + signum`` for an :class:`Interrupted`."""
    if isinstance(exc, Interrupted):
        return exc.exit_code
    return 128 + int(signal.SIGINT)


def is_printable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates from an undecodable file name)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable(text: str) -> str:
    """``text`` with every byte of an undecodable file name shown as ``\\xNN`` (pure).

    ``printable("kernels/k\\udcff.cu") == "kernels/k\\\\xff.cu"``; valid text is
    returned unchanged.
    """
    if is_printable(text):
        return text
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")
