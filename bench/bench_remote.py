"""X1-X3: remote execution and the REAPI tier (issue 20), against peers in the same run.

    python bench/bench_remote.py x1 [OUT] [--remote-jobs N]
    python bench/bench_remote.py x2 [OUT] [--workers 1,4,16] [--scale 0.1] [--action-seconds 0.2]
    python bench/bench_remote.py x2 [OUT] --simulated --workers 16,64,256 [--action-seconds 0.2]
        [--scale 1.0] [--before DIR] [--profile]
    python bench/bench_remote.py x3 [OUT]

X1  the sample tree cold (cache off): ``doit build`` with local ``jobs = 2`` against the same
    build sent to a BuildGrid 0.4.4 engine with 2 test workers on this machine (real nvcc
    both ways): the wall times and the overhead per action.
X2  the real-shaped tree (``bench/gen_tree.py --profile real --scale``) with a fake compiler
    that sleeps ``--action-seconds`` seconds, cache off, remote with 1, 4, 16 workers (a fresh
    engine each, so nothing comes from its action cache): the build time against the ideal
    ``distinct compiles x sleep / workers``. With ``--simulated`` the engine is the stand-in
    (:mod:`tests.support.reapi_standin`, threads of this process): workers that sleep the
    action seconds without CPU and return the declared outputs, so the client is what is
    measured; per worker count a line ``X2 simulated 16 workers: 41.2 s, ideal 32.2 s,
    1.28x, client CPU 0.9 ms/action`` and one of counts, ending with the engine's CPU per
    action (this process's), the most threads the ``doit`` process held and the engine's
    calls per action. Client CPU (here and in X1) is ``getrusage`` of the
    ``doit`` process (``RUSAGE_CHILDREN``) over the actions that ran remotely.
X3  warm rebuilds of the sample tree (a fresh checkout, an empty build directory, every
    module a hit) from the local tier, from S3 (moto) and from a REAPI action cache
    (BuildGrid's CAS + action cache), each filled by one cold build first.

Prints each measurement and its ratio; nothing is asserted (these machines are noisy).
The engine and the servers run on this machine, sharing its cores with the build.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))
from bench_noop import FAKECC, TOOLCHAIN  # noqa: E402
from bench_parallel import KEEP_TRASH_HELP, TRASH, clean, empty_trash, env_for  # noqa: E402  (cache off, ...)

from metrale_orch.steps.remote_form import platform_properties  # noqa: E402
from metrale_orch.toolchain.definitions import builtin_toolchains, load_toolchains  # noqa: E402
from metrale_orch.toolchain.probe import find_toolchain  # noqa: E402
from tests.support.reapi import ReapiStack, StackOptions, reapi_stack  # noqa: E402
from tests.support.reapi_deps import PostgresCluster, postgres_cluster  # noqa: E402

PY = sys.executable
#: The real-shaped tree's scale for ``x2 --simulated`` (2,573 distinct compiles at 1.0).
SIMULATED_SCALE = 1.0
DODO = "from metrale_orch.dodo import *  # noqa: F403\n"


def checkout(out: Path, name: str) -> Path:
    root = out / name
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(REPO / "kernels", root / "kernels")
    (root / "dodo.py").write_text(DODO)
    return root


class Timed(NamedTuple):
    """One measured run: wall seconds, its output, and the CPU seconds (user + system) of
    the process and what it waited for (``getrusage(RUSAGE_CHILDREN)``): the client's own,
    never the engine's (servers here are threads of this process, or not waited for)."""

    seconds: float
    text: str
    cpu: float
    #: Of ``cpu``, the kernel's part (system time).
    sys: float
    #: The most threads the process held at once (``Threads:`` of ``/proc/<pid>/status``,
    #: sampled every 0.1 s).
    threads: int = 0
    #: CPU seconds of this process meanwhile (``RUSAGE_SELF``): an engine on its threads.
    own_cpu: float = 0.0


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> Timed:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    with subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        text: list[str] = []
        reader = threading.Thread(target=lambda: text.append(proc.stdout.read()))  # type: ignore[union-attr]
        reader.start()
        # Threads sampled beside the wait: polling the exit every 0.1 s added 0-0.1 s to
        # every time (X3's were all n.n1 s).
        most, done = [0], threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                most[0] = max(most[0], threads_of(proc.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        proc.wait()
        took = time.perf_counter() - start
        done.set()
        sampler.join()
        reader.join()
    threads = most[0]
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine = resource.getrusage(resource.RUSAGE_SELF)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {cwd}:\n{''.join(text)}")
    sys = after.ru_stime - before.ru_stime
    own_cpu = mine.ru_utime + mine.ru_stime - own.ru_utime - own.ru_stime
    cpu = after.ru_utime - before.ru_utime + sys
    return Timed(took, "".join(text), cpu, sys, threads, own_cpu)


def threads_of(pid: int) -> int:
    """How many threads process ``pid`` has now (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^Threads:\s+(\d+)", status, re.M)
    return int(found.group(1)) if found else 0


def line_of(text: str, prefix: str) -> str:
    return next((ln for ln in text.splitlines() if ln.startswith(prefix)), "")


def offering(root: Path, hw_arch: str = "sm_90a") -> dict[str, tuple[str, ...]]:
    """The platform this machine's nvcc (or the tree's toolchain) needs, as a worker offers it."""
    tcs = load_toolchains(root) if (root / "toolchains").is_dir() else builtin_toolchains()
    found = find_toolchain(tcs["nvcc"], os.environ, arch=hw_arch)
    return {k: (v,) for k, v in platform_properties("nvcc", found.identity).items()}


@contextlib.contextmanager
def engine(
    pg: PostgresCluster, workers: int, props: dict[str, tuple[str, ...]]
) -> Iterator[ReapiStack]:
    options = StackOptions(workers=0, keepalive_s=4.0)
    with reapi_stack(options, postgres=pg) as stack:
        for _ in range(workers):
            stack.start_worker(props, wait=False)
        for worker in stack.workers:
            worker.wait_event("registered", timeout=60)
        yield stack


def remote_env(out: Path, stack: ReapiStack, **extra: str) -> dict[str, str]:
    return env_for(
        out,
        METRALE_ORCH_REMOTE_EXECUTOR=stack.url,
        METRALE_ORCH_REMOTE_INSTANCE=stack.instance,
        **extra,
    )


def ran_remotely(text: str) -> int:
    found = re.search(r"remote: (\d+) ran remotely", text)
    return int(found.group(1)) if found else 0


def x1(args: argparse.Namespace) -> None:
    out: Path = args.out
    root = checkout(out, "sample-local")
    local = timed([PY, "-m", "doit", "build"], root, env_for(out, METRALE_ORCH_JOBS="2"))
    compiles = compiles_of(root)
    print(f"X1 the sample tree cold: {compiles} compiles (load {os.getloadavg()[0]:.2f})")
    print(
        f"  local, jobs 2:            {local.seconds:6.2f} s   ({line_of(local.text, 'build: ')})"
    )
    with postgres_cluster() as pg, engine(pg, 2, offering(REPO)) as stack:
        root = checkout(out, "sample-remote")
        # BuildGrid here serves 64 calls at once (its thread pool): the remote window starts
        # at 16 Execute streams and grows only while workers take actions at once, so the
        # default remote_jobs (unset) leaves the workers' own calls room (issue 45).
        jobs = {"METRALE_ORCH_REMOTE_JOBS": str(args.remote_jobs)} if args.remote_jobs else {}
        env = remote_env(out, stack, **jobs)
        remote = timed([PY, "-m", "doit", "build"], root, env)
    said = line_of(remote.text, "remote: ")
    jobs_said = f"remote_jobs {args.remote_jobs}" if args.remote_jobs else "remote_jobs unset"
    print(f"  remote, 2 workers, {jobs_said}: {remote.seconds:6.2f} s   ({said})")
    per = (remote.seconds - local.seconds) / max(1, compiles) * 2  # two in flight either way
    ran = ran_remotely(remote.text)
    print(
        f"  ratio {remote.seconds / local.seconds:.2f}x; overhead {per * 1000:.0f} ms per action "
        f"(2 at a time); client CPU {remote.cpu / max(1, ran) * 1000:.1f} ms/action "
        f"({remote.cpu:.2f} s for {ran} remote actions)"
    )


def compiles_of(root: Path) -> int:
    events = json.loads((root / "build" / "profile.json").read_text())["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "compile")


def real_tree(args: argparse.Namespace) -> Path:
    """The real-shaped tree at ``--scale`` with the fake compiler on PATH (its toolchain
    sends ``FAKECC_SLEEP``, the action seconds, with every action)."""
    out: Path = args.out
    root = out / "real"
    if root.exists():  # moved away, not deleted: see fresh()
        clean(root)
        (out / TRASH).mkdir(exist_ok=True)
        root.rename(out / TRASH / f"real-{time.time_ns()}")
    subprocess.run(
        [PY, str(HERE / "gen_tree.py"), str(root), "--profile", "real", "--scale", str(args.scale)],
        check=True,
        capture_output=True,
    )
    bin_dir = out / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "fakecc"
    fake.write_text(FAKECC)
    fake.chmod(0o755)
    (root / "toolchains").mkdir(exist_ok=True)
    (root / "toolchains" / "nvcc.toml").write_text(TOOLCHAIN + 'env_allowlist = ["FAKECC_SLEEP"]\n')
    os.environ["FAKECC_SLEEP"] = str(args.seconds)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return root


def fresh(root: Path) -> None:
    """No build and no doit state: every compile runs again. The last build is moved away
    (:func:`bench_parallel.clean`), deleted when the bench ends: deleted here, its inodes
    would make the next build's every file creation slower (ext4 without a journal skips
    inodes freed in the last minutes), in this process's system time."""
    clean(root)
    for db in root.glob(".doit.db*"):
        db.unlink()


def x2(args: argparse.Namespace) -> None:
    if args.scale is None:
        args.scale = SIMULATED_SCALE if args.simulated else 0.1
    root = real_tree(args)
    counts = [int(w) for w in args.workers.split(",")]
    if args.simulated:
        x2_simulated(args, root, counts)
        return
    out: Path = args.out
    props = offering(root)
    print(
        f"X2 the real-shaped tree (--scale {args.scale}), fake compiler sleeping {args.seconds} s"
    )
    with postgres_cluster() as pg:
        for workers in counts:
            with engine(pg, workers, props) as stack:
                fresh(root)
                env = remote_env(out, stack, METRALE_ORCH_REMOTE_JOBS=str(max(4, 2 * workers)))
                run = timed([PY, "-m", "doit", "build"], root, env)
            compiles = compiles_of(root)
            ideal = compiles * args.seconds / workers
            print(
                f"  {workers:>2} workers: {run.seconds:7.2f} s for {compiles} compiles, "
                f"ideal {ideal:6.1f} s ({run.seconds / ideal:.2f}x), client CPU "
                f"{run.cpu / max(1, ran_remotely(run.text)) * 1000:.1f} ms/action  "
                f"[{line_of(run.text, 'remote: ')}]"
            )


def x2_simulated(args: argparse.Namespace, root: Path, counts: list[int]) -> None:
    """X2 against the stand-in engine: workers that sleep, so the client is what is measured.
    With ``--before DIR`` each worker count is built first with DIR first on PYTHONPATH
    (another revision's work tree), then with this one."""
    from tests.support.reapi_standin import standin_engine

    out: Path = args.out
    print(
        f"X2 simulated: the real-shaped tree (--scale {args.scale}), {args.seconds} s per action, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    sides = [("before", str(args.before)), ("", str(REPO))] if args.before else [("", str(REPO))]
    for workers in counts:
        for label, pythonpath in sides:
            with standin_engine(workers, args.seconds) as eng:
                fresh(root)
                env = env_for(
                    out,
                    METRALE_ORCH_REMOTE_EXECUTOR=eng.url,
                    METRALE_ORCH_REMOTE_JOBS=str(args.remote_jobs or min(1024, 2 * workers)),
                    METRALE_ORCH_REMOTE_STRICT="1",
                    PYTHONPATH=pythonpath,
                )
                argv = [PY, "-m", "doit", "build"]
                if args.profile:
                    argv = [PY, str(HERE / "profile_threads.py"), str(out / f"x2-{workers}.prof")]
                    argv += ["-m", "doit", "build"]
                run = timed(argv, root, env)
            compiles = compiles_of(root)
            ideal = compiles * args.seconds / workers
            per = run.cpu / max(1, eng.executed)
            tag = f" ({label})" if label else ""
            print(
                f"X2 simulated {workers} workers{tag}: {run.seconds:.1f} s, ideal {ideal:.1f} s, "
                f"{run.seconds / ideal:.2f}x, client CPU {per * 1000:.1f} ms/action"
            )
            calls = len(eng.fake.methods()) / max(1, eng.executed)
            print(
                f"  {eng.executed} actions ({compiles} compiles), at most {eng.peak} at once; "
                f"client CPU {run.cpu:.1f} s ({run.sys:.1f} s system); one client core "
                f"feeds {args.seconds / per:.0f} workers at {args.seconds} s an action; "
                f"load {os.getloadavg()[0]:.2f}; engine CPU "
                f"{run.own_cpu / max(1, eng.executed) * 1000:.1f} ms/action; client threads "
                f"at most {run.threads}; {calls:.1f} calls/action"
            )
            if args.profile:
                show_profile(out / f"x2-{workers}.prof")


def show_profile(path: Path, top: int = 30) -> None:
    import pstats

    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def x3(args: argparse.Namespace) -> None:
    from tests.support.reapi_cas_server import cas_server
    from tests.support.servers import s3_server

    out: Path = args.out
    print("X3 warm rebuilds of the sample tree (every module a hit)")
    results: dict[str, float] = {}
    with s3_server() as s3, cas_server() as cas:
        tiers = {
            "local tier": {},
            "S3 (moto)": {
                "METRALE_ORCH_CACHE": s3.url("team"),
                "METRALE_ORCH_STORAGE_OPTIONS": json.dumps(s3.storage_options),
            },
            "REAPI action cache": {
                "METRALE_ORCH_CACHE": cas.url,
                "METRALE_ORCH_STORAGE_OPTIONS": json.dumps({"instance": cas.instance}),
            },
        }
        for name, extra in tiers.items():
            slug = name.split()[0].lower()
            cache = out / f"cache-{slug}"
            shutil.rmtree(cache, ignore_errors=True)
            env = env_for(
                out,
                METRALE_ORCH_CACHE_MODE="read-write",
                METRALE_ORCH_LOCAL_CACHE=str(cache),
                **extra,
            )
            timed([PY, "-m", "doit", "build"], checkout(out, f"fill-{slug}"), env)
            if extra:  # a reader with an empty local cache: every hit comes from the remote
                env["METRALE_ORCH_LOCAL_CACHE"] = str(out / f"cache-{slug}-reader")
                shutil.rmtree(env["METRALE_ORCH_LOCAL_CACHE"], ignore_errors=True)
            warm = timed([PY, "-m", "doit", "build"], checkout(out, f"warm-{slug}"), env)
            took, text = warm.seconds, warm.text
            results[name] = took
            print(f"  {name:<20} {took:6.2f} s   ({line_of(text, 'cache: ')})")
    base = results["local tier"]
    for name, took in results.items():
        print(f"  {name:<20} {took / base:5.2f}x the local tier")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="bench", required=True)
    for name in ("x1", "x2", "x3"):
        p = sub.add_parser(name)
        p.add_argument("out", type=Path, nargs="?", default=HERE / "out" / f"remote-{name}")
        p.add_argument("--keep-trash", action="store_true", help=KEEP_TRASH_HELP)
    sub.choices["x1"].add_argument(
        "--remote-jobs", type=int, default=0, help="remote_jobs (0: the default, unset)"
    )
    x2_args = sub.choices["x2"]
    x2_args.add_argument("--workers", default="1,4,16")
    x2_args.add_argument(
        "--scale", type=float, default=None, help=f"default 0.1, {SIMULATED_SCALE} simulated"
    )
    x2_args.add_argument("--action-seconds", "--sleep", dest="seconds", type=float, default=0.2)
    x2_args.add_argument("--simulated", action="store_true", help="the stand-in engine")
    x2_args.add_argument("--before", type=Path, help="simulated: another revision's tree, A/B")
    x2_args.add_argument("--profile", action="store_true", help="simulated: cProfile the build")
    x2_args.add_argument(
        "--remote-jobs", type=int, default=0, help="simulated: remote_jobs (default 2 x workers)"
    )
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        {"x1": x1, "x2": x2, "x3": x3}[args.bench](args)
    finally:
        empty_trash(args.out, args.keep_trash)


if __name__ == "__main__":
    main()
