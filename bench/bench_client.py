"""C1: the remote client's CPU per action at 16 to 1,024 actions in flight (issue 45).

    python bench/bench_client.py [--inflight 16,64,256,1024] [--action-seconds 0.5]
        [--waves 2] [--profile OUT.prof]

One event loop runs ``waves x N`` actions through :class:`ReapiBackend`, ``N`` at once,
against the stand-in engine (:mod:`tests.support.reapi_standin`) with ``N`` workers that
sleep ``--action-seconds`` (no CPU), in a process of its own: this process's CPU
(``getrusage(RUSAGE_SELF)``) is the client's alone. The actions are shaped as a build
sends them (:mod:`tests.support.reapi_load`: targets of 8 modules sharing a stage of 20
headers), a fresh engine and client per count, so each target's input root is sent once.
Per count one line (here wrapped)::

    C1 256 in flight: 512 actions in 1.73 s, client CPU 2.9 ms/action (sys 2.1),
        calls 4.1/action, threads 12, engine CPU 1.4 ms/action

``--profile`` writes a cProfile of the client's loop for the last count. Nothing is
asserted (these machines are noisy); say the load (``uptime``) beside the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import cProfile
import re
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from metrale_orch.executor.action import RemoteForm  # noqa: E402
from metrale_orch.executor.reapi import ReapiBackend  # noqa: E402
from metrale_orch.remote import AsyncRemoteClient  # noqa: E402
from metrale_orch.remote.loop import POOL_THREADS  # noqa: E402
from tests.support.reapi_load import run_all, stage_forms  # noqa: E402
from tests.support.reapi_standin import standin_process  # noqa: E402


def threads_now() -> int:
    """This process's threads, as the kernel counts them."""
    found = re.search(r"^Threads:\s+(\d+)", Path("/proc/self/status").read_text(), re.M)
    return int(found.group(1)) if found else 0


async def measure(url: str, forms: list[RemoteForm], inflight: int) -> tuple[float, int]:
    """Run the actions on this loop: (wall seconds, the most threads seen)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(POOL_THREADS))
    backend = ReapiBackend(AsyncRemoteClient(url, streams=inflight))
    peak = threads_now()
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, threads_now())
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    start = time.perf_counter()
    runs = await run_all(backend, forms, limit=inflight)
    wall = time.perf_counter() - start
    done.set()
    await sampler
    await backend.client.aclose()
    if any(r.returncode != 0 for r in runs):
        raise SystemExit("an action failed")
    return wall, peak


def one_count(inflight: int, args: argparse.Namespace, profile: bool) -> str:
    actions = inflight * args.waves
    with (
        tempfile.TemporaryDirectory(prefix="bench-client.") as tmp,
        standin_process(inflight, args.action_seconds) as engine,
    ):
        forms = stage_forms(Path(tmp), actions)  # not measured: the build staged them
        before = resource.getrusage(resource.RUSAGE_SELF)
        prof = cProfile.Profile() if profile else None
        if prof is not None:
            prof.enable()
        wall, threads = asyncio.run(measure(engine.url, forms, inflight))
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)
        after = resource.getrusage(resource.RUSAGE_SELF)
    sys_cpu = after.ru_stime - before.ru_stime
    cpu = after.ru_utime - before.ru_utime + sys_cpu
    return (
        f"C1 {inflight} in flight: {actions} actions in {wall:.2f} s, "
        f"client CPU {cpu / actions * 1e3:.1f} ms/action (sys {sys_cpu / actions * 1e3:.1f}), "
        f"calls {engine.calls / actions:.1f}/action, threads {threads}, "
        f"engine CPU {engine.cpu / max(1, engine.executed) * 1e3:.1f} ms/action"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--inflight", default="16,64,256,1024")
    ap.add_argument("--action-seconds", type=float, default=0.5)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--profile", default="")
    args = ap.parse_args()
    counts = [int(n) for n in args.inflight.split(",")]
    print(f"threads at start: {threading.active_count()}", flush=True)
    for i, inflight in enumerate(counts):
        last = i == len(counts) - 1
        print(one_count(inflight, args, profile=bool(args.profile) and last), flush=True)


if __name__ == "__main__":
    main()
