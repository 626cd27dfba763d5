"""The optional parts of the package, and the one line a missing one becomes.

Each :class:`Extra` names the modules it installs and the command that installs them
(``pip install 'metrale-orch[remote]'``; a required dependency a distribution left out,
such as ``cryptography``, names its own ``pip install``). Where a part is first used it
imports through :func:`import_extra`, or turns the ``ImportError`` of a deferred import
into :class:`ExtraMissing` with :func:`missing_extra`: so a missing extra is one line
saying what needs what and the command to run, never a traceback. What happens next is
the caller's: remote execution and the remote cache warn and build here (strict remote
execution stops, exit 2), a command that cannot work without the part exits 2.

An ``ImportError`` naming a module of no extra is a bug and is not translated.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from metrale_orch.errors import MetraleError

__all__ = [
    "GCS",
    "GPU",
    "REMOTE",
    "S3",
    "SIGNING",
    "Extra",
    "ExtraMissing",
    "import_extra",
    "missing_extra",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Extra:
    """An optional part: its extra's name ("" for a required dependency) and the
    top-level modules it installs (the first is the one a message names)."""

    name: str
    modules: tuple[str, ...]

    @property
    def fix(self) -> str:
        """The command that installs it."""
        if self.name:
            return f"pip install 'metrale-orch[{self.name}]'"
        return f"pip install {self.modules[0]}"


#: grpcio, protobuf and googleapis-common-protos (``google.protobuf``, ``google.rpc``).
REMOTE = Extra(name="remote", modules=("grpc", "google"))
S3 = Extra(name="s3", modules=("s3fs",))
GCS = Extra(name="gcs", modules=("gcsfs",))
#: CuPy, and NumPy, which CuPy depends on.
GPU = Extra(name="gpu", modules=("cupy", "numpy"))
#: Ed25519 for signed cache entries: a required dependency, imported only when keys are set.
SIGNING = Extra(name="", modules=("cryptography",))


class ExtraMissing(MetraleError):
    """``purpose`` needs ``module``, which is not installed (exit 2)."""

    purpose: str
    module: str
    fix: str

    template = "{purpose} needs {module}: {fix}"


def missing_extra(exc: ImportError, extra: Extra, purpose: str) -> ExtraMissing | None:
    """The error for ``exc`` when the module it misses is one of ``extra``'s, else None
    (pure)."""
    name = exc.name or ""
    if name.split(".")[0] not in extra.modules:
        return None
    return ExtraMissing(purpose, name, extra.fix)


def import_extra(extra: Extra, purpose: str, module: str = "") -> ModuleType:
    """Import ``module`` (default: the extra's first) and return it. Raises
    :class:`ExtraMissing` when a module of ``extra`` is missing (the ``ImportError``
    otherwise)."""
    try:
        return importlib.import_module(module or extra.modules[0])
    except ImportError as exc:
        missing = missing_extra(exc, extra, purpose)
        if missing is None:
            raise
        raise missing from None
