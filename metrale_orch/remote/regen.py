"""Regenerate the checked-in protobuf and gRPC stubs of :mod:`metrale_orch.remote._proto`.

Run ``python -m metrale_orch.remote.regen`` after changing a file under
``_proto/source/`` (``--check`` only compares and exits 1 on a difference; the
test suite runs that comparison). It needs the pinned grpcio-tools
(:data:`GRPCIO_TOOLS`, the ``dev`` and ``test`` extras); any other version is
refused, as its protoc writes different code.

Only the files googleapis-common-protos lacks are generated (:data:`GENERATED`):
the ``google.api``, ``google.rpc`` and ``google.longrunning`` modules come from
that package at run time, and a second registration of those ``.proto`` files
with different contents fails in protobuf's default pool (see
``_proto/source/README.md``). Their sources are vendored only as imports for
protoc. Generated modules get flat names in ``_proto`` (``remote_execution_pb2``,
never a top-level ``build`` package), with their imports of one another
rewritten to match; the ``.proto`` file and message names stay upstream's.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from metrale_orch.errors import MetraleError

__all__ = ["GENERATED", "GRPCIO_TOOLS", "RegenError", "compare", "generate", "main"]

#: The grpcio-tools that wrote the checked-in stubs (pyproject's ``dev``/``test`` pin).
GRPCIO_TOOLS = "1.85.1"

PROTO_PACKAGE = "metrale_orch.remote._proto"
PROTO_DIR = Path(__file__).resolve().parent / "_proto"
SOURCE_DIR = PROTO_DIR / "source"

#: .proto file -> (flat module stem, whether it declares services).
GENERATED: Mapping[str, tuple[str, bool]] = {
    "build/bazel/semver/semver.proto": ("semver", False),
    "build/bazel/remote/execution/v2/remote_execution.proto": ("remote_execution", True),
    "google/bytestream/bytestream.proto": ("bytestream", True),
    "google/devtools/remoteworkers/v1test2/worker.proto": ("worker", False),
    "google/devtools/remoteworkers/v1test2/bots.proto": ("bots", True),
}

_HEADER = f"# Written by metrale_orch/remote/regen.py (grpcio-tools {GRPCIO_TOOLS}); do not edit.\n"


class RegenError(MetraleError):
    """The stubs cannot be regenerated (wrong or missing grpcio-tools, protoc failed)."""

    exit_code = 1


def generate(out: Path) -> list[Path]:
    """Write every stub into ``out`` (flat, imports rewritten); returns the files written.

    Raises :class:`RegenError` without the pinned grpcio-tools or when protoc fails.
    """
    protoc, include = _protoc()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metrale-regen-") as tmp:
        raw = Path(tmp)
        argv = [
            "grpc_tools.protoc",
            f"-I{SOURCE_DIR}",
            f"-I{include}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *GENERATED,
        ]
        if protoc(argv) != 0:
            raise RegenError(f"protoc failed on {SOURCE_DIR} (its messages are above)")
        return [_place(raw, proto, out, suffix) for proto, suffix in _outputs()]


def compare(generated: Path, checked_in: Path = PROTO_DIR) -> list[str]:
    """Names of stub files that differ between the two directories, or exist in only one."""
    names = {p.name for d in (generated, checked_in) for p in d.glob("*_pb2*.py*")}
    return sorted(
        name
        for name in names
        if not (generated / name).is_file()
        or not (checked_in / name).is_file()
        or (generated / name).read_bytes() != (checked_in / name).read_bytes()
    )


def _protoc() -> tuple[Callable[[list[str]], int], Path]:
    try:
        found = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        raise RegenError(
            f"regenerating the REAPI stubs needs grpcio-tools=={GRPCIO_TOOLS}: "
            "pip install -e '.[dev]'"
        ) from None
    if found != GRPCIO_TOOLS:
        raise RegenError(
            f"regenerating the REAPI stubs needs grpcio-tools=={GRPCIO_TOOLS}, not {found} "
            "(another protoc writes other code): pip install -e '.[dev]'"
        )
    import grpc_tools
    from grpc_tools import protoc

    main: Callable[[list[str]], int] = protoc.main
    return main, Path(grpc_tools.__file__).parent / "_proto"


def _outputs() -> list[tuple[str, str]]:
    """(proto, output suffix) of every file kept: messages and stubs; services' gRPC code."""
    kept = []
    for proto, (_stem, services) in GENERATED.items():
        kept += [(proto, "_pb2.py"), (proto, "_pb2.pyi")]
        if services:
            kept.append((proto, "_pb2_grpc.py"))
    return kept


def _module(proto: str) -> str:
    """The dotted module protoc names for ``proto`` (``build.bazel.semver.semver``)."""
    return proto.removesuffix(".proto").replace("/", ".")


def _place(raw: Path, proto: str, out: Path, suffix: str) -> Path:
    stem = GENERATED[proto][0]
    text = (raw / (proto.removesuffix(".proto") + suffix)).read_text(encoding="utf-8")
    text = _HEADER + _rewrite_imports(text)
    target = out / f"{stem}{suffix}"
    target.write_text(text, encoding="utf-8")
    return target


def _rewrite_imports(text: str) -> str:
    """Point the stubs' imports of one another at the flat private modules."""
    for proto, (stem, _services) in GENERATED.items():
        package, _, module = _module(proto).rpartition(".")
        pattern = rf"^from {re.escape(package)} import {re.escape(module)}_pb2\b"
        text = re.sub(pattern, f"from {PROTO_PACKAGE} import {stem}_pb2", text, flags=re.M)
    left = re.search(r"^(?:from|import) (?:build|google\.(?:bytestream|devtools))\.\S*", text, re.M)
    if left:
        raise RegenError(f"an import of a generated module was not rewritten: {left.group()}")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metrale_orch.remote.regen")
    parser.add_argument(
        "--check", action="store_true", help="compare with the checked-in stubs; write nothing"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            with tempfile.TemporaryDirectory(prefix="metrale-regen-") as tmp:
                generate(Path(tmp))
                stale = compare(Path(tmp))
            if stale:
                print("stale stubs (run python -m metrale_orch.remote.regen):", *stale)
                return 1
            return 0
        written = generate(PROTO_DIR)
        for path in sorted(set(PROTO_DIR.glob("*_pb2*.py*")) - set(written)):
            path.unlink()  # a module no longer generated
        for path in written:
            print(path.relative_to(PROTO_DIR.parents[2]))
    except RegenError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
