"""``metrale-orch remote platform|check``: set up workers for remote execution, and try one.

``platform [HW]`` prints, one ``key=value`` a line, the platform properties a worker
must advertise to run a hardware's compiles (the scheduler's and the workers'
configurations are written from them). ``check [HW]`` sends one tiny real compile
with that hardware's toolchain to ``remote_executor`` and says where it ran, how long
it took, and what is wrong when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from metrale_orch.errors import UsageError
from metrale_orch.fsutil import bytes_hash
from metrale_orch.paths import STATE_DIR

if TYPE_CHECKING:
    from metrale_orch.cli import Context
    from metrale_orch.executor.action import RemoteForm
    from metrale_orch.executor.offload import RemoteRun
    from metrale_orch.executor.reapi import ReapiBackend
    from metrale_orch.toolchain.probe import FoundToolchain

_HW_HELP = "hardware tree under kernels/ (default: the first by name)"

#: The kernel ``remote check`` compiles.
_CHECK_SOURCE = 'extern "C" __global__ void metrale_remote_check(float* x) { x[0] += 1.0f; }\n'


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``remote`` with ``platform`` and ``check``."""
    p = sub.add_parser(
        "remote",
        help="remote execution: the platform a worker needs, and an end-to-end check",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    actions = p.add_subparsers(dest="remote_command", metavar="ACTION", required=True)
    plat = actions.add_parser(
        "platform",
        help="print the platform properties a worker must advertise (key=value a line)",
    )
    plat.add_argument(
        "hardware", nargs="?", metavar="HW", help="hardware tree (default: the first)"
    )
    plat.set_defaults(run=_platform)
    check = actions.add_parser(
        "check", help="run one tiny compile on remote_executor and say where and how long"
    )
    check.add_argument(
        "hardware", nargs="?", metavar="HW", help="hardware tree (default: the first)"
    )
    check.set_defaults(run=_check)


def _found(ctx: Context, hw: str | None) -> tuple[str, str, FoundToolchain]:
    """(hardware, arch, its toolchain found and probed here); raises for a bad name."""
    from metrale_orch.toolchain.definitions import load_toolchains, select_toolchain
    from metrale_orch.toolchain.probe import find_toolchain
    from metrale_orch.tree.snapshot import TreeSnapshot

    snap = TreeSnapshot(ctx.root)
    names = sorted(p.parent.name for p in (ctx.root / "kernels").glob("*/HARDWARE.toml"))
    if not names:
        raise UsageError(f"{ctx.root / 'kernels'} has no hardware tree (*/HARDWARE.toml)")
    name = hw or names[0]
    if name not in names:
        raise UsageError(f"no hardware {name!r} in kernels/ (there are: {', '.join(names)})")
    hardware = snap.hardware(name)
    tc = select_toolchain(hardware, load_toolchains(ctx.root))
    config = ctx.config()
    found = find_toolchain(
        tc, ctx.environ, state_dir=config.build_dir / STATE_DIR, arch=hardware.arch or ""
    )
    return name, hardware.arch or "", found


def _platform(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.steps.remote_form import platform_properties

    _, _, found = _found(ctx, args.hardware)
    props = platform_properties(
        found.toolchain.name, found.identity, ctx.config().remote_container_image
    )
    for key, value in props.items():
        print(f"{key}={value}", file=ctx.out)
    return 0


async def _check_once(backend: ReapiBackend, form: RemoteForm) -> RemoteRun:
    """The check's one action on a loop of its own, its channels closed after it."""
    try:
        return await backend.run(form, timeout=120.0)
    finally:
        await backend.client.aclose()


def _check(args: argparse.Namespace, ctx: Context) -> int:
    from metrale_orch.executor.offload import RemoteUnavailable
    from metrale_orch.executor.reapi import open_backend
    from metrale_orch.steps.remote_form import OUT_DIR, remote_form
    from metrale_orch.toolchain.argv import compile_argv

    config = ctx.config()
    if not config.remote_executor:
        raise UsageError(
            "remote_executor is not set: set it in pyproject.toml [tool.metrale-orch], "
            "METRALE_ORCH_REMOTE_EXECUTOR or --set remote_executor=grpc://host:port"
        )
    name, arch, found = _found(ctx, args.hardware)
    tc = found.toolchain
    with tempfile.TemporaryDirectory(prefix="metrale-remote-check.") as tmp:
        top = Path(tmp)
        # A fresh comment each time: a new action, so a worker runs it (no cached answer).
        source = f"// metrale-orch remote check {time.time_ns()}\n{_CHECK_SOURCE}".encode()
        (top / "check.cu").write_bytes(source)
        out_rel = f"{OUT_DIR}/check/check.{tc.output}"
        argv = compile_argv(
            tc, program=str(found.program), arch=arch, flags=(), include=".",
            source="check.cu", output=out_rel,
        )  # fmt: skip
        local = top / f"check.{tc.output}"
        form = remote_form(
            root=top, files={"check.cu": bytes_hash(source)}, cwd="", argv=argv,
            outputs={out_rel: local}, toolchain=tc, identity=found.identity,
            environ=ctx.environ, allowed=(*found.roots, *found.system_dirs),
            container_image=config.remote_container_image,
        )  # fmt: skip
        backend = open_backend(config)
        start = time.perf_counter()
        try:
            run = asyncio.run(_check_once(backend, form))
        except RemoteUnavailable as exc:
            print(f"remote check: {config.remote_executor}: FAILED: {exc.reason}", file=ctx.err)
            return 1
        wall = time.perf_counter() - start
        if run.returncode != 0 or not run.outputs.get(local):
            print(
                f"remote check: {config.remote_executor}: the compile failed there "
                f"(exit {run.returncode}): {(run.stderr or run.stdout).strip()[:400]}",
                file=ctx.err,
            )
            return 1
        stages = ", ".join(f"{k} {b - a:.2f} s" for k, (a, b) in run.stages.items())
        where = "the action cache answered" if run.cached else f"ran on {run.worker or 'a worker'}"
        print(
            f"remote check: {config.remote_executor} ok: {name}'s {tc.name} compile {where} "
            f"in {wall:.2f} s" + (f" ({stages})" if stages else ""),
            file=ctx.out,
        )
    return 0
