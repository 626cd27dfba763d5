"""Toolchains: the compiler definitions, read from TOML, and which one builds a hardware.

A toolchain is one ``[toolchain]`` table in a TOML file. The package ships
working definitions, one per compiler the reference build drives (SPEC 3.3):
``nvcc`` for NVIDIA, ``scale`` (SCALE's per-arch nvcc) for ``amd``/``rocm``/
``scale``, ``hip`` (hipcc) for ``hip`` and ``metal`` (xcrun, two steps) for
Apple, as package data (``metrale_orch/builtin_toolchains/*.toml``); a project
may add or replace toolchains with ``<root>/toolchains/*.toml`` (a file whose
``name`` equals a built-in replaces it; ``extends = "<name>"`` starts from
another toolchain's fields). A hardware picks its toolchain by vendor, or by
``[build] toolchain = "<name>"`` in its HARDWARE.toml.

Pure: :func:`parse_toolchain` (each field checked by :mod:`~metrale_orch.toolchain.fields`),
:func:`select_toolchain`. I/O: :func:`load_toolchains`
and :func:`builtin_toolchains` (read the files). How a toolchain is called lives in
:mod:`~metrale_orch.toolchain.argv`, where its compiler is in
:mod:`~metrale_orch.toolchain.locate`, what it is in :mod:`~metrale_orch.toolchain.probe`.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from metrale_orch.fsutil import parse_toml
from metrale_orch.toolchain.errors import ToolchainError
from metrale_orch.toolchain.fields import (
    check_program,
    checked_arch_check,
    checked_dialect,
    checked_env_set,
    checked_extension,
    checked_name,
    checked_output_flag,
    checked_steps,
    merged_fields,
    text_field,
    word_list,
)

if TYPE_CHECKING:  # only for annotations: the build's no-op path skips importing the resolver
    from metrale_orch.tree import Hardware

__all__ = [
    "Toolchain",
    "builtin_toolchains",
    "load_toolchains",
    "parse_toolchain",
    "select_toolchain",
]


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
    #: Variables the toolchain sets for every probe, arch check and compile, over the
    #: caller's environment (hipcc's ``HIP_PLATFORM=amd``), as (name, value) sorted by
    #: name; part of the identity and of every key.
    env_set: tuple[tuple[str, str], ...] = ()
    #: Arguments of a tiny compile (an empty kernel) that shows whether the compiler can
    #: build an arch at all (``{arch}``, ``{source}``, ``{output}``, ``{output_kind_flag}``);
    #: empty: no such check (a target whose arch the compiler rejects fails to compile).
    arch_check_args: tuple[str, ...] = ()
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

    def to_dict(self) -> dict[str, str | list[str] | dict[str, str] | None]:
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
            "env_set": dict(self.env_set),
            "arch_check_args": list(self.arch_check_args),
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


def parse_toolchain(
    table: Mapping[str, object],
    where: str,
    *,
    base: Mapping[str, object] | None = None,
    file: Path | None = None,
) -> Toolchain:
    """Validate one ``[toolchain]`` table (over ``base``'s fields) into a Toolchain.

    Raises :class:`ToolchainError` naming ``where`` and the key for an unknown
    key, a wrong type, an unknown output kind or a bad template.
    """
    fields = merged_fields(table, where, base)
    name = checked_name(fields, where)
    output = text_field(fields, "output", "ptx")
    output_flag = checked_output_flag(table, fields, output, where)
    extension = checked_extension(table, fields, output, where)
    argv = word_list(fields, "argv")
    link = word_list(fields, "link_argv")
    intermediate = checked_steps(fields, argv, link, extension, where)
    dialect = checked_dialect(fields, where)
    check_program(fields, where)
    return Toolchain(
        name=name,
        program=text_field(fields, "program"),
        vendors=word_list(fields, "vendors"),
        version_args=word_list(fields, "version_args", ("--version",)),
        host_compiler=text_field(fields, "host_compiler"),
        host_compiler_env=text_field(fields, "host_compiler_env"),
        host_compiler_version_args=word_list(fields, "host_compiler_version_args", ("--version",)),
        output=output,
        output_flag=output_flag,
        extension=extension,
        argv=argv,
        link_argv=link,
        intermediate_extension=intermediate,
        strict_args=word_list(fields, "strict_args"),
        no_strict_env=text_field(fields, "no_strict_env"),
        extra_flags_env=text_field(fields, "extra_flags_env"),
        dialect=dialect,
        flags_key=text_field(fields, "flags_key", "extra_nvcc_flags"),
        env_allowlist=tuple(sorted(set(word_list(fields, "env_allowlist")))),
        env_prefixes=tuple(sorted(set(word_list(fields, "env_prefixes")))),
        env_set=checked_env_set(fields, where),
        arch_check_args=checked_arch_check(fields, where),
        dryrun_args=word_list(fields, "dryrun_args"),
        host_compiler_probe_args=word_list(fields, "host_compiler_probe_args"),
        host_compiler_search_args=word_list(fields, "host_compiler_search_args"),
        depfile_args=word_list(fields, "depfile_args"),
        program_env=word_list(fields, "program_env"),
        program_paths=word_list(fields, "program_paths"),
        root_env=word_list(fields, "root_env"),
        root_globs=word_list(fields, "root_globs"),
        root_markers=word_list(fields, "root_markers"),
        home_env=word_list(fields, "home_env"),
        pip_dirs=word_list(fields, "pip_dirs"),
        install_hint=text_field(fields, "install_hint") or f"`{fields['program']}`",
        file=file,
    )


def _table_of(doc: Mapping[str, object], where: str) -> dict[str, object]:
    table = doc.get("toolchain")
    if not isinstance(table, dict):
        raise ToolchainError(where, "[toolchain]", "the file must hold a [toolchain] table")
    extra = sorted(k for k in doc if k != "toolchain")
    if extra:
        raise ToolchainError(where, extra[0], "unknown table (only [toolchain] is read)")
    return table


def _read_toml(path: Path, where: str) -> dict[str, object]:
    try:
        return parse_toml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolchainError(where, "", f"cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ToolchainError(where, "", f"is not valid TOML: {exc}") from None


def _builtin_tables() -> dict[str, dict[str, object]]:
    """Fresh (shallow) copies of the package's toolchain tables, parsed once per process."""
    return {name: dict(table) for name, table in _read_builtin_tables().items()}


@functools.cache
def _read_builtin_tables() -> Mapping[str, Mapping[str, object]]:
    tables: dict[str, dict[str, object]] = {}
    folder = resources.files("metrale_orch").joinpath("builtin_toolchains")
    for item in sorted(folder.iterdir(), key=lambda t: t.name):
        if not item.name.endswith(".toml"):
            continue
        where = f"metrale_orch/builtin_toolchains/{item.name}"
        table = _table_of(parse_toml(item.read_text(encoding="utf-8")), where)
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
    project: dict[str, tuple[dict[str, object], Path, str]] = {}
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
    fields_of: dict[str, dict[str, object]] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict[str, object]:
        if name in fields_of:
            return fields_of[name]
        table, path, where = project[name]
        base: dict[str, object] = {}
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
