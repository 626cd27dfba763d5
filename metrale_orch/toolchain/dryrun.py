"""Reading a compiler's dry run: what it would run and read (I/O: runs the compiler).

:func:`run_dryrun` runs the toolchain's dry-run probe (``nvcc --dryrun``, a clang
driver's ``-###``) on a throw-away source and normalises the temporary names,
so two runs print the same text; :func:`dryrun_files` and :func:`dryrun_roots`
read the programs and toolkit directories it names; :func:`search_dirs` reads
a host compiler's include search list. Used by :mod:`~metrale_orch.toolchain.probe`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from metrale_orch.proc import run_process, wait_process
from metrale_orch.toolchain.definitions import Toolchain
from metrale_orch.toolchain.earlyruns import PROBE_KERNEL, PROBE_SOURCE, EarlyRuns

__all__ = [
    "PROBE_TIMEOUT",
    "SEARCH_PATH_VARS",
    "dryrun_argv",
    "dryrun_files",
    "dryrun_roots",
    "run_dryrun",
    "run_tool",
    "run_witness",
    "search_dirs",
]

#: Seconds a version probe may take.
PROBE_TIMEOUT = 60.0
_TMP_NAME_RE = re.compile(r"tmpxft_[0-9a-fA-F]+_[0-9a-fA-F]+")
#: A path in the temporary directory the probe gives a clang driver: its temporary files
#: and directories are ``<stem>-<6 random hex digits>`` (LLVM's ``createTemporaryFile``;
#: clang 15's HIP driver makes ``<tmp>/<stem>-<hex>/<stem>-<arch>.o``).
_CLANG_TMP_PATH_RE = re.compile(r"<tmp>/[^\s\"']*")
_CLANG_TMP_PART_RE = re.compile(r"-[0-9a-f]{6}(?=[./]|$)")
#: A HIP compile's unit id (``-cuid=<hex>``): clang hashes the probe's own paths into it.
_CLANG_CUID_RE = re.compile(r"-cuid=[0-9a-f]+")
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


def run_tool(argv: Sequence[str], environ: Mapping[str, str], cwd: Path | None = None) -> str:
    """``argv``'s output (stdout, then stderr); raises ProcessError."""
    done = run_process(argv, env=environ, timeout=PROBE_TIMEOUT, cwd=cwd)
    return done.stdout + done.stderr


def run_witness(
    argv: Sequence[str], environ: Mapping[str, str], early: EarlyRuns | None = None
) -> str:
    """:func:`run_tool` in the current directory, for a command every run of a probe runs
    (a host compiler's dry run): it may be one of ``early``, started before the package
    loaded (:mod:`.earlyruns`)."""
    run = None if early is None else early.take(argv, environ, probe_dir=False)
    if run is None:
        return run_tool(argv, environ)
    try:
        done = wait_process(run.args, run.proc, timeout=PROBE_TIMEOUT, start=run.started)
    finally:
        run.close()
    return done.stdout + done.stderr


def dryrun_argv(toolchain: Toolchain, program: Path, arch: str) -> list[str]:
    """The dry-run probe's argv (pure): ``dryrun_args`` with the probe's file names; a
    token naming ``{arch}`` is dropped when ``arch`` is ""."""
    values = {
        "source": PROBE_SOURCE,
        "output": "metrale_probe." + toolchain.extension,
        "intermediate": "metrale_probe." + (toolchain.intermediate_extension or "tmp"),
        "output_kind_flag": toolchain.output_flag,
        "arch": arch,
    }
    return [
        str(program),
        *(a.format_map(values) for a in toolchain.dryrun_args if arch or "{arch}" not in a),
    ]


def run_dryrun(
    toolchain: Toolchain,
    program: Path,
    environ: Mapping[str, str],
    arch: str,
    early: EarlyRuns | None = None,
) -> tuple[str, dict[str, str], list[str]]:
    """(normalised dry-run text, its ``#$ NAME=value`` variables, its command lines: nvcc's
    ``#$ ...`` lines and a clang driver's `` "/path/prog" ...`` lines); taken from
    ``early`` when it started exactly this dry run."""
    argv = dryrun_argv(toolchain, program, arch)
    run = None if early is None else early.take(argv, environ, probe_dir=True)
    if run is not None and run.tmp is not None:
        try:
            done = wait_process(run.args, run.proc, timeout=PROBE_TIMEOUT, start=run.started)
            text = _probe_dir_named(done.stdout + done.stderr, run.tmp)
        finally:
            run.close()
    else:
        with tempfile.TemporaryDirectory(prefix="metrale-probe.") as tmp:
            source = Path(tmp) / PROBE_SOURCE
            source.write_text(PROBE_KERNEL, encoding="utf-8")
            scratch = Path(tmp) / "tmp"
            scratch.mkdir()
            # A clang driver names its temporary files in TMPDIR: one the probe owns, so
            # they can be told apart from the toolkit's paths and normalised.
            text = run_tool(argv, {**environ, "TMPDIR": str(scratch)}, cwd=Path(tmp))
            text = _probe_dir_named(text, tmp)
    text = _TMP_NAME_RE.sub("tmpxft", text)
    text = _CLANG_TMP_PATH_RE.sub(lambda m: _CLANG_TMP_PART_RE.sub("-XXXXXX", m[0]), text)
    text = _CLANG_CUID_RE.sub("-cuid=<cuid>", text)
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


def _probe_dir_named(text: str, tmp: str) -> str:
    """``text`` with the probe's directory ``tmp`` and its scratch ``tmp/tmp`` (each as
    given and resolved) written ``<probe>`` and ``<tmp>``."""
    scratch = os.path.join(tmp, "tmp")
    spellings = {scratch: "<tmp>", os.path.realpath(scratch): "<tmp>"}
    spellings.update({tmp: "<probe>", os.path.realpath(tmp): "<probe>"})
    for spelling in sorted(spellings, key=len, reverse=True):
        text = text.replace(spelling, spellings[spelling])
    return text


def _expand(token: str, variables: Mapping[str, str]) -> str:
    token = token.strip('"')
    for name, value in variables.items():
        token = token.replace("${" + name + "}", value).replace("$" + name, value)
    return token


def dryrun_files(
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


def dryrun_roots(variables: Mapping[str, str], commands: Sequence[str] = ()) -> tuple[str, ...]:
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


#: Environment variables that add include directories to a gcc-like preprocessor.
SEARCH_PATH_VARS = frozenset({"CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH"})


def search_dirs(listing: str) -> tuple[str, ...]:
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
