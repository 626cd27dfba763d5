"""The fields of a ``[toolchain]`` table, checked (pure): keys, types, templates.

:func:`~metrale_orch.toolchain.definitions.parse_toolchain` reads a table through these:
each key is known and of its type (:func:`merged_fields`, ``extends`` overlaid), the
output kind and its flag and extension agree, the argv templates use only known
placeholders (a list placeholder alone as a token), and ``program`` uses ``{arch}`` only
under a ``{root}``. Every refusal is a :class:`~metrale_orch.toolchain.errors.ToolchainError`
naming the file and the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from metrale_orch.toolchain.errors import ToolchainError

__all__ = [
    "DIALECTS",
    "LIST_PLACEHOLDERS",
    "OUTPUT_KINDS",
    "check_program",
    "checked_arch_check",
    "checked_dialect",
    "checked_env_set",
    "checked_extension",
    "checked_name",
    "checked_output_flag",
    "checked_steps",
    "merged_fields",
    "text_field",
    "word_list",
]

#: Output kind -> (default flag, default extension). Other kinds need ``output_flag``.
OUTPUT_KINDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "ptx": ("--ptx", "ptx"),
        "cubin": ("--cubin", "cubin"),
        "fatbin": ("--fatbin", "fatbin"),
        "object": ("-c", "o"),
        "air": ("-c", "air"),
        "metallib": ("-c", "metallib"),
        "hsaco": ("--genco", "co"),
    }
)


#: How a toolchain adapts the CUDA sources and flags of a tree: "" (as they are) or
#: "hip" (the warp-mask mirror of :mod:`metrale_orch.steps.hip_mirror`, ``--fmad``
#: translated by :func:`hip_flags`, the project's HIP compat directory as ``-I``).
DIALECTS = ("", "hip")


#: Placeholders a template token may use. The list placeholders must stand alone
#: as a token (they expand to zero or more tokens).
_PLACEHOLDERS = (
    "program",
    "output_kind_flag",
    "arch",
    "virtual_arch",
    "arch_flags",
    "flags",
    "strict_flags",
    "env_flags",
    "compat_include",
    "include",
    "source",
    "intermediate",
    "output",
)


LIST_PLACEHOLDERS = (
    "{flags}",
    "{arch_flags}",
    "{strict_flags}",
    "{env_flags}",
    "{compat_include}",
)


#: Placeholders of ``program`` (a compiler inside a toolkit root, picked per arch).
_PROGRAM_PLACEHOLDERS = ("root", "arch")


_STR_KEYS = (
    "name",
    "program",
    "extends",
    "install_hint",
    "host_compiler",
    "host_compiler_env",
    "output",
    "output_flag",
    "extension",
    "flags_key",
    "intermediate_extension",
    "no_strict_env",
    "extra_flags_env",
    "dialect",
)


_LIST_KEYS = (
    "vendors",
    "version_args",
    "host_compiler_version_args",
    "argv",
    "env_allowlist",
    "home_env",
    "pip_dirs",
    "env_prefixes",
    "dryrun_args",
    "host_compiler_probe_args",
    "depfile_args",
    "host_compiler_search_args",
    "program_env",
    "program_paths",
    "root_env",
    "root_globs",
    "root_markers",
    "link_argv",
    "strict_args",
    "arch_check_args",
)


#: Keys holding a table of strings (name -> value).
_TABLE_KEYS = ("env_set",)


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def merged_fields(
    table: Mapping[str, object], where: str, base: Mapping[str, object] | None
) -> dict[str, object]:
    """``base``'s fields (less ``vendors``) overlaid with ``table``'s, each key type-checked."""
    fields: dict[str, object] = dict(base or {})
    fields.pop("vendors", None)  # never inherited: a variant is picked explicitly
    for key, value in table.items():
        if key in _STR_KEYS:
            if not isinstance(value, str):
                raise ToolchainError(where, key, f"must be a string, got {type(value).__name__}")
        elif key in _LIST_KEYS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ToolchainError(where, key, "must be an array of strings")
        elif key in _TABLE_KEYS:
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ToolchainError(where, key, 'must be a table of strings (NAME = "value")')
        else:
            known = ", ".join(sorted((*_STR_KEYS, *_LIST_KEYS, *_TABLE_KEYS)))
            raise ToolchainError(where, key, f"unknown key (known keys: {known})")
        fields[key] = value
    return fields


def checked_name(fields: Mapping[str, object], where: str) -> str:
    """The toolchain's name, once ``name``, ``program`` and ``argv`` are known to be set."""
    for key in ("name", "program", "argv"):
        if not fields.get(key):
            raise ToolchainError(where, key, "is required (or `extends` a toolchain that has it)")
    name = text_field(fields, "name")
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ToolchainError(where, "name", f"{name!r} must be letters, digits, '-', '_', '.'")
    return name


def checked_output_flag(
    table: Mapping[str, object], fields: Mapping[str, object], output: str, where: str
) -> str:
    """The flag selecting ``output``: the table's; else, when the table changes the output
    kind (or nothing is inherited), the kind's own; else the inherited one."""
    if "output_flag" in table:
        return str(table["output_flag"])
    if "output" in table or "output_flag" not in fields:
        if output not in OUTPUT_KINDS:
            kinds = ", ".join(OUTPUT_KINDS)
            raise ToolchainError(
                where,
                "output",
                f"unknown output kind {output!r} (known: {kinds}); or set output_flag",
            )
        return OUTPUT_KINDS[output][0]
    return str(fields["output_flag"])


def checked_extension(
    table: Mapping[str, object], fields: Mapping[str, object], output: str, where: str
) -> str:
    """The artefact's extension: the table's; else, when the table changes the output kind
    (or nothing is inherited), the kind's own (an unknown kind's name); else the inherited
    one."""
    if "extension" in table:
        extension = str(table["extension"])
    elif "output" in table or "extension" not in fields:
        extension = OUTPUT_KINDS.get(output, ("", output))[1]
    else:
        extension = str(fields["extension"])
    if not extension or "/" in extension or extension.startswith("."):
        raise ToolchainError(where, "extension", f"{extension!r} is not a file extension")
    return extension


def checked_steps(
    fields: Mapping[str, object],
    argv: tuple[str, ...],
    link: tuple[str, ...],
    extension: str,
    where: str,
) -> str:
    """The intermediate extension ("" for a one-step toolchain), once the templates of
    the compile (and link) step hold the placeholders they need."""
    if not link:
        _check_template(argv, where, "argv", ("{source}", "{output}"))
        return ""
    _check_template(argv, where, "argv", ("{source}", "{intermediate}"))
    _check_template(link, where, "link_argv", ("{intermediate}", "{output}"))
    intermediate = str(fields.get("intermediate_extension", ""))
    if not intermediate or "/" in intermediate or intermediate.startswith("."):
        raise ToolchainError(
            where,
            "intermediate_extension",
            f"{intermediate!r} is not a file extension (a two-step toolchain needs one)",
        )
    if intermediate == extension:
        raise ToolchainError(
            where, "intermediate_extension", f"must differ from the artefact's {extension!r}"
        )
    return intermediate


def checked_dialect(fields: Mapping[str, object], where: str) -> str:
    """``dialect``, one of :data:`DIALECTS`."""
    dialect = text_field(fields, "dialect")
    if dialect not in DIALECTS:
        known = ", ".join(repr(d) for d in DIALECTS)
        raise ToolchainError(where, "dialect", f"unknown dialect {dialect!r} (known: {known})")
    return dialect


def checked_env_set(fields: Mapping[str, object], where: str) -> tuple[tuple[str, str], ...]:
    """``env_set`` as (name, value) pairs sorted by name; each name a variable name."""
    table = fields.get("env_set")
    if not isinstance(table, Mapping):
        return ()
    for name in table:
        if not _ENV_NAME_RE.fullmatch(str(name)):
            raise ToolchainError(where, f"env_set.{name}", "is not an environment variable name")
    return tuple(sorted((str(k), str(v)) for k, v in table.items()))


def checked_arch_check(fields: Mapping[str, object], where: str) -> tuple[str, ...]:
    """``arch_check_args``: a compile of ``{source}`` into ``{output}`` for ``{arch}``."""
    args = word_list(fields, "arch_check_args")
    for i, token in enumerate(args):
        if token in LIST_PLACEHOLDERS:
            raise ToolchainError(where, f"arch_check_args[{i}]", f"{token} has no value here")
    if args:
        _check_template(args, where, "arch_check_args", ("{arch}", "{source}", "{output}"))
    return args


def text_field(fields: Mapping[str, object], key: str, default: str = "") -> str:
    """A validated string field (``default`` when absent)."""
    value = fields.get(key, default)
    return value if isinstance(value, str) else default


def word_list(
    fields: Mapping[str, object], key: str, default: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A validated array-of-strings field as a tuple (``default`` when absent)."""
    value = fields.get(key)
    if not isinstance(value, list | tuple):
        return default
    return tuple(str(v) for v in value)


def _check_template(argv: tuple[str, ...], where: str, key: str, needed: tuple[str, ...]) -> None:
    for i, token in enumerate(argv):
        if token in LIST_PLACEHOLDERS:
            continue
        for inner in LIST_PLACEHOLDERS:
            if inner in token:
                raise ToolchainError(where, f"{key}[{i}]", f"{inner} must be a token of its own")
        try:
            token.format_map({p: "" for p in _PLACEHOLDERS})
        except (KeyError, ValueError, IndexError) as exc:
            known = ", ".join("{" + p + "}" for p in _PLACEHOLDERS)
            raise ToolchainError(
                where, f"{key}[{i}]", f"bad placeholder in {token!r} ({exc}); known: {known}"
            ) from None
    for placeholder in needed:
        if not any(placeholder in t for t in argv):
            raise ToolchainError(where, key, f"the template must contain {placeholder}")


def check_program(fields: Mapping[str, object], where: str) -> None:
    """``program``: a name, a path, or a path under ``{root}`` with ``{arch}`` (then the
    toolchain needs ``root_env`` or ``root_globs``)."""
    program = str(fields["program"])
    try:
        program.format_map({p: "" for p in _PROGRAM_PLACEHOLDERS})
    except (KeyError, ValueError, IndexError) as exc:
        raise ToolchainError(
            where, "program", f"bad placeholder in {program!r} ({exc}); known: {{root}}, {{arch}}"
        ) from None
    if "{root}" in program:
        if not program.startswith("{root}/"):
            raise ToolchainError(where, "program", f"{program!r} must start with {{root}}/")
        if not (fields.get("root_env") or fields.get("root_globs")):
            raise ToolchainError(
                where, "program", "a program under {root} needs root_env or root_globs"
            )
    elif "{arch}" in program:
        raise ToolchainError(where, "program", "{arch} is only known under a {root}")
