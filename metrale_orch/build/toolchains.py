"""Toolchains: which compiler builds a hardware tree, how to find it, how to call it.

A toolchain is one ``[toolchain]`` table in a TOML file. The package ships
working definitions, one per compiler the reference build drives (SPEC 3.3):
``nvcc`` for NVIDIA, ``scale`` (SCALE's per-arch nvcc) for ``amd``/``rocm``/
``scale``, ``hip`` (hipcc) for ``hip`` and ``metal`` (xcrun, two steps) for
Apple, as package data; a project may add or replace toolchains with
``<root>/toolchains/*.toml`` (a file whose ``name`` equals a built-in replaces
it; ``extends = "<name>"`` starts from another toolchain's fields). A hardware
picks its toolchain by vendor, or by ``[build] toolchain = "<name>"`` in its
HARDWARE.toml.

Pure: :func:`parse_toolchain`, :func:`select_toolchain`, :func:`compile_argv`,
:func:`link_argv`, :func:`hip_flags`, :func:`env_switches`, :func:`program_name`.
I/O: :func:`load_toolchains` (reads the files), :func:`find_program` (finds the
compiler, a toolkit root for per-arch compilers), :func:`probe_toolchain` (runs
the compiler's version and dry-run probes once per process and hashes the real
binaries they name; see its docstring).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import re
import shlex
import shutil
import stat
import sysconfig
import tempfile
import threading
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import xxhash

from metrale_orch.errors import MetraleError
from metrale_orch.fsutil import file_hash, write_atomic
from metrale_orch.proc import ProcessError, run_process

if TYPE_CHECKING:  # only for annotations: the build's no-op path skips importing the resolver
    from metrale_orch.tree import Hardware

__all__ = [
    "DIALECTS",
    "OUTPUT_KINDS",
    "BuildError",
    "FoundToolchain",
    "Probe",
    "Switches",
    "Toolchain",
    "ToolchainError",
    "ToolchainMissing",
    "builtin_toolchains",
    "compile_argv",
    "dryrun_argv",
    "env_switches",
    "find_program",
    "find_root",
    "find_toolchain",
    "hip_flags",
    "keyed_environment",
    "link_argv",
    "load_toolchains",
    "locate_toolchain",
    "parse_toolchain",
    "probe_identity",
    "probe_toolchain",
    "program_name",
    "reset_identity_memo",
    "select_toolchain",
    "toolchain_stamp",
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
#: "hip" (the warp-mask mirror of :mod:`metrale_orch.build.hip_mirror`, ``--fmad``
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
_LIST_PLACEHOLDERS = (
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
)

#: Seconds a version probe may take.
PROBE_TIMEOUT = 60.0


class BuildError(MetraleError):
    """Base of every error of the build steps (toolchains, staging, compiling)."""

    exit_code = 1


class ToolchainError(BuildError):
    """A toolchain definition or selection is wrong; names the file and the key."""

    exit_code = 2

    def __init__(self, where: str, key: str, problem: str) -> None:
        self.where = where
        self.key = key
        self.problem = problem
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


class ToolchainMissing(BuildError):
    """The selected toolchain's program is not installed; says what to install."""

    exit_code = 1

    def __init__(self, toolchain: str, program: str, hint: str, *, detail: str = "") -> None:
        self.toolchain = toolchain
        self.program = program
        self.hint = hint
        self.detail = detail
        what = detail or f"`{program}` was not found"
        super().__init__(f"toolchain {toolchain!r} is not installed: {what}; install {hint}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Toolchain:
    """One compiler definition (a ``[toolchain]`` table)."""

    name: str
    program: str
    vendors: tuple[str, ...] = ()
    version_args: tuple[str, ...] = ("--version",)
    #: Host compiler the program calls (its version is part of the identity), "" for none.
    host_compiler: str = ""
    #: Environment variable naming another host compiler (e.g. NVCC_CCBIN).
    host_compiler_env: str = ""
    host_compiler_version_args: tuple[str, ...] = ("--version",)
    #: Output kind: ptx | cubin | fatbin (NVIDIA), air (Metal), hsaco (HIP), ...
    output: str = "ptx"
    output_flag: str = "--ptx"
    extension: str = "ptx"
    #: Argument template; see ``_PLACEHOLDERS``.
    argv: tuple[str, ...]
    #: A second step turning ``argv``'s ``{intermediate}`` into ``{output}`` (Metal's
    #: ``metallib``); empty for one step.
    link_argv: tuple[str, ...] = ()
    #: Extension of the intermediate file of a two-step toolchain (``air``).
    intermediate_extension: str = ""
    #: What ``{strict_flags}`` expands to (``--Werror all-warnings``) unless
    #: ``$<no_strict_env>`` is ``1``.
    strict_args: tuple[str, ...] = ()
    no_strict_env: str = ""
    #: Variable whose shell-split words ``{env_flags}`` expands to.
    extra_flags_env: str = ""
    #: See :data:`DIALECTS`.
    dialect: str = ""
    #: ``[build]`` key holding extra flags in HARDWARE.toml / KERNEL.toml.
    flags_key: str = "extra_nvcc_flags"
    #: Environment variables that change the compiler's output (part of every key).
    env_allowlist: tuple[str, ...] = ()
    #: Prefixes of further such variables (e.g. ``NVCC_``: every ``NVCC_*`` is keyed).
    env_prefixes: tuple[str, ...] = ()
    #: Arguments of the dry-run probe (``{output_kind_flag}``, ``{source}``, ``{output}``);
    #: empty when the compiler has none (then its own content and version are keyed).
    dryrun_args: tuple[str, ...] = ()
    #: Arguments that make the host compiler print what it would run (``gcc -###``).
    host_compiler_probe_args: tuple[str, ...] = ()
    #: Arguments that make the host compiler list its own include directories
    #: (``gcc -E -Wp,-v``): files read below them are system headers.
    host_compiler_search_args: tuple[str, ...] = ()
    #: Arguments that make a compile also write its dependency list to ``{depfile}``
    #: (every file it read); empty when the compiler cannot.
    depfile_args: tuple[str, ...] = ()
    #: Variables naming the program itself, checked first (a set one must be usable).
    program_env: tuple[str, ...] = ()
    #: Absolute paths of the program checked next, before PATH.
    program_paths: tuple[str, ...] = ()
    #: For a ``program`` under ``{root}``: variables naming the root (a set one must be
    #: a root), then globs (``~`` = ``$HOME``) searched newest version first, and the
    #: paths a root holds (a trailing ``/``: a directory).
    root_env: tuple[str, ...] = ()
    root_globs: tuple[str, ...] = ()
    root_markers: tuple[str, ...] = ()
    #: Variables naming install prefixes searched as ``$VAR/bin`` after PATH.
    home_env: tuple[str, ...] = ()
    #: Directories under site-packages searched last (pip-installed compilers).
    pip_dirs: tuple[str, ...] = ()
    install_hint: str = ""
    #: The project file that defined it; None for a built-in.
    file: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (``file`` as given; callers relativise it)."""
        return {
            "name": self.name,
            "program": self.program,
            "vendors": list(self.vendors),
            "version_args": list(self.version_args),
            "host_compiler": self.host_compiler,
            "host_compiler_env": self.host_compiler_env,
            "host_compiler_version_args": list(self.host_compiler_version_args),
            "output": self.output,
            "output_flag": self.output_flag,
            "extension": self.extension,
            "argv": list(self.argv),
            "link_argv": list(self.link_argv),
            "intermediate_extension": self.intermediate_extension,
            "strict_args": list(self.strict_args),
            "no_strict_env": self.no_strict_env,
            "extra_flags_env": self.extra_flags_env,
            "dialect": self.dialect,
            "flags_key": self.flags_key,
            "env_allowlist": list(self.env_allowlist),
            "env_prefixes": list(self.env_prefixes),
            "dryrun_args": list(self.dryrun_args),
            "host_compiler_probe_args": list(self.host_compiler_probe_args),
            "host_compiler_search_args": list(self.host_compiler_search_args),
            "depfile_args": list(self.depfile_args),
            "program_env": list(self.program_env),
            "program_paths": list(self.program_paths),
            "root_env": list(self.root_env),
            "root_globs": list(self.root_globs),
            "root_markers": list(self.root_markers),
            "home_env": list(self.home_env),
            "pip_dirs": list(self.pip_dirs),
            "install_hint": self.install_hint,
            "file": None if self.file is None else self.file.as_posix(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundToolchain:
    """A toolchain whose program was found and probed."""

    toolchain: Toolchain
    program: Path
    identity: str
    #: Toolkit directories (see :class:`Probe`).
    roots: tuple[str, ...] = ()
    #: The host compiler's system include directories (see :class:`Probe`).
    system_dirs: tuple[str, ...] = ()


# ---------------------------------------------------------------- parsing (pure)


def parse_toolchain(
    table: Mapping[str, Any],
    where: str,
    *,
    base: Mapping[str, Any] | None = None,
    file: Path | None = None,
) -> Toolchain:
    """Validate one ``[toolchain]`` table (over ``base``'s fields) into a Toolchain.

    Raises :class:`ToolchainError` naming ``where`` and the key for an unknown
    key, a wrong type, an unknown output kind or a bad template.
    """
    fields: dict[str, Any] = dict(base or {})
    fields.pop("vendors", None)  # never inherited: a variant is picked explicitly
    for key, value in table.items():
        if key in _STR_KEYS:
            if not isinstance(value, str):
                raise ToolchainError(where, key, f"must be a string, got {type(value).__name__}")
        elif key in _LIST_KEYS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ToolchainError(where, key, "must be an array of strings")
        else:
            known = ", ".join(sorted((*_STR_KEYS, *_LIST_KEYS)))
            raise ToolchainError(where, key, f"unknown key (known keys: {known})")
        fields[key] = value
    for key in ("name", "program", "argv"):
        if not fields.get(key):
            raise ToolchainError(where, key, "is required (or `extends` a toolchain that has it)")
    name = fields["name"]
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ToolchainError(where, "name", f"{name!r} must be letters, digits, '-', '_', '.'")
    output = fields.get("output", "ptx")
    default_flag, default_ext = OUTPUT_KINDS.get(output, ("", output))
    # A changed output kind brings its own flag and extension unless given here.
    if "output_flag" in table:
        output_flag = str(table["output_flag"])
    elif "output" in table or "output_flag" not in fields:
        if output not in OUTPUT_KINDS:
            kinds = ", ".join(OUTPUT_KINDS)
            raise ToolchainError(
                where,
                "output",
                f"unknown output kind {output!r} (known: {kinds}); or set output_flag",
            )
        output_flag = default_flag
    else:
        output_flag = str(fields["output_flag"])
    if "extension" in table:
        extension = str(table["extension"])
    elif "output" in table or "extension" not in fields:
        extension = default_ext
    else:
        extension = str(fields["extension"])
    if not extension or "/" in extension or extension.startswith("."):
        raise ToolchainError(where, "extension", f"{extension!r} is not a file extension")
    argv = tuple(fields["argv"])
    link = tuple(fields.get("link_argv", ()))
    if link:
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
    else:
        _check_template(argv, where, "argv", ("{source}", "{output}"))
        intermediate = ""
    dialect = fields.get("dialect", "")
    if dialect not in DIALECTS:
        known = ", ".join(repr(d) for d in DIALECTS)
        raise ToolchainError(where, "dialect", f"unknown dialect {dialect!r} (known: {known})")
    _check_program(fields, where)
    return Toolchain(
        name=name,
        program=fields["program"],
        vendors=tuple(fields.get("vendors", ())),
        version_args=tuple(fields.get("version_args", ("--version",))),
        host_compiler=fields.get("host_compiler", ""),
        host_compiler_env=fields.get("host_compiler_env", ""),
        host_compiler_version_args=tuple(fields.get("host_compiler_version_args", ("--version",))),
        output=output,
        output_flag=output_flag,
        extension=extension,
        argv=argv,
        link_argv=link,
        intermediate_extension=intermediate,
        strict_args=tuple(fields.get("strict_args", ())),
        no_strict_env=fields.get("no_strict_env", ""),
        extra_flags_env=fields.get("extra_flags_env", ""),
        dialect=dialect,
        flags_key=fields.get("flags_key", "extra_nvcc_flags"),
        env_allowlist=tuple(sorted(set(fields.get("env_allowlist", ())))),
        env_prefixes=tuple(sorted(set(fields.get("env_prefixes", ())))),
        dryrun_args=tuple(fields.get("dryrun_args", ())),
        host_compiler_probe_args=tuple(fields.get("host_compiler_probe_args", ())),
        host_compiler_search_args=tuple(fields.get("host_compiler_search_args", ())),
        depfile_args=tuple(fields.get("depfile_args", ())),
        program_env=tuple(fields.get("program_env", ())),
        program_paths=tuple(fields.get("program_paths", ())),
        root_env=tuple(fields.get("root_env", ())),
        root_globs=tuple(fields.get("root_globs", ())),
        root_markers=tuple(fields.get("root_markers", ())),
        home_env=tuple(fields.get("home_env", ())),
        pip_dirs=tuple(fields.get("pip_dirs", ())),
        install_hint=fields.get("install_hint", "") or f"`{fields['program']}`",
        file=file,
    )


def _check_template(argv: tuple[str, ...], where: str, key: str, needed: tuple[str, ...]) -> None:
    for i, token in enumerate(argv):
        if token in _LIST_PLACEHOLDERS:
            continue
        for inner in _LIST_PLACEHOLDERS:
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


def _check_program(fields: Mapping[str, Any], where: str) -> None:
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


def _table_of(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    table = doc.get("toolchain")
    if not isinstance(table, dict):
        raise ToolchainError(where, "[toolchain]", "the file must hold a [toolchain] table")
    extra = sorted(k for k in doc if k != "toolchain")
    if extra:
        raise ToolchainError(where, extra[0], "unknown table (only [toolchain] is read)")
    return table


def _read_toml(path: Path, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolchainError(where, "", f"cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ToolchainError(where, "", f"is not valid TOML: {exc}") from None


def _builtin_tables() -> dict[str, dict[str, Any]]:
    """Fresh (shallow) copies of the package's toolchain tables, parsed once per process."""
    return {name: dict(table) for name, table in _read_builtin_tables().items()}


@functools.cache
def _read_builtin_tables() -> Mapping[str, Mapping[str, Any]]:
    tables: dict[str, dict[str, Any]] = {}
    folder = resources.files("metrale_orch").joinpath("builtin_toolchains")
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        if not item.name.endswith(".toml"):
            continue
        where = f"metrale_orch/builtin_toolchains/{item.name}"
        table = _table_of(tomllib.loads(item.read_text(encoding="utf-8")), where)
        tables[str(table["name"])] = table
    return MappingProxyType(tables)


def builtin_toolchains() -> Mapping[str, Toolchain]:
    """The toolchains shipped with the package (nvcc, metal, hip), by name."""
    return MappingProxyType(
        {
            name: parse_toolchain(t, f"metrale_orch/builtin_toolchains/{name}.toml")
            for name, t in sorted(_builtin_tables().items())
        }
    )


def load_toolchains(root: Path) -> Mapping[str, Toolchain]:
    """Built-in toolchains overlaid by ``<root>/toolchains/*.toml``, by name (sorted).

    Raises :class:`ToolchainError` naming the file and key of a bad definition,
    a duplicate name, or an ``extends`` of an unknown toolchain or in a cycle.
    """
    builtins = _builtin_tables()
    project: dict[str, tuple[dict[str, Any], Path, str]] = {}
    folder = Path(root) / "toolchains"
    files = sorted(folder.glob("*.toml")) if folder.is_dir() else []
    for path in files:
        where = f"toolchains/{path.name}"
        table = _table_of(_read_toml(path, where), where)
        name = table.get("name", table.get("extends"))
        if not isinstance(name, str) or not name:
            raise ToolchainError(where, "name", "is required")
        if name in project:
            other = project[name][2]
            raise ToolchainError(where, "name", f"toolchain {name!r} is also defined in {other}")
        project[name] = (table, path, where)

    resolved: dict[str, Toolchain] = {}
    fields_of: dict[str, dict[str, Any]] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, Any]:
        if name in fields_of:
            return fields_of[name]
        table, path, where = project[name]
        base: dict[str, Any] = {}
        extends = table.get("extends")
        if extends is not None:
            if not isinstance(extends, str):
                raise ToolchainError(where, "extends", "must be a string")
            if extends == name:
                if extends not in builtins:
                    raise ToolchainError(where, "extends", f"no built-in toolchain {extends!r}")
                base = dict(builtins[extends])
            elif extends in chain:
                cycle = " -> ".join((*chain, extends))
                raise ToolchainError(where, "extends", f"cycle: {cycle}")
            elif extends in project:
                base = dict(resolve(extends, (*chain, extends)))
            elif extends in builtins:
                base = dict(builtins[extends])
            else:
                known = ", ".join(sorted({*builtins, *project}))
                raise ToolchainError(where, "extends", f"unknown toolchain {extends!r} ({known})")
        own = {k: v for k, v in table.items() if k != "extends"}
        own.setdefault("name", name)
        tc = parse_toolchain(own, where, base=base, file=path)
        resolved[name] = tc
        merged = {**{k: v for k, v in base.items() if k != "vendors"}, **own}
        fields_of[name] = merged
        return merged

    for name in sorted(project):
        resolve(name, (name,))
    result: dict[str, Toolchain] = {}
    for name, table in builtins.items():
        result[name] = parse_toolchain(table, f"metrale_orch/builtin_toolchains/{name}.toml")
    result.update(resolved)
    return MappingProxyType(dict(sorted(result.items())))


def select_toolchain(hardware: Hardware, toolchains: Mapping[str, Toolchain]) -> Toolchain:
    """The toolchain of ``hardware`` (a ``layout.Hardware``).

    ``[build] toolchain = "<name>"`` of its HARDWARE.toml wins; otherwise the
    toolchain whose ``vendors`` lists the hardware's vendor (a project file's
    claim beats a built-in's). Raises :class:`ToolchainError` for an unknown
    name, no toolchain for the vendor, or two project toolchains claiming it.
    """
    where = f"kernels/{hardware.name}/HARDWARE.toml"
    build = hardware.doc.get("build")
    if isinstance(build, dict) and "toolchain" in build:
        name = build["toolchain"]
        if not isinstance(name, str):
            raise ToolchainError(where, "[build] toolchain", "must be a string")
        if name not in toolchains:
            known = ", ".join(sorted(toolchains))
            raise ToolchainError(
                where,
                "[build] toolchain",
                f"no toolchain named {name!r} (known: {known}); add toolchains/{name}.toml",
            )
        return toolchains[name]
    vendor = hardware.vendor
    claims = [tc for tc in toolchains.values() if vendor in tc.vendors]
    project = [tc for tc in claims if tc.file is not None]
    chosen = project or claims
    if not chosen:
        raise ToolchainError(
            where,
            "[hardware] vendor",
            f"no toolchain builds vendor {vendor!r}; add a toolchains/<name>.toml with "
            f'vendors = ["{vendor}"], or set [build] toolchain',
        )
    if len(chosen) > 1:
        names = ", ".join(f"{tc.name} ({tc.file})" for tc in chosen)
        raise ToolchainError(
            where,
            "[hardware] vendor",
            f"several toolchains claim vendor {vendor!r}: {names}; set [build] toolchain",
        )
    return chosen[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Switches:
    """What the environment switches of a toolchain ask for (:func:`env_switches`)."""

    #: Whether ``{strict_flags}`` expands (``$METRALE_KERNEL_NO_STRICT`` is not ``1``).
    strict: bool = True
    #: The words of ``$METRALE_EXTRA_NVCC_FLAGS`` (``{env_flags}``).
    extra: tuple[str, ...] = ()
    #: The switches in effect, by variable (key and signature material): the strict one
    #: when it drops the flags, the words of the flags one (``shlex.join``) when any.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


_NO_SWITCHES = Switches()


def env_switches(toolchain: Toolchain, environ: Mapping[str, str]) -> Switches:
    """The toolchain's environment switches in ``environ`` (pure).

    ``$<no_strict_env>`` = ``1`` drops ``{strict_flags}``; ``0``, empty or unset keeps
    them. ``$<extra_flags_env>`` is split like a shell would into ``{env_flags}``.
    Raises :class:`ToolchainError` naming the variable for any other value of the
    first, or words the second cannot be split into.
    """
    names = [n for n in (toolchain.no_strict_env, toolchain.extra_flags_env) if n]
    if not any(n in environ for n in names):
        return _NO_SWITCHES
    strict = True
    extra: tuple[str, ...] = ()
    var = toolchain.no_strict_env
    if var and var in environ:
        value = environ[var].strip()
        if value == "1":
            strict = False
        elif value not in ("", "0"):
            dropped = " ".join(toolchain.strict_args) or "the strict flags"
            raise ToolchainError(
                f"environment {var}",
                "",
                f"must be 1 (drop {dropped}) or 0, got {environ[var]!r}",
            )
    var = toolchain.extra_flags_env
    if var and var in environ:
        try:
            extra = tuple(shlex.split(environ[var]))
        except ValueError as exc:
            raise ToolchainError(
                f"environment {var}", "", f"cannot be split into flags ({exc}): {environ[var]!r}"
            ) from None
    # Only what changes the compile is keyed: "0" or "" is the same build as unset.
    env: dict[str, str] = {}
    if not strict:
        env[toolchain.no_strict_env] = "1"
    if extra:
        env[toolchain.extra_flags_env] = shlex.join(extra)
    return Switches(strict=strict, extra=extra, env=MappingProxyType(dict(sorted(env.items()))))


#: ``--fmad`` (nvcc: fused multiply-add contraction) spelled for clang (hipcc).
_FMAD = {"false": "-ffp-contract=off", "true": "-ffp-contract=fast"}


def hip_flags(flags: Sequence[str]) -> tuple[str, ...]:
    """The flags hipcc gets for nvcc-dialect ``flags`` (pure): ``--fmad=false`` becomes
    ``-ffp-contract=off``, ``--fmad=true`` ``-ffp-contract=fast``, any other ``--fmad=…``
    (``-fmad=…`` too) is dropped; everything else is kept in order."""
    out: list[str] = []
    for flag in flags:
        for prefix in ("--fmad=", "-fmad="):
            if flag.startswith(prefix):
                value = _FMAD.get(flag[len(prefix) :])
                if value is not None:
                    out.append(value)
                break
        else:
            out.append(flag)
    return tuple(out)


def program_name(toolchain: Toolchain, arch: str) -> str:
    """The program as keys and manifests spell it (pure): the template with ``{arch}``
    filled in and ``{root}`` kept, so it names no machine's directory."""
    return toolchain.program.replace("{arch}", arch)


def compile_argv(
    toolchain: Toolchain,
    *,
    program: str | None = None,
    arch: str,
    flags: Sequence[str],
    include: str,
    source: str,
    output: str,
    intermediate: str = "",
    switches: Switches = _NO_SWITCHES,
    compat_include: str = "",
) -> tuple[str, ...]:
    """The compiler's argv from the toolchain's template (pure).

    ``program`` defaults to :func:`program_name` (the machine-independent form
    used in keys and manifests). ``flags`` are the merged ``[build]`` flags (the
    ``hip`` dialect translates them with :func:`hip_flags`); ``switches`` fill
    ``{strict_flags}`` and ``{env_flags}``; ``compat_include`` is the HIP compat
    directory (``{compat_include}`` = ``-I<it>``, nothing when ""); ``intermediate``
    is where the first step of a two-step toolchain writes.
    """
    virtual = "compute_" + arch.removeprefix("sm_") if arch.startswith("sm_") else arch
    if toolchain.output == "fatbin":
        arch_flags: tuple[str, ...] = (f"-gencode=arch={virtual},code={arch}",)
    else:
        arch_flags = (f"-arch={arch}",)
    lists: dict[str, Sequence[str]] = {
        "{flags}": hip_flags(flags) if toolchain.dialect == "hip" else flags,
        "{arch_flags}": arch_flags,
        "{strict_flags}": toolchain.strict_args if switches.strict else (),
        "{env_flags}": switches.extra,
        "{compat_include}": (f"-I{compat_include}",) if compat_include else (),
    }
    values = {
        "program": program or program_name(toolchain, arch),
        "output_kind_flag": toolchain.output_flag,
        "arch": arch,
        "virtual_arch": virtual,
        "include": include,
        "source": source,
        "intermediate": intermediate,
        "output": output,
    }
    return _render(toolchain.argv, values, lists)


def link_argv(
    toolchain: Toolchain,
    *,
    program: str | None = None,
    arch: str,
    intermediate: str,
    output: str,
) -> tuple[str, ...]:
    """The second step of a two-step toolchain (pure; ``()`` for one step): turns
    ``intermediate`` (the first step's output) into ``output``."""
    if not toolchain.link_argv:
        return ()
    values = {
        "program": program or program_name(toolchain, arch),
        "output_kind_flag": toolchain.output_flag,
        "arch": arch,
        "virtual_arch": arch,
        "include": "",
        "source": "",
        "intermediate": intermediate,
        "output": output,
    }
    return _render(toolchain.link_argv, values, {})


def _render(
    template: Sequence[str], values: Mapping[str, str], lists: Mapping[str, Sequence[str]]
) -> tuple[str, ...]:
    out: list[str] = []
    for token in template:
        if token in _LIST_PLACEHOLDERS:
            out.extend(lists.get(token, ()))
        else:
            rendered = token.format_map(values)
            if rendered:
                out.append(rendered)
    return tuple(out)


# ---------------------------------------------------------------- discovery (I/O)


def _site_dirs() -> list[Path]:
    seen: list[Path] = []
    for key in ("purelib", "platlib"):
        p = Path(sysconfig.get_paths()[key])
        if p not in seen:
            seen.append(p)
    return seen


def _executable(path: Path) -> bool:
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
        if _executable(cand):
            return cand, ""
        rel = program.format(root="", arch=arch).lstrip("/")
        return None, f"{toolchain.name} at {root} has no compiler for {arch} ({rel})"
    for var in toolchain.program_env:
        value = environ.get(var)
        if value:
            cand = Path(os.path.expanduser(value))
            if not _executable(cand):
                raise ToolchainError(
                    f"environment {var}",
                    "",
                    f"{value!r} is not an executable {toolchain.program}; "
                    f"point it at one, or unset it",
                )
            return cand, ""
    for path in toolchain.program_paths:
        cand = Path(os.path.expanduser(path))
        if _executable(cand):
            return cand, ""
    if os.sep in program:
        p = Path(program)
        return (p if _executable(p) else None), ""
    found = shutil.which(program, path=environ.get("PATH", os.defpath))
    if found:
        return Path(found), ""
    for var in toolchain.home_env:
        home = environ.get(var)
        if home:
            cand = Path(home) / "bin" / program
            if _executable(cand):
                return cand, ""
    for site in _site_dirs() if site_dirs is None else site_dirs:
        for rel in toolchain.pip_dirs:
            cand = Path(site) / rel / program
            if _executable(cand):
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


_IDENTITY_MEMO: dict[str, Probe] = {}
_IDENTITY_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """What probing a compiler found: its identity and the toolkit directories it reads."""

    #: Human-readable version text plus a digest of everything that decides the output.
    identity: str
    #: Normalised absolute toolkit directories (the dry run's ``TOP`` and include
    #: directories): files the compiler reads below them are recorded relative to them.
    roots: tuple[str, ...] = ()
    #: The host compiler's own include directories (without the user's ``CPATH`` and
    #: friends): files read below them are system headers.
    system_dirs: tuple[str, ...] = ()


def reset_identity_memo() -> None:
    """Forget the identities probed by this process (tests)."""
    with _IDENTITY_LOCK:
        _IDENTITY_MEMO.clear()


def _host_compiler(toolchain: Toolchain, environ: Mapping[str, str]) -> Path | None:
    name = (environ.get(toolchain.host_compiler_env) if toolchain.host_compiler_env else None) or (
        toolchain.host_compiler
    )
    if not name:
        return None
    if os.sep in name:
        path = Path(name)
        if path.is_dir():  # nvcc's -ccbin / NVCC_CCBIN may name the compiler's directory
            path = path / (toolchain.host_compiler or "gcc")
        return path if _executable(path) else None
    found = shutil.which(name, path=environ.get("PATH", os.defpath))
    return Path(found) if found else None


def _version_text(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines()]
    kept = [ln for ln in lines if ln and "copyright" not in ln.lower()]
    return "; ".join(kept)


def keyed_environment(toolchain: Toolchain, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` the toolchain's compilers read (pure; sorted):
    its ``env_allowlist`` names and every name starting with one of its ``env_prefixes``."""
    prefixes = toolchain.env_prefixes
    return {
        name: _printable(environ[name])
        for name in sorted(environ)
        if name in toolchain.env_allowlist or (prefixes and name.startswith(prefixes))
    }


def _printable(value: str) -> str:
    """``value`` with undecodable bytes (``os.environ``'s surrogate escapes) spelled as
    ``\\xNN``: distinct bytes stay distinct and the value can be encoded into a key."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def probe_identity(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    arch: str = "",
) -> str:
    """The compiler's identity (see :func:`probe_toolchain`)."""
    return probe_toolchain(toolchain, program, environ, state_dir=state_dir, arch=arch).identity


def probe_toolchain(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    arch: str = "",
) -> Probe:
    """Probe what really runs when ``program`` is called, once per process.

    A wrapper script, a shim reading a version file or an environment variable,
    or an ``update-alternatives`` link can switch the real compiler without any
    change a ``stat`` of ``program`` would see, so nothing here is remembered
    across processes except the content hashes of the real binaries (by their
    ``stat``, in ``<state_dir>/file-hashes.json``). The identity covers:

    - the version output (``version_args``);
    - the dry run (``dryrun_args``, e.g. ``nvcc --dryrun``, or a clang driver's
      ``-###`` for SCALE, hipcc and metal; ``{arch}`` tokens are dropped when no
      ``arch`` is given): every command and flag the compiler would run, a
      wrapper's additions included, with temporary names and the probe directory
      normalised;
    - the content of the programs it names (the real ``nvcc``, ``cicc``,
      ``ptxas``, libdevice ...) and of ``program`` itself;
    - the host compiler: its version output, its own dry run
      (``host_compiler_probe_args``, e.g. ``gcc -###``, which shows the defines a
      wrapper adds and the real ``cc1plus``) and the content of both;
    - the environment variables the compilers read (:func:`keyed_environment`).

    Raises :class:`ToolchainMissing` when the host compiler is absent and
    :class:`ToolchainError` when a probe fails.
    """
    host = None
    if toolchain.host_compiler or toolchain.host_compiler_env:
        host = _host_compiler(toolchain, environ)
        if host is None:
            name = (
                environ.get(toolchain.host_compiler_env, "") if toolchain.host_compiler_env else ""
            ) or toolchain.host_compiler
            raise ToolchainMissing(
                toolchain.name,
                toolchain.program,
                f"a host C++ compiler ({name}) on PATH",
                detail=f"its host compiler `{name}` was not found",
            )
    env = keyed_environment(toolchain, environ)
    # Only a probe that names the arch differs per arch (nvcc's does not: one probe).
    if not any("{arch}" in a for a in (toolchain.program, *toolchain.dryrun_args)):
        arch = ""
    memo_key = json.dumps(
        [
            toolchain.to_dict(),
            str(program),
            None if host is None else str(host),
            env,
            environ.get("PATH", ""),
            arch,
        ],
        sort_keys=True,
    )
    with _IDENTITY_LOCK:
        got = _IDENTITY_MEMO.get(memo_key)
    if got is not None:
        return got
    hashes = _FileHashes(None if state_dir is None else Path(state_dir) / _FILE_HASHES)
    try:
        probe = _run_probe(toolchain, program, host, environ, env, hashes, arch)
    finally:
        hashes.save()
    with _IDENTITY_LOCK:
        _IDENTITY_MEMO[memo_key] = probe
    return probe


_FILE_HASHES = "file-hashes.json"
_FILE_HASHES_MAX = 256
_TMP_NAME_RE = re.compile(r"tmpxft_[0-9a-fA-F]+_[0-9a-fA-F]+")
#: A clang driver's temporary file (``<stem>-<6 random hex digits>.<ext>``, LLVM's
#: ``createTemporaryFile``) in the temporary directory the probe gives it.
_CLANG_TMP_RE = re.compile(r"(<tmp>/[^\s\"']*?)-[0-9a-f]{6}(\.[A-Za-z0-9_]+)")
#: Options of a clang command line (``-###``) naming an include or resource directory.
_CLANG_DIR_OPTIONS = frozenset(
    {"-internal-isystem", "-internal-externc-isystem", "-isystem", "-resource-dir", "-I"}
)
_DRYRUN_VAR_RE = re.compile(r"^#\$ (?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
#: Dry-run variables that only echo the caller's environment (the programs they lead
#: to are hashed by content instead).
_DRYRUN_SKIPPED_VARS = frozenset({"PATH", "LD_LIBRARY_PATH", "LIBRARIES"})
#: Programs of a toolkit's bin directories hashed whether or not the dry run names them.
_TOOLKIT_PROGRAMS = frozenset({"nvcc", "cicc", "ptxas", "cudafe++", "fatbinary", "nvlink"})
_PROBE_SOURCE = "metrale_probe.cu"


class _FileHashes:
    """Content hashes of the compilers' binaries, remembered by (size, mtime, ctime, inode)
    of the real path: the one part of a probe worth keeping across processes (tens of
    MB to read). ctime cannot be set back by a user, so a replaced file is re-read."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.known: dict[str, list[Any]] = {}
        self.used: dict[str, list[Any]] = {}
        self.dirty = False
        if path is not None:
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            if isinstance(data, dict):
                self.known = {k: v for k, v in data.items() if isinstance(v, list)}

    def digest(self, path: str) -> str | None:
        """xxh3-128 of the file at ``path`` (links followed), or None when it is not a file."""
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        known = self.known.get(real)
        if known is not None and len(known) == 5 and known[:4] == stamp:
            self.used[real] = known
            return str(known[4])
        try:
            entry = [*stamp, file_hash(real)]
        except OSError:
            return None
        self.known[real] = self.used[real] = entry
        self.dirty = True
        return str(entry[4])

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        others = sorted(k for k in self.known if k not in self.used)
        room = max(0, _FILE_HASHES_MAX - len(self.used))
        keep = {k: self.known[k] for k in others[:room]}
        keep.update(self.used)
        # Only a speed-up: a read-only build dir costs one hashing pass per process.
        with contextlib.suppress(OSError):
            write_atomic(self.path, json.dumps(dict(sorted(keep.items())), indent=1).encode())


def _run(argv: Sequence[str], environ: Mapping[str, str], cwd: Path | None = None) -> str:
    done = run_process(argv, env=environ, timeout=PROBE_TIMEOUT, cwd=cwd)
    return done.stdout + done.stderr


def dryrun_argv(toolchain: Toolchain, program: Path, arch: str) -> list[str]:
    """The dry-run probe's argv (pure): ``dryrun_args`` with the probe's file names; a
    token naming ``{arch}`` is dropped when ``arch`` is ""."""
    values = {
        "source": _PROBE_SOURCE,
        "output": "metrale_probe." + toolchain.extension,
        "intermediate": "metrale_probe." + (toolchain.intermediate_extension or "tmp"),
        "output_kind_flag": toolchain.output_flag,
        "arch": arch,
    }
    return [
        str(program),
        *(a.format_map(values) for a in toolchain.dryrun_args if arch or "{arch}" not in a),
    ]


def _dryrun(
    toolchain: Toolchain, program: Path, environ: Mapping[str, str], arch: str
) -> tuple[str, dict[str, str], list[str]]:
    """(normalised dry-run text, its ``#$ NAME=value`` variables, its command lines: nvcc's
    ``#$ ...`` lines and a clang driver's `` "/path/prog" ...`` lines)."""
    with tempfile.TemporaryDirectory(prefix="metrale-probe.") as tmp:
        source = Path(tmp) / _PROBE_SOURCE
        source.write_text('extern "C" __global__ void metrale_probe() {}\n', encoding="utf-8")
        scratch = Path(tmp) / "tmp"
        scratch.mkdir()
        argv = dryrun_argv(toolchain, program, arch)
        # A clang driver names its temporary files in TMPDIR: one the probe owns, so
        # they can be told apart from the toolkit's paths and normalised.
        text = _run(argv, {**environ, "TMPDIR": str(scratch)}, cwd=Path(tmp))
        spellings = {str(scratch): "<tmp>", os.path.realpath(scratch): "<tmp>"}
        spellings.update({tmp: "<probe>", os.path.realpath(tmp): "<probe>"})
        for spelling in sorted(spellings, key=len, reverse=True):
            text = text.replace(spelling, spellings[spelling])
    text = _TMP_NAME_RE.sub("tmpxft", text)
    text = _CLANG_TMP_RE.sub(r"\1-XXXXXX\2", text)
    variables: dict[str, str] = {}
    commands: list[str] = []
    kept: list[str] = []
    for line in text.splitlines():
        m = _DRYRUN_VAR_RE.match(line.strip())
        if m:
            variables[m["name"]] = m["value"].strip()
            if m["name"] in _DRYRUN_SKIPPED_VARS:
                continue
        elif line.startswith("#$ "):
            commands.append(line[3:].strip())
        elif line.startswith(' "'):
            commands.append(line.strip())
        kept.append(line.rstrip())
    return "\n".join(kept), variables, commands


def _expand(token: str, variables: Mapping[str, str]) -> str:
    token = token.strip('"')
    for name, value in variables.items():
        token = token.replace("${" + name + "}", value).replace("$" + name, value)
    return token


def _dryrun_files(
    variables: Mapping[str, str], commands: Sequence[str], search_path: str
) -> list[str]:
    """The files a dry run says will run or be read: each command's program (found on the
    dry run's own PATH), the toolkit's compiler programs, and ``NVVMIR_LIBRARY_DIR``."""
    out: list[str] = []
    for command in commands:
        try:
            words = shlex.split(command)
        except ValueError:
            words = command.split()
        if not words or words[0].startswith("-"):
            continue
        program = _expand(words[0], variables)
        if os.sep not in program:
            program = shutil.which(program, path=search_path) or ""
        if program:
            out.append(program)
    for name in ("_HERE_", "CICC_PATH"):
        folder = variables.get(name)
        if folder and os.path.isdir(folder):
            out.extend(
                os.path.join(folder, e)
                for e in sorted(os.listdir(folder))
                if e in _TOOLKIT_PROGRAMS
            )
    libdir = variables.get("NVVMIR_LIBRARY_DIR")
    if libdir and os.path.isdir(libdir):
        out.extend(os.path.join(libdir, e) for e in sorted(os.listdir(libdir)))
    return sorted(set(out))


def _dryrun_roots(variables: Mapping[str, str], commands: Sequence[str] = ()) -> tuple[str, ...]:
    """Toolkit directories a dry run names: nvcc's ``TOP`` and ``INCLUDES``; the include
    and resource directories of a clang driver's command lines (``-internal-isystem``
    ...)."""
    roots: list[str] = []
    top = variables.get("TOP")
    if top:
        roots.append(os.path.normpath(top))
    for name in ("INCLUDES", "SYSTEM_INCLUDES"):
        try:
            tokens = shlex.split(variables.get(name, ""))
        except ValueError:
            tokens = []
        for token in tokens:
            folder = token[2:] if token.startswith("-I") else token
            if folder.startswith("/"):
                roots.append(os.path.normpath(folder))
    for command in commands:
        if not command.startswith('"'):
            continue  # nvcc's own command lines: its variables above name its toolkit
        try:
            words = shlex.split(command)
        except ValueError:
            continue
        for i, word in enumerate(words):
            value = ""
            if word in _CLANG_DIR_OPTIONS and i + 1 < len(words):
                value = words[i + 1]
            elif word.startswith("-I") and len(word) > 2:
                value = word[2:]
            if value.startswith("/"):
                roots.append(os.path.normpath(value))
    return tuple(dict.fromkeys(roots))


def _run_probe(
    toolchain: Toolchain,
    program: Path,
    host: Path | None,
    environ: Mapping[str, str],
    env: Mapping[str, str],
    hashes: _FileHashes,
    arch: str,
) -> Probe:
    doc: dict[str, Any] = {"toolchain": toolchain.name, "env": dict(env)}
    roots: tuple[str, ...] = ()
    system: tuple[str, ...] = ()
    files = [str(program)]
    try:
        version = _version_text(_run([str(program), *toolchain.version_args], environ))
        doc["version"] = version
        if toolchain.dryrun_args:
            try:
                text, variables, commands = _dryrun(toolchain, program, environ, arch)
            except ProcessError as exc:
                raise ToolchainError(
                    f"toolchain {toolchain.name!r}",
                    "dryrun_args",
                    f"the dry-run probe failed: {exc}; if this compiler has no dry run, "
                    f"set dryrun_args = [] in a toolchains/{toolchain.name}.toml that "
                    f'extends "{toolchain.name}"',
                ) from None
            doc["dryrun"] = text
            search = variables.get("PATH") or environ.get("PATH", os.defpath)
            files.extend(_dryrun_files(variables, commands, search))
            roots = _dryrun_roots(variables, commands)
        human = version
        if host is not None:
            host_version = _run([str(host), *toolchain.host_compiler_version_args], environ)
            lines = host_version.strip().splitlines()
            human += " | host: " + (lines[0].strip() if lines else host.name)
            doc["host_version"] = host_version.strip()
            files.append(str(host))
            if toolchain.host_compiler_probe_args:
                host_dryrun = _run([str(host), *toolchain.host_compiler_probe_args], environ)
                doc["host_dryrun"] = host_dryrun
                for line in host_dryrun.splitlines():
                    # gcc -### prints each command it would run indented by one space.
                    if line.startswith(" ") and line.strip():
                        first = line.split()[0].strip('"')
                        if os.path.isabs(first):
                            files.append(first)
            if toolchain.host_compiler_search_args:
                # The user's search-path variables would show up as "system" directories.
                plain = {k: v for k, v in environ.items() if k not in _SEARCH_PATH_VARS}
                listing = _run([str(host), *toolchain.host_compiler_search_args], plain)
                system = _search_dirs(listing)
                doc["host_search"] = list(system)
    except ProcessError as exc:
        raise ToolchainError(
            f"toolchain {toolchain.name!r}", "version_args", f"the version probe failed: {exc}"
        ) from None
    if not version.strip():
        raise ToolchainError(
            f"toolchain {toolchain.name!r}", "version_args", "the version probe printed nothing"
        )
    # Content, not path: the same toolkit installed elsewhere has the same identity.
    doc["files"] = sorted({d for d in (hashes.digest(f) for f in files) if d is not None})
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    digest = xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))
    return Probe(identity=f"{human} | {digest}", roots=roots, system_dirs=system)


#: Environment variables that add include directories to a gcc-like preprocessor.
_SEARCH_PATH_VARS = frozenset(
    {"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH"}
)


def _search_dirs(listing: str) -> tuple[str, ...]:
    """The directories of ``gcc -E -v``'s "#include <...> search starts here:" list."""
    dirs: list[str] = []
    inside = False
    for line in listing.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            break
        elif inside and line.startswith(" "):
            folder = line.strip().split(" (")[0]
            if os.path.isabs(folder):
                dirs.append(os.path.normpath(folder))
    return tuple(dict.fromkeys(dirs))


def toolchain_stamp(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    site_dirs: Iterable[Path] | None = None,
) -> list[Any]:
    """What :func:`find_toolchain` finds, JSON-ready (for the task cache): ``["missing"]``,
    ``["found", program, identity]`` (probed: once per process), or ``["error", text]``.

    A toolchain picked per arch (a program under ``{root}``) is stamped by its root
    and every arch's compiler there: ``["found", root, [[arch, identity], ...]]``
    (compilers that are one file are probed once).
    """
    try:
        if "{root}" in toolchain.program:
            return _root_stamp(toolchain, environ, state_dir)
        program = find_program(toolchain, environ, site_dirs=site_dirs)
        if program is None:
            return ["missing"]
        probe = probe_toolchain(toolchain, program, environ, state_dir=state_dir)
    except MetraleError as exc:
        return ["error", str(exc)]
    return ["found", str(program), probe.identity]


def _root_stamp(
    toolchain: Toolchain, environ: Mapping[str, str], state_dir: Path | None
) -> list[Any]:
    root = find_root(toolchain, environ)
    if root is None:
        return ["missing"]
    pattern = re.escape(toolchain.program).replace(re.escape("{root}"), re.escape(str(root)))
    pattern = pattern.replace(re.escape("{arch}"), "(?P<arch>[^/]+)")
    matcher = re.compile(pattern)
    found = glob.glob(toolchain.program.format(root=glob.escape(str(root)), arch="*"))
    stamps: list[list[str]] = []
    probed: dict[str, str] = {}
    for path in sorted(found):
        m = matcher.fullmatch(path)
        if m is None or not _executable(Path(path)):
            continue
        real = os.path.realpath(path)
        if real not in probed:
            probed[real] = probe_toolchain(
                toolchain, Path(path), environ, state_dir=state_dir, arch=m["arch"]
            ).identity
        stamps.append([m["arch"], probed[real]])
    return ["found", str(root), stamps]


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


def find_toolchain(
    toolchain: Toolchain,
    environ: Mapping[str, str],
    *,
    state_dir: Path | None = None,
    site_dirs: Iterable[Path] | None = None,
    arch: str = "",
) -> FoundToolchain:
    """Find and probe ``toolchain`` (for ``arch``: the hardware's ``[hardware] arch``, which
    picks the compiler of a toolchain whose program lies under ``{root}`` and fills
    ``{arch}`` in its dry run).

    Raises :class:`ToolchainMissing` saying what to install, :class:`ToolchainError`
    for a variable naming an unusable compiler or root, or a failed probe.
    """
    program = locate_toolchain(toolchain, environ, site_dirs=site_dirs, arch=arch)
    probe = probe_toolchain(toolchain, program, environ, state_dir=state_dir, arch=arch)
    return FoundToolchain(
        toolchain=toolchain,
        program=program,
        identity=probe.identity,
        roots=probe.roots,
        system_dirs=probe.system_dirs,
    )
