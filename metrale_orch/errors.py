"""The package's error base.

Every error that leaves ``metrale_orch`` derives from :class:`MetraleError`;
each package area has its own base below it (``LayoutError``,
``DefaultsError``, ``ConfigError``, ...), and a subclass per case that carries
its data as attributes. The CLI and the doit action wrapper are the only
places that catch broadly; they print ``str(error)`` as one line and exit with
``error.exit_code``.
"""

from __future__ import annotations

__all__ = ["MetraleError", "UsageError"]


class MetraleError(Exception):
    """Base of every error this package raises on purpose."""

    #: Exit status the CLI uses for this error (2: usage or tree error).
    exit_code: int = 2


class UsageError(MetraleError):
    """The command line asked for something that cannot be done as asked."""
