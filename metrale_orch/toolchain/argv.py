"""How a toolchain is called: its argv templates rendered, its environment switches (pure).

:func:`compile_argv` and :func:`link_argv` fill a toolchain's templates;
:func:`program_name` is the machine-independent program spelling keys and
manifests use; :func:`env_switches` reads ``METRALE_KERNEL_NO_STRICT``
and ``METRALE_EXTRA_NVCC_FLAGS``; :func:`keyed_environment` is the toolchain's
environment allow-list; :func:`toolchain_environ` is the environment its
compiler runs in (its ``env_set`` over the caller's). Everything here is a
function of values: the same inputs give the same argv on every machine.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.errors import ToolchainError
from metrale_orch.toolchain.fields import LIST_PLACEHOLDERS

__all__ = [
    "Switches",
    "compile_argv",
    "env_switches",
    "hip_flags",
    "keyed_environment",
    "link_argv",
    "overridden_environment",
    "program_name",
    "set_environment_line",
    "toolchain_environ",
]


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
    (``-fmad=…`` too) is dropped; everything else is kept in order.

    A ``-ffp-contract=…`` that repeats the one already in effect is dropped (a tree's
    HIP leaves often carry both ``--fmad=false`` and ``-ffp-contract=off``): so hipcc
    gets each setting once. A repeat is kept when a flag between the two could change
    contraction itself (``-ffast-math``, ``-ffp-model=…``, ``-O…``: anything ``-f``/``-O``),
    so the command means what the flags said (clang's last setting wins)."""
    out: list[str] = []
    in_effect = ""
    for flag in _translated_fmad(flags):
        if flag.startswith("-ffp-contract="):
            if flag == in_effect:
                continue
            in_effect = flag
        elif flag.startswith(("-f", "-O")):
            in_effect = ""
        out.append(flag)
    return tuple(out)


def _translated_fmad(flags: Sequence[str]) -> list[str]:
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
    return out


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
        if token in LIST_PLACEHOLDERS:
            out.extend(lists.get(token, ()))
        else:
            rendered = token.format_map(values)
            if rendered:
                out.append(rendered)
    return tuple(out)


def keyed_environment(toolchain: Toolchain, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables the toolchain's compilers read (pure; sorted): its ``env_set``, and
    those of ``environ`` named by its ``env_allowlist`` or starting with one of its
    ``env_prefixes`` (an ``env_set`` name keeps the toolchain's value)."""
    prefixes = toolchain.env_prefixes
    keyed = {
        name: _printable(environ[name])
        for name in environ
        if name in toolchain.env_allowlist or (prefixes and name.startswith(prefixes))
    }
    keyed.update(toolchain.env_set)
    return dict(sorted(keyed.items()))


def toolchain_environ(toolchain: Toolchain, environ: Mapping[str, str]) -> Mapping[str, str]:
    """The environment the toolchain's compiler runs in (pure): ``environ`` with the
    toolchain's ``env_set`` over it. The toolchain wins: hipcc on a machine with CUDA
    runs the NVIDIA platform unless ``HIP_PLATFORM=amd``, and a ``HIP_PLATFORM`` left in
    a shell must not turn an AMD build into an NVIDIA one (a toolchain for that platform
    says so in its own ``env_set``). ``environ`` itself when nothing changes."""
    if all(environ.get(name) == value for name, value in toolchain.env_set):
        return environ
    return {**environ, **dict(toolchain.env_set)}


def overridden_environment(toolchain: Toolchain, environ: Mapping[str, str]) -> list[str]:
    """One line per variable of ``environ`` the toolchain's ``env_set`` overrides with
    another value (pure): what a build warns about."""
    return [
        f"environment {name}={_printable(environ[name])!s} is not used: toolchain "
        f"{toolchain.name!r} sets {name}={value} (env_set); a toolchain of your own "
        f'(toolchains/<name>.toml, extends = "{toolchain.name}") may set another value'
        for name, value in toolchain.env_set
        if name in environ and environ[name] != value
    ]


def set_environment_line(toolchain: Toolchain) -> str:
    """The toolchain's ``env_set`` as a shell would spell it before a command (pure):
    ``HIP_PLATFORM=amd``; "" without one."""
    return " ".join(shlex.quote(f"{name}={value}") for name, value in toolchain.env_set)


def _printable(value: str) -> str:
    """``value`` with undecodable bytes (``os.environ``'s surrogate escapes) spelled as
    ``\\xNN``: distinct bytes stay distinct and the value can be encoded into a key."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
