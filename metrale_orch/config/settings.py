"""The settings, where each comes from, and :func:`load_config`, the one function that
reads them: built-in defaults < ``pyproject.toml`` < environment < command line (I/O at
the edges: the pyproject file, the environment passed in, the build directory's place).
Each value is checked and converted by :func:`~metrale_orch.config.values.convert`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from metrale_orch.config.values import ConfigError, Setting, convert

__all__ = [
    "ENV_VARS",
    "EXECUTION_KEYS",
    "LOCAL_KEY",
    "Config",
    "build_dir_problem",
    "default_jobs",
    "default_local_cache",
    "default_local_key",
    "find_root",
    "load_config",
    "read_pyproject",
    "setting_variables",
    "source_label",
]

T = TypeVar("T")

#: This user's own local signing key, under the user's configuration directory
#: (:func:`default_local_key`): never in the local cache, which others may share.
LOCAL_KEY = Path("keys") / "local-ed25519.pem"


def _empty() -> Mapping[str, T]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Resolved settings of one project. Paths are absolute for this process."""

    root: Path
    build_dir: Path
    #: Remote cache as an fsspec URL (``s3://bucket/prefix``), or "" for none.
    cache: str = ""
    cache_mode: str = "read-write"
    #: Salt mixed into every action key; changing it disowns every entry.
    cache_namespace: str = ""
    #: Deadline in seconds for each remote call.
    cache_timeout: float = 2.0
    local_cache: Path
    storage_options: Mapping[str, object] = field(default_factory=_empty)
    log_max_bytes: int = 4 * 1024 * 1024
    log_backups: int = 3
    #: The HIP compat directory (absolute), or None for none.
    hip_compat_dir: Path | None = None
    #: Most compile actions run at once on this machine (default: the CPUs this process
    #: may use, :func:`default_jobs`).
    jobs: int = 1
    #: Bytes the running compiles' predicted peak memory may add up to on this machine
    #: (0: ``MemAvailable`` when the build starts).
    memory: int = 0
    #: Remote Execution API endpoint (``grpc://host:port``, ``grpcs://`` for TLS), or "".
    remote_executor: str = ""
    #: The REAPI instance name ("" for the server's default instance).
    remote_instance: str = ""
    #: Extra gRPC metadata sent with every remote call (an API key header, say); secret.
    remote_headers: Mapping[str, object] = field(default_factory=_empty)
    #: Most remote actions in flight at once (independent of ``jobs``).
    remote_jobs: int = 100
    #: Whether an infrastructure failure of remote execution fails the module instead of
    #: running it locally.
    remote_strict: bool = False
    #: Seconds an action may wait for a worker (queued) before it runs locally instead.
    remote_queue_timeout: float = 60.0
    #: Seconds one compile may run before it is stopped, here and as the remote Action's
    #: ``timeout``.
    compile_timeout: float = 900.0
    #: A container image the workers must run the compile in ("" for none).
    remote_container_image: str = ""
    #: A PEM file of the certificate authorities a ``grpcs://`` server is checked against
    #: (None: the system's).
    remote_ca_file: Path | None = None
    #: Whether a module that every cache tier misses fails instead of compiling here (a
    #: smoke job on a GPU runner, whose build job should have filled the shared cache).
    require_hits: bool = False
    #: The private key entries are signed with: PEM text, or the absolute path of a PEM
    #: file ("" for none). Secret: never shown, logged or written.
    cache_signing_key: str = field(default="", repr=False)
    #: Public key lines (``ed25519:<base64> [label]``) whose signatures a remote entry
    #: needs before it is served; empty: entries are not checked for a signer.
    cache_trusted_keys: tuple[str, ...] = ()
    #: ``metrale-orch size``'s limits in bytes, by hardware (each of its targets) or by
    #: target (``hw/model/quant``, over its hardware's); empty: no budget.
    size_budget: Mapping[str, int] = field(default_factory=_empty)
    #: hardware -> its deployment's facts (``[tool.metrale-orch.deploy.<hw>]``): so far
    #: ``min_cuda``, the oldest CUDA driver it must load on (``"12.8"``), read by the
    #: release gate (``metrale-orch coverage``).
    deploy: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)
    #: This user's own local signing key (:func:`default_local_key`; not a setting).
    local_key: Path
    #: key -> "default" | "pyproject" | "env" | "cli"
    sources: Mapping[str, str] = field(default_factory=_empty)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready view (paths as strings; the local cache is per user, so absolute)."""
        return {
            "build_dir": _rel(self.build_dir, self.root),
            "cache": self.cache,
            "cache_mode": self.cache_mode,
            "cache_namespace": self.cache_namespace,
            "cache_timeout": self.cache_timeout,
            "local_cache": str(self.local_cache),
            "storage_options": dict(sorted(self.storage_options.items())),
            "log_max_bytes": self.log_max_bytes,
            "log_backups": self.log_backups,
            "hip_compat_dir": ""
            if self.hip_compat_dir is None
            else _rel(self.hip_compat_dir, self.root),
            "jobs": self.jobs,
            "memory": self.memory,
            "remote_executor": self.remote_executor,
            "remote_instance": self.remote_instance,
            # Header values are credentials (an API key): never shown or written.
            "remote_headers": {k: "<set>" for k in sorted(self.remote_headers)},
            "remote_jobs": self.remote_jobs,
            "remote_strict": self.remote_strict,
            "remote_queue_timeout": self.remote_queue_timeout,
            "compile_timeout": self.compile_timeout,
            "remote_container_image": self.remote_container_image,
            "remote_ca_file": "" if self.remote_ca_file is None else str(self.remote_ca_file),
            "require_hits": self.require_hits,
            # A private key (or where it lives): never shown or written.
            "cache_signing_key": "<set>" if self.cache_signing_key else "",
            "cache_trusted_keys": list(self.cache_trusted_keys),
            "size_budget": dict(sorted(self.size_budget.items())),
            "deploy": {hw: dict(sorted(v.items())) for hw, v in sorted(self.deploy.items())},
            "sources": dict(sorted(self.sources.items())),
        }


def _rel(path: Path, root: Path) -> str:
    # Not paths.rel_posix: the root itself is "." here (messages say "'.' is the project
    # root"), and a relative path under a relative root is made relative to it.
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


# key -> (environment variable or None, parser kind)
_KEYS: dict[str, tuple[str | None, str]] = {
    "build_dir": ("METRALE_ORCH_BUILD_DIR", "path"),
    "cache": ("METRALE_ORCH_CACHE", "str"),
    "cache_mode": ("METRALE_ORCH_CACHE_MODE", "mode"),
    "cache_namespace": ("METRALE_ORCH_CACHE_NAMESPACE", "str"),
    "cache_timeout": ("METRALE_ORCH_CACHE_TIMEOUT", "seconds"),
    "local_cache": ("METRALE_ORCH_LOCAL_CACHE", "path"),
    "storage_options": ("METRALE_ORCH_STORAGE_OPTIONS", "table"),
    "log_max_bytes": (None, "count"),
    "log_backups": (None, "count"),
    "hip_compat_dir": ("METRALE_ORCH_HIP_COMPAT_DIR", "optpath"),
    "jobs": ("METRALE_ORCH_JOBS", "jobs"),
    "memory": ("METRALE_ORCH_MEMORY", "memory"),
    "remote_executor": ("METRALE_ORCH_REMOTE_EXECUTOR", "grpc"),
    "remote_instance": ("METRALE_ORCH_REMOTE_INSTANCE", "str"),
    "remote_headers": ("METRALE_ORCH_REMOTE_HEADERS", "headers"),
    "remote_jobs": ("METRALE_ORCH_REMOTE_JOBS", "jobs"),
    "remote_strict": ("METRALE_ORCH_REMOTE_STRICT", "bool"),
    "remote_queue_timeout": ("METRALE_ORCH_REMOTE_QUEUE_TIMEOUT", "seconds"),
    "compile_timeout": ("METRALE_ORCH_COMPILE_TIMEOUT", "seconds"),
    "remote_container_image": ("METRALE_ORCH_REMOTE_CONTAINER_IMAGE", "str"),
    "remote_ca_file": ("METRALE_ORCH_REMOTE_CA_FILE", "optpath"),
    "require_hits": ("METRALE_ORCH_REQUIRE_HITS", "bool"),
    "cache_signing_key": ("METRALE_ORCH_CACHE_SIGNING_KEY", "signing_key"),
    "cache_trusted_keys": ("METRALE_ORCH_CACHE_TRUSTED_KEYS", "public_keys"),
    "size_budget": ("METRALE_ORCH_SIZE_BUDGET", "size_budget"),
    "deploy": (None, "deploy"),
}

#: Settings that say where and how many compiles run (or whether one may run here at all:
#: ``require_hits``), never what they produce: no task, key or artefact depends on them.
EXECUTION_KEYS = frozenset(
    {
        "jobs",
        "memory",
        "remote_executor",
        "remote_instance",
        "remote_headers",
        "remote_jobs",
        "remote_strict",
        "remote_queue_timeout",
        "compile_timeout",
        "remote_container_image",
        "remote_ca_file",
        "require_hits",
        # Who signs what this build publishes changes no artefact. (The trusted keys do
        # decide what may be installed: changing them re-checks every target.)
        "cache_signing_key",
        # A size budget checks what a build installed; it changes none of it.
        "size_budget",
        # The deployment's facts check what a build installed (metrale-orch coverage).
        "deploy",
    }
)
#: Kinds whose command-line value may come as text to be parsed.
_TEXT_KINDS = (
    "seconds",
    "count",
    "table",
    "jobs",
    "memory",
    "bool",
    "headers",
    "public_keys",
    "size_budget",
    "deploy",
)

#: Environment variables the configuration reads, for documentation.
ENV_VARS: Mapping[str, str] = MappingProxyType(
    {env: key for key, (env, _) in _KEYS.items() if env is not None}
)


def setting_variables(overrides: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that carry command-line ``overrides`` into a process that
    reads its settings from the environment (a doit run); pure. Raises
    :class:`ConfigError` for an unknown key or one no variable carries."""
    out: dict[str, str] = {}
    for key, value in sorted(overrides.items()):
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ConfigError("command line", key, f"unknown setting (known keys: {known})")
        var = _KEYS[key][0]
        if var is None:
            raise ConfigError(
                "command line",
                key,
                "cannot be set for a doit run (no environment variable carries it); "
                "set it in pyproject.toml [tool.metrale-orch]",
            )
        out[var] = value
    return out


def default_jobs() -> int:
    """The CPUs this process may use (its affinity mask where the OS has one): the default
    number of compiles run at once."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_local_cache(environ: Mapping[str, str]) -> Path:
    """The per-user cache directory shared by every checkout of this user."""
    xdg = environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "metrale-orch"
    home = environ.get("HOME")
    if home:
        return Path(home) / ".cache" / "metrale-orch"
    # platformdirs costs ~13 ms to import and is needed only without XDG_CACHE_HOME and HOME.
    import platformdirs

    return Path(platformdirs.user_cache_dir("metrale-orch"))


def default_local_key(environ: Mapping[str, str]) -> Path:
    """This user's own local signing key, ``metrale-orch/keys/local-ed25519.pem`` in the
    user's configuration directory (``XDG_CONFIG_HOME`` when absolute, as the XDG
    specification says, else ``~/.config``), never in the local cache (a directory
    others may share). I/O only without either variable."""
    xdg = environ.get("XDG_CONFIG_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "metrale-orch" / LOCAL_KEY
    home = environ.get("HOME")
    if home:
        return Path(home) / ".config" / "metrale-orch" / LOCAL_KEY
    import platformdirs  # as in default_local_cache: only without the variables

    return Path(platformdirs.user_config_dir("metrale-orch")) / LOCAL_KEY


def find_root(start: Path) -> Path:
    """The nearest ancestor of ``start`` (itself included) holding ``dodo.py`` or ``kernels/``."""
    start = start.resolve()
    for cand in (start, *start.parents):
        if (cand / "dodo.py").is_file() or (cand / "kernels").is_dir():
            return cand
    return start


def read_pyproject(path: Path) -> dict[str, object] | None:
    """``path`` (a project's ``pyproject.toml``) parsed, or None when there is no such file
    (I/O). Raises :class:`ConfigError` naming the file, and for bad TOML the line and
    column, when it cannot be read or parsed."""
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    # ValueError: TOMLDecodeError, UnicodeDecodeError, and an integer past Python's 4300
    # digits (which tomllib lets through as a plain ValueError).
    except (OSError, ValueError) as exc:
        raise ConfigError(path.name, "(file)", f"cannot be read: {exc}") from None


def load_config(
    root: Path,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Read ``<root>/pyproject.toml`` ``[tool.metrale-orch]``, then the environment, then overrides.

    ``overrides`` are command-line values (already typed, or text). Raises
    :class:`ConfigError` for an unreadable pyproject, an unknown key or a bad value.
    """
    env = os.environ if environ is None else environ
    root = Path(root)
    values: dict[str, Setting] = {
        "build_dir": root / "build",
        "local_cache": default_local_cache(env),
        "jobs": default_jobs(),
    }
    sources: dict[str, str] = {k: "default" for k in _KEYS}

    doc = read_pyproject(root / "pyproject.toml")
    if doc is not None:
        where = "pyproject.toml [tool.metrale-orch]"
        tool = doc.get("tool", {})
        table = tool.get("metrale-orch", {}) if isinstance(tool, dict) else {}
        if not isinstance(table, dict):
            raise ConfigError(where, "(table)", "must be a table")
        for key, value in table.items():
            if key not in _KEYS:
                known = ", ".join(sorted(_KEYS))
                raise ConfigError(where, key, f"unknown key (known keys: {known})")
            values[key] = convert(_KEYS[key][1], value, where, key, root, from_text=False)
            sources[key] = "pyproject"

    for key, (var, kind) in _KEYS.items():
        if var is not None and var in env:
            values[key] = convert(kind, env[var], f"environment {var}", key, root, from_text=True)
            sources[key] = "env"

    for key, value in (overrides or {}).items():
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ConfigError("command line", key, f"unknown setting (known keys: {known})")
        if value is None:
            continue
        values[key] = convert(
            _KEYS[key][1],
            value,
            "command line",
            key,
            root,
            from_text=isinstance(value, str) and _KEYS[key][1] in _TEXT_KINDS,
        )
        sources[key] = "cli"

    build_dir = values["build_dir"]
    assert isinstance(build_dir, Path)
    problem = build_dir_problem(root, build_dir)
    if problem:
        raise ConfigError(_where("build_dir", sources["build_dir"]), "build_dir", problem)
    compat = values.get("hip_compat_dir")
    if isinstance(compat, Path) and not compat.is_dir():
        raise ConfigError(
            _where("hip_compat_dir", sources["hip_compat_dir"]),
            "hip_compat_dir",
            f"{_rel(compat, root)!r} is not a directory; create it or point the setting "
            "at the project's HIP compat headers",
        )
    # One keyword per setting in _KEYS, each converted to its field's type by convert.
    make: Callable[..., Config] = Config
    return make(
        root=root, local_key=default_local_key(env), sources=MappingProxyType(sources), **values
    )


def source_label(config: Config, key: str) -> str:
    """How a message names the level that set ``key`` in ``config`` (its file or variable)."""
    return _where(key, config.sources.get(key, "default"))


def _where(key: str, source: str) -> str:
    """How a message names the level that set ``key`` (``sources`` spelling in)."""
    if source == "pyproject":
        return "pyproject.toml [tool.metrale-orch]"
    if source == "env":
        return f"environment {_KEYS[key][0]}"
    if source == "cli":
        return "command line"
    return "built-in default"


def build_dir_problem(root: Path, build_dir: Path) -> str:
    """Why ``build_dir`` cannot hold the build of the project at ``root``, or "" (I/O:
    resolves symlinks). The build writes, stages and deletes there, so it may not be
    the root, ``kernels/``, inside ``kernels/``, or contain ``kernels/``, nor be (or lie
    under) a file."""
    where = Path(os.path.realpath(build_dir))
    top = Path(os.path.realpath(root))
    kernels = Path(os.path.realpath(top / "kernels"))
    shown = repr(_rel(build_dir, root))
    if where == top:
        return f"{shown} is the project root; the build needs its own directory (e.g. build/)"
    if where == kernels:
        return (
            f"{shown} is the kernel tree (kernels/); the build would overwrite and delete "
            "kernel sources: choose a directory outside it (e.g. build/)"
        )
    if where.is_relative_to(kernels):
        return (
            f"{shown} lies inside the kernel tree (kernels/); build outputs would become "
            "tree files: choose a directory outside it (e.g. build/)"
        )
    if kernels.is_relative_to(where):
        return (
            f"{shown} contains the kernel tree (kernels/); cleaning the build would delete "
            "kernel sources: choose a directory beside it (e.g. build/)"
        )
    existing = next(p for p in (where, *where.parents) if p.exists())  # "/" exists
    if not existing.is_dir():
        what = "is" if existing == where else f"lies under {str(existing)!r},"
        return f"{shown} {what} a file, not a directory: choose a directory (e.g. build/)"
    return ""
