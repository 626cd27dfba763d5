"""The edit loop's latency: a save's way to its artefact under ``metrale-orch watch``,
against the compile alone.

    python bench/bench_watch.py

Two trees in a temporary directory, each watched by ``metrale-orch watch`` as a user runs
it. On a copy of the sample tree (``kernels/``, ``'hopper/*'``) nvcc is the recording fake
compiler of the tests, made to take a known time (``FAKECC_DELAY``); a leaf source is
saved with new bytes 12 times (the fake compiler compiles ``#error`` lines too: the
sample tree guards some under ``#if``), and each save is timed from the write to the moment its
artefact holds the new compile (the artefact file polled every millisecond). The compile
alone is the build's own command (``compile_commands.json``'s, with the dependency-list
flags the build adds for nvcc), run directly after each save's cycle; each save's added
time is its latency less that compile. The first line::

    watch: p50 edit->artefact N ms for a C ms compile (+D ms), p90 +E ms; ...

then the CPU watch spends per save that changes no bytes (its threads' CPU time over ten
such saves, less that of as long a time idle), then the same for one module
compiled by the real nvcc (the tests' small project, ``hopper/qwen/w8``), when nvcc is on
``PATH``. Say the machine's load (``uptime``) beside the numbers.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.support; PYTHONPATH wins

from tests.support.project import FAKECC, make_project, project_env, use_fake_compiler  # noqa: E402
from tests.support.watch import Watch, start_watch  # noqa: E402

DODO = "from metrale_orch.dodo import *  # noqa: F403\n"
FAKE_DELAY_S = 0.1
FAKE_LEAF = "kernels/hopper/qwen3-8b/bf16/qk_norm.cu"
FAKE_SAVES = 12
NVCC_LEAF = "kernels/hopper/qwen/w8/mul.cu"
NVCC_SAVES = 8


def _cpu_s(pid: int) -> float:
    """CPU seconds process ``pid``'s threads have run so far (``schedstat``: nanoseconds;
    ``stat`` counts clock ticks of 10 ms, coarser than what is measured)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _compile_ms(tree: Path, leaf: str, env: dict[str, str]) -> float:
    """The wall time of the leaf's compile command, run directly once (ms)."""
    entries = json.loads((tree / "build/compile_commands.json").read_text())
    entry = next(e for e in entries if e["file"] == str(tree / leaf))
    argv = list(entry["arguments"])
    with tempfile.TemporaryDirectory() as scratch:
        argv[argv.index("-o") + 1] = str(Path(scratch) / Path(entry["output"]).name)
        if Path(argv[0]).name == "nvcc":  # the compiler's dependency list, as the build asks
            argv.append(f"-Xcompiler=-MD,-MF,{scratch}/deps.d")
        start = time.perf_counter()
        subprocess.run(argv, cwd=entry["directory"], env=env, check=True, capture_output=True)
        return (time.perf_counter() - start) * 1000


def _artefact(tree: Path, leaf: str) -> Path:
    entries = json.loads((tree / "build/compile_commands.json").read_text())
    return Path(next(e for e in entries if e["file"] == str(tree / leaf))["output"])


def _save_to_artefact_ms(watch: Watch, tree: Path, leaf: str, n: int) -> float:
    """Save ``leaf`` with new bytes (a new constant: new code for a real compiler); ms
    from the write until its artefact changed."""
    artefact = _artefact(tree, leaf)
    before = artefact.read_bytes()
    source = tree / leaf
    text = source.read_text()
    if n == 0:
        text = text.replace("2.0f", "2.0f + BENCH_SAVE", 1)
        text = "#define BENCH_SAVE 0.0f\n" + text
    lines = text.split("\n", 1)
    start = time.perf_counter()
    source.write_text(f"#define BENCH_SAVE {n + 1}.5f // {'x' * n}\n" + lines[1])
    while True:
        try:
            if artefact.read_bytes() != before:
                break
        except OSError:
            pass
        if time.perf_counter() - start > 120:
            raise SystemExit(f"the artefact never changed; watch printed {watch.seen}")
        time.sleep(0.001)
    took = (time.perf_counter() - start) * 1000
    watch.cycle()  # the cycle's line (its smoke checks done) before the next save
    return took


def _saves(
    watch: Watch, tree: Path, leaf: str, n: int, env: dict[str, str]
) -> list[tuple[float, float]]:
    """(edit->artefact, the compile alone) of ``n`` saves, each compile run right after
    its save's cycle (under a changing load, the two are measured close together)."""
    found = []
    for i in range(n):
        latency = _save_to_artefact_ms(watch, tree, leaf, i)
        found.append((latency, _compile_ms(tree, leaf, env)))
        time.sleep(0.2)
    return found


def _same_bytes_cpu_ms(watch: Watch, tree: Path, leaf: str, saves: int = 10) -> float:
    """watch's CPU per save that changes no bytes, less an idle while's (ms): ``saves``
    such saves 0.2 s apart, against as long without any."""
    pid = watch.proc.pid
    time.sleep(0.5)
    start = _cpu_s(pid)
    time.sleep(0.2 * saves)
    idle = _cpu_s(pid) - start
    source = tree / leaf
    data = source.read_bytes()
    start = _cpu_s(pid)
    for _ in range(saves):
        source.write_bytes(data)
        time.sleep(0.2)
    used = _cpu_s(pid) - start
    if watch.quiet(0.1):
        raise SystemExit(f"a same-bytes save made a cycle: {watch.seen[-3:]}")
    return max(0.0, used - idle) * 1000 / saves


def _line(name: str, pairs: list[tuple[float, float]]) -> str:
    """The benchmark's line: the median save's latency and compile; the added time's
    median and 90th percentile over the saves (each save less its own compile)."""
    latency = statistics.median(p[0] for p in pairs)
    compile_ms = statistics.median(p[1] for p in pairs)
    added = [p[0] - p[1] for p in pairs]
    p90 = statistics.quantiles(added, n=10)[-1]
    return (
        f"{name}: p50 edit->artefact {latency:.0f} ms for a {compile_ms:.0f} ms compile "
        f"(+{statistics.median(added):.0f} ms), p90 +{p90:.0f} ms; {len(pairs)} saves, "
        f"added min {min(added):.0f} ms, max {max(added):.0f} ms"
    )


def _fake_tree(out: Path) -> tuple[Path, dict[str, str]]:
    tree = out / "sample"
    shutil.copytree(REPO / "kernels", tree / "kernels")
    (tree / "dodo.py").write_text(DODO)
    use_fake_compiler(tree, out / "bin")
    # The sample tree's sources hold `#error` lines under `#if` guards: compile them; and
    # say the source's length in the artefact, so that each save's artefact is new bytes.
    write = 'with open(out, "w") as fh:\n'
    fake = FAKECC.replace('if "#error" in text:', "if 0:")
    fake = fake.replace(write, "body += f'// {len(text)}\\n'\n" + write, 1)
    assert fake.count("len(text)") == 1 and "if 0:" in fake  # the fake's text moved: follow it
    script = out / "bin" / "fakecc"
    script.write_text(f"#!{sys.executable}\n" + fake)
    env = project_env(out, fake_bin=out / "bin")
    env.pop("FAKECC_LOG", None)
    env["FAKECC_DELAY"] = str(FAKE_DELAY_S)
    return tree, env


def _measure(
    tree: Path, env: dict[str, str], pattern: str, leaf: str, saves: int
) -> tuple[list[tuple[float, float]], float]:
    watch = start_watch(tree, [pattern], env)
    try:
        watch.cycle(timeout=600)
        found = _saves(watch, tree, leaf, saves, env)
        cpu = _same_bytes_cpu_ms(watch, tree, leaf)
    finally:
        watch.stop()
    return found, cpu


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    try:
        tree, env = _fake_tree(out)
        found, cpu = _measure(tree, env, "hopper/*", FAKE_LEAF, FAKE_SAVES)
        print(_line("watch", found) + f"; a save of the same bytes: {cpu:.1f} ms CPU")
        if shutil.which("nvcc") is None:
            print("watch (nvcc): skipped, nvcc is not on PATH")
            return
        real = make_project(out / "real")
        found, _cpu = _measure(real, project_env(out), "hopper/qwen/w8", NVCC_LEAF, NVCC_SAVES)
        print(_line("watch (nvcc, one module)", found))
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
