"""Names in a kernel tree: manifest file names, vendors' source extensions, stems.

Pure string functions, no I/O. A kernel file is a source of the hardware's one
source extension or a header (:data:`HEADER_EXTS`); a file's stem is the text
before its last dot. Every spelling here is a root-relative POSIX string.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "COMMON",
    "HARDWARE_TOML",
    "HEADER_EXTS",
    "KERNEL_TOML",
    "MODEL_TOML",
    "VENDOR_EXT",
    "ext_of",
    "is_kernel_file",
    "join_rel",
    "name_hazard",
    "source_ext",
    "stem_of",
    "toml_key",
]

HEADER_EXTS: tuple[str, ...] = ("cuh", "h")

VENDOR_EXT: Mapping[str, str] = MappingProxyType(
    {
        "nvidia": "cu",
        "cuda": "cu",
        "amd": "cu",
        "rocm": "cu",
        "scale": "cu",
        "hip": "cu",
        "apple": "metal",
        "metal": "metal",
    }
)

HARDWARE_TOML = "HARDWARE.toml"
MODEL_TOML = "MODEL.toml"
KERNEL_TOML = "KERNEL.toml"
COMMON = "common"


def source_ext(vendor: str) -> str | None:
    """Kernel-source extension for a ``[hardware] vendor``, or None for an unknown vendor."""
    return VENDOR_EXT.get(vendor)


def stem_of(name: str) -> str:
    """Text before the last dot (``a.b.cu`` -> ``a.b``); a name without a dot is its own stem."""
    dot = name.rfind(".")
    return name if dot < 0 else name[:dot]


def ext_of(name: str) -> str | None:
    """Text after the last dot, or None for a name without a dot."""
    dot = name.rfind(".")
    return None if dot < 0 else name[dot + 1 :]


def is_kernel_file(name: str, src_ext: str) -> bool:
    """A source of extension ``src_ext`` or a header."""
    ext = ext_of(name)
    return ext is not None and (ext == src_ext or ext in HEADER_EXTS)


def toml_key(stem: str) -> str:
    """``stem`` spelled as a TOML key: bare when it may be, else quoted."""
    bare = stem and all((c.isalnum() and c.isascii()) or c in "-_" for c in stem)
    return stem if bare else '"' + stem.replace("\\", "\\\\").replace('"', '\\"') + '"'


def join_rel(rel: str, name: str) -> str:
    """``rel/name`` for root-relative spellings (``name`` alone under the root)."""
    return f"{rel}/{name}" if rel else name


#: What a target's name must not hold besides whitespace: a CI matrix row's ``build`` is
#: its doit task names joined by spaces and split at whitespace by the workflow; each
#: name is matched as an fnmatch pattern (``*?[]``), and doit takes an argument holding
#: ``=`` for a variable, not a task.
_TASK_NAME_HAZARDS = "*?[]="


def name_hazard(name: str) -> str | None:
    """What in a directory ``name`` breaks its target's task name on a command line, or
    None (pure): ``"whitespace"``, or the pattern and doit characters it holds."""
    if any(c.isspace() for c in name):
        return "whitespace"
    held = "".join(c for c in _TASK_NAME_HAZARDS if c in name)
    return f"{held!r}" if held else None
