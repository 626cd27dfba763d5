"""Many remote actions at once, shaped as a build sends them: targets of a few modules each,
every module of a target sharing its stage (the same file mapping, so the same input root),
each module compiling its own source to its own output.

:func:`stage_forms` writes the stages under a directory and returns the forms;
:func:`run_all` runs them all at once on the running loop through one backend. The
thread-count test and ``bench/bench_client.py`` share them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import xxhash

from metrale_orch.executor.action import RemoteForm
from metrale_orch.executor.offload import RemoteBackend, RemoteRun

__all__ = ["run_all", "stage_forms"]

#: A header's body besides its define (~1 KiB, as a small real header): a stage's headers
#: are then more than the client sends without asking FindMissingBlobs first.
PADDING = "// " + "x" * 1000 + "\n"


def stage_forms(
    top: Path, actions: int, *, per_target: int = 8, headers: int = 20
) -> list[RemoteForm]:
    """``actions`` forms in targets of ``per_target`` modules, each target's stage holding
    ``headers`` shared headers (~1 KiB each, the same in every target) and one source per
    module (written under ``top``)."""
    forms: list[RemoteForm] = []
    for target in range(-(-actions // per_target)):
        stage = top / f"t{target}"
        (stage / "include").mkdir(parents=True)
        (stage / "out").mkdir()
        files: dict[str, str] = {}
        for i in range(headers):
            data = f"#define H{i} {i}  // shared by every target\n{PADDING}".encode()
            (stage / f"include/h{i}.h").write_bytes(data)
            files[f"include/h{i}.h"] = xxhash.xxh3_128(data).hexdigest()
        modules = range(min(per_target, actions - len(forms)))
        for m in modules:
            data = f'#include "h0.h"\n__global__ void k{target}_{m}() {{}}\n'.encode()
            (stage / f"m{m}.cu").write_bytes(data)
            files[f"m{m}.cu"] = xxhash.xxh3_128(data).hexdigest()
        for m in modules:  # every module of the target: the one mapping object
            forms.append(
                RemoteForm(
                    root=stage,
                    files=files,
                    cwd="",
                    argv=("nvcc", "--ptx", "-arch=sm_90a", "-Iinclude", f"m{m}.cu", "-o",
                          f"out/m{m}.ptx"),
                    env={"PATH": "/usr/bin:/bin"},
                    outputs={f"out/m{m}.ptx": stage / "out" / f"m{m}.ptx"},
                    platform={"OSFamily": "linux"},
                )
            )  # fmt: skip
    return forms


async def run_all(
    backend: RemoteBackend, forms: list[RemoteForm], *, limit: int = 0
) -> list[RemoteRun]:
    """Every form's ``backend.run`` on the running loop, at most ``limit`` at once (0: all
    at once), in the forms' order."""
    room = asyncio.Semaphore(limit or len(forms) or 1)

    async def one(form: RemoteForm) -> RemoteRun:
        async with room:
            return await backend.run(form, timeout=600.0)

    return await asyncio.gather(*(one(f) for f in forms))
