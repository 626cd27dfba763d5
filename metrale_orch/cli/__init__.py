"""The ``metrale-orch`` command line.

``main`` is a one-screen pipeline: parse, find the root, dispatch to a
sub-command, turn any package error into one clear line and an exit code.
Each group of sub-commands lives in a private module (``_layout``,
``_defaults``, ``_build``, ``_compdb``, ``_profile``, ``_cache``, ``_matrix``,
``_resources``, ``_coverage``, ``_sass``, ``_size``, ``_remote``, ``_whymiss``,
``_doit``, ``_watch``) exposing
``register(subparsers)``; a sub-command is a function
``(args, ctx) -> int``. This package and the doit reporter are the only
places that print.

Every command reads its configuration the same way (:func:`~metrale_orch.config.load_config`:
``pyproject.toml`` < environment < ``--set``) and checks it before anything else, so a
bad value or a broken ``pyproject.toml`` is one line and exit 2 whatever the command;
each then asks ``ctx.config()`` for the same value.

Exit codes: 0 ok, 1 failure (a build or check that ran and failed), 2 usage
or tree error; 130 for Ctrl-C and 143 for SIGTERM, each with one line
(``interrupted``), never a traceback. Messages are shown with
:func:`~metrale_orch.errors.printable`, so a file name that is not UTF-8
never turns an error into a crash.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from metrale_orch.cli import (
    _build,
    _cache,
    _compdb,
    _coverage,
    _defaults,
    _doit,
    _layout,
    _matrix,
    _profile,
    _remote,
    _resources,
    _sass,
    _size,
    _watch,
    _whymiss,
)
from metrale_orch.config import Config, find_root, load_config
from metrale_orch.errors import (
    MetraleError,
    UsageError,
    install_sigterm_handler,
    interrupt_exit_code,
    printable,
)

__all__ = ["Context", "main"]


@dataclass(slots=True)
class Context:
    """What a sub-command may touch: the root, the environment and two streams."""

    root: Path
    environ: Mapping[str, str]
    out: TextIO
    err: TextIO
    debug: bool = False
    #: ``--set KEY=VALUE`` settings: the command line, above pyproject and environment.
    overrides: Mapping[str, str] = field(default_factory=dict)
    _config: Config | None = None

    def config(self) -> Config:
        """The project's configuration (loaded once; raises ``ConfigError``)."""
        if self._config is None:
            self._config = load_config(self.root, self.environ, self.overrides)
        return self._config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metrale-orch",
        description="Build orchestrator for GPU kernel trees.",
    )
    parser.add_argument(
        "--root",
        type=Path,
        help="project root (the directory holding kernels/); default: $METRALE_ORCH_ROOT, "
        "else the nearest ancestor of the current directory with dodo.py or kernels/",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a [tool.metrale-orch] setting for this command (e.g. --set "
        "cache_mode=off); the command line outranks pyproject.toml and the environment",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        _layout,
        _defaults,
        _build,
        _compdb,
        _profile,
        _cache,
        _matrix,
        _resources,
        _coverage,
        _sass,
        _size,
        _remote,
        _whymiss,
        _doit,
        _watch,
    ):
        module.register(sub)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run the CLI; returns the exit code (tests call this directly)."""
    env = os.environ if environ is None else environ
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    try:
        root = _root(args.root, env)
        overrides = _parse_settings(args.settings)
    except UsageError as exc:
        print(printable(f"error: {exc}"), file=err)
        return exc.exit_code
    # Resolved, as doit sees its working directory: the configuration is that of the run.
    ctx = Context(
        root=root.resolve(), environ=env, out=out, err=err, debug=args.debug, overrides=overrides
    )
    install_sigterm_handler()  # SIGTERM ends a command as Ctrl-C does: one line, 143
    try:
        ctx.config()  # every command: a bad setting is refused before its own arguments
        code: int = args.run(args, ctx)
        return code
    except MetraleError as exc:
        if args.debug:
            traceback.print_exc(file=err)
        print(printable(f"error: {exc}"), file=err)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print("interrupted", file=err)
        return interrupt_exit_code(exc)
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still one line unless --debug
        if args.debug:
            traceback.print_exc(file=err)
        else:
            print(
                printable(
                    f"internal error: {type(exc).__name__}: {exc} "
                    "(run with --debug for a traceback)"
                ),
                file=err,
            )
        return 1


def _root(given: Path | None, env: Mapping[str, str]) -> Path:
    """The project root: ``--root``, else ``$METRALE_ORCH_ROOT``, else the nearest ancestor
    of the working directory with ``dodo.py`` or ``kernels/``. Raises ``UsageError`` for a
    root named that is not a directory (every command: a typo is no empty project)."""
    if given is None and not env.get("METRALE_ORCH_ROOT"):
        return find_root(Path.cwd())
    root, named = (
        (given, "--root")
        if given is not None
        else (Path(env["METRALE_ORCH_ROOT"]), "METRALE_ORCH_ROOT")
    )
    if not root.is_dir():
        raise UsageError(f"{named} {root}: not a directory")
    return root


#: What a setting's name looks like (only such a word of a bad ``--set`` is shown).
_SETTING_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")


def _parse_settings(items: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings to a mapping; the last of a repeated key wins."""
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # Only a name is quoted: the rest may be a secret (a key, a header value).
            name = re.split(r"[=:\s]", item, maxsplit=1)[0]
            shown = f" {name!r}" if _SETTING_NAME.fullmatch(name) else ""
            raise UsageError(
                f"--set{shown}: expected KEY=VALUE, e.g. --set cache_mode=off (the value "
                "is not shown)"
            )
        settings[key.strip()] = value
    return settings
