"""What the REAPI test stack stands on: the BuildGrid venv and a PostgreSQL cluster.

- :func:`buildgrid_venv`: ``$METRALE_BUILDGRID_VENV``, else
  ``<metrale-orch cache>/test-buildgrid-0.4.4``, made when missing with ``venv`` + ``pip
  install "buildgrid[database]==0.4.4"`` (~25 s) in a temporary directory renamed into place,
  so a killed run leaves no half venv (a ``.metrale-ready`` marker is written last). Run
  BuildGrid from it as ``python -c`` (:data:`BGD`): its console scripts name the temporary path;
- :func:`postgres_cluster`: ``initdb`` + ``pg_ctl`` (run as ``postgres`` when root, which
  PostgreSQL requires), 127.0.0.1 on a free port, ``fsync=off``, its unix socket in its own
  temporary directory; stopped with ``pg_ctl stop -m immediate``, then SIGKILL to the
  postmaster's PID if it is still there. BuildGrid's schema is migrated once per cluster into
  a template database; :meth:`PostgresCluster.buildgrid_database` copies it (``createdb -T``,
  0.07 s, instead of a 1.7 s ``bgd migrate apply``).

Both raise :class:`StackUnavailable` when this machine cannot have them (no PyPI, no
PostgreSQL): the fixtures turn that into a skip, or a failure on CI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from metrale_orch.config import default_local_cache

__all__ = [
    "BGD",
    "BGD_SERVER",
    "BUILDGRID_VERSION",
    "VENV_ENV",
    "PostgresCluster",
    "StackUnavailable",
    "buildgrid_venv",
    "free_port",
    "log_tail",
    "postgres_cluster",
]

BUILDGRID_VERSION = "0.4.4"
#: The environment variable naming a BuildGrid venv to use (made there when missing).
VENV_ENV = "METRALE_BUILDGRID_VENV"
#: ``python -c BGD ARGS...`` in the venv runs ``bgd ARGS...``.
BGD = "import sys; from buildgrid.server.app import cli; sys.argv[0] = 'bgd'; sys.exit(cli())"
#: :data:`BGD` for ``server start``: BuildGrid 0.4.4 checks its own schema against the JSON
#: Schema metaschema before each of its 12 validations (``jsonschema.validate``), 1.2 s of a
#: 2.9 s start. This validates the config the same way, without re-checking the schema
#: (``tests/scenarios/remote/test_reapi_stack.py`` checks a bad config is still refused).
BGD_SERVER = (
    "import jsonschema\n"
    "def _validate(instance, schema, cls=None, *args, **kwargs):\n"
    "    cls = cls or jsonschema.validators.validator_for(schema)\n"
    "    errors = cls(schema, *args, **kwargs).iter_errors(instance)\n"
    "    error = jsonschema.exceptions.best_match(errors)\n"
    "    if error is not None:\n"
    "        raise error\n"
    "jsonschema.validate = _validate\n"
) + BGD


class StackUnavailable(Exception):
    """A prerequisite of the stack is missing here (PyPI, PostgreSQL); ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- small helpers --------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 free a moment ago (the pattern of ``servers.refused_endpoint``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a log, for error messages."""
    return "\n".join(text.splitlines()[-lines:])


# -- the BuildGrid venv ---------------------------------------------------------------------------


def buildgrid_venv(environ: Mapping[str, str], *, timeout: float = 600.0) -> Path:
    """The BuildGrid venv's directory, made first when missing.

    Raises :class:`StackUnavailable` when it cannot be made (no PyPI, pip failed).
    """
    given = environ.get(VENV_ENV)
    venv = (
        Path(given)
        if given
        else default_local_cache(environ) / f"test-buildgrid-{BUILDGRID_VERSION}"
    )
    if _venv_ready(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(venv)
    prefix = f".{venv.name}.partial-{os.getpid()}-"
    build = Path(tempfile.mkdtemp(prefix=prefix, dir=venv.parent))
    try:
        _make_venv(build, venv, timeout)
        try:
            os.rename(build, venv)
        except OSError:
            if not _venv_ready(venv):  # not a concurrent run that finished first
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return venv


def _make_venv(build: Path, venv: Path, timeout: float) -> None:
    """``venv`` + ``pip install`` into ``build``; the ready marker last."""
    pip = [str(build / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    for argv in (
        [sys.executable, "-m", "venv", str(build)],
        [*pip, "--disable-pip-version-check", f"buildgrid[database]=={BUILDGRID_VERSION}"],
    ):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StackUnavailable(
                f"making the BuildGrid venv at {venv} timed out after {timeout:g} s: {argv}"
            ) from None
        if done.returncode != 0:
            raise StackUnavailable(
                f"cannot make the BuildGrid venv at {venv} ({' '.join(argv[:4])} ... exited "
                f"{done.returncode}; is PyPI reachable?):\n{log_tail(done.stderr, 10)}"
            )
    (build / ".metrale-ready").write_text(f"buildgrid[database]=={BUILDGRID_VERSION}\n")


def _remove_stale_partials(venv: Path) -> None:
    """Remove what killed runs left (``.<name>.partial-<pid>-*`` of a PID no longer alive)."""
    for partial in venv.parent.glob(f".{venv.name}.partial-*"):
        pid = partial.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(partial, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _venv_ready(venv: Path) -> bool:
    if (venv / ".metrale-ready").is_file():
        return True
    # A venv made by hand (``METRALE_BUILDGRID_VENV`` pointing at it) has no marker.
    return (venv / "bin" / "python").exists() and any(
        (venv / "lib").glob(f"python3*/site-packages/buildgrid-{BUILDGRID_VERSION}.dist-info")
    )


# -- PostgreSQL -----------------------------------------------------------------------------------


def _postgres_bin() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``createdb`` of one PostgreSQL version."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    raise StackUnavailable(
        "PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin): "
        "BuildGrid's scheduler needs it (apt-get install postgresql)"
    )


@dataclass(slots=True)
class PostgresCluster:
    """A running PostgreSQL cluster of the tests: 127.0.0.1:``port``, user ``postgres``."""

    bin_dir: Path
    base: Path
    port: int
    _template_ready: bool = False

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL BuildGrid 0.4.4 wants (``postgresql+psycopg2://``)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"

    def pid(self) -> int | None:
        """The postmaster's PID (first line of ``postmaster.pid``), None when it is not running."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def _run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            _as_postgres([str(self.bin_dir / argv[0]), *argv[1:]]),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.base,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {done.returncode}:\n{log_tail(done.stderr)}")
        return done

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create database ``name`` (a copy of ``template`` when given); its URL."""
        argv = ["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        if template:
            argv += ["-T", template]
        self._run([*argv, name])
        return self.url(name)

    def buildgrid_database(self, venv: Path, name: str) -> str:
        """A new database with BuildGrid's schema (a copy of a template migrated once); its URL."""
        if not self._template_ready:
            url = self.create_database("bgd_template")
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-c", BGD, "migrate", "apply", url],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"bgd migrate apply failed:\n{log_tail(done.stdout + done.stderr)}"
                )
            self._template_ready = True
        return self.create_database(name, template="bgd_template")

    def stop(self) -> None:
        """``pg_ctl stop -m immediate``; SIGKILL to the postmaster if that did not do it."""
        pid = self.pid()
        with contextlib.suppress(Exception):
            self._run(["pg_ctl", "stop", "-D", str(self.data_dir), "-m", "immediate", "-w"], 15)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as ``postgres`` then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A fresh PostgreSQL cluster in a temporary directory, stopped and removed on exit.

    Raises :class:`StackUnavailable` when PostgreSQL is not installed.
    """
    bin_dir = _postgres_bin()
    base = Path(tempfile.mkdtemp(prefix="metrale-pg-"))
    cluster = PostgresCluster(bin_dir=bin_dir, base=base, port=0)
    try:
        if os.geteuid() == 0:
            shutil.chown(base, "postgres")
        cluster._run(
            ["initdb", "-D", str(cluster.data_dir), "-A", "trust", "-U", "postgres", "--no-sync"]
        )
        for attempt in range(3):
            cluster.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={cluster.port} -c fsync=off "
                f"-c unix_socket_directories={base} -c full_page_writes=off"
            )
            try:
                cluster._run(
                    [
                        "pg_ctl",
                        "start",
                        "-D",
                        str(cluster.data_dir),
                        "-l",
                        str(base / "postgres.log"),
                        "-w",
                        "-o",
                        options,
                    ]
                )
                break
            except RuntimeError:
                if attempt == 2:  # a port taken between the probe and the bind: try another
                    raise
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
