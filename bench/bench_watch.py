"""The edit loop's latency: a save's way to its artefact under ``metrale-orch watch``,
against the compile alone.

    python bench/bench_watch.py

Two trees in a temporary directory, each watched by ``metrale-orch watch`` as a user runs
it. On a copy of the sample tree (``kernels/``, ``'hopper/*'``) nvcc is the recording fake
compiler of the tests, made to take a known time (``FAKECC_DELAY``); a leaf source is
saved with new bytes 12 times (the fake compiler compiles ``#error`` lines too: the
sample tree guards some under ``#if``), and each save is timed from the write to the moment its
artefact holds the new compile (the artefact file polled every millisecond). The compile
alone is the very command of ``compile_commands.json``, run directly 5 times. The first
line::

    watch: p50 edit->artefact N ms for a C ms compile (+D ms), p90 +E ms; ...

then the CPU watch spends on a save that changes no bytes (the process's own CPU time
over the second after it, less that of an idle second), then the same for one module
compiled by the real nvcc (the tests' small project, ``hopper/qwen/w8``), when nvcc is on
``PATH``. Say the machine's load (``uptime``) beside the numbers.
"""

from __future__ import annotations

import json
import os
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
NVCC_SAVES = 5


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compile_ms(tree: Path, leaf: str, reps: int, env: dict[str, str]) -> float:
    """The median wall time of the leaf's compile command, run directly (ms)."""
    entries = json.loads((tree / "build/compile_commands.json").read_text())
    entry = next(e for e in entries if e["file"] == str(tree / leaf))
    argv = list(entry["arguments"])
    with tempfile.TemporaryDirectory() as scratch:
        argv[argv.index("-o") + 1] = str(Path(scratch) / Path(entry["output"]).name)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            subprocess.run(argv, cwd=entry["directory"], env=env, check=True, capture_output=True)
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


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


def _saves(watch: Watch, tree: Path, leaf: str, n: int) -> list[float]:
    found = []
    for i in range(n):
        found.append(_save_to_artefact_ms(watch, tree, leaf, i))
        time.sleep(0.3)
    return found


def _same_bytes_cpu_ms(watch: Watch, tree: Path, leaf: str) -> float:
    """watch's CPU for one save that changes no bytes, less an idle second's (ms)."""
    pid = watch.proc.pid
    time.sleep(0.5)
    idle0 = _cpu_s(pid)
    time.sleep(1.0)
    idle = _cpu_s(pid) - idle0
    source = tree / leaf
    start = _cpu_s(pid)
    source.write_bytes(source.read_bytes())
    time.sleep(1.0)
    used = _cpu_s(pid) - start
    if watch.quiet(0.1):
        raise SystemExit(f"a same-bytes save made a cycle: {watch.seen[-3:]}")
    return max(0.0, used - idle) * 1000


def _line(name: str, saves: list[float], compile_ms: float) -> str:
    p50 = statistics.median(saves)
    p90 = statistics.quantiles(saves, n=10)[-1] if len(saves) >= 5 else max(saves)
    return (
        f"{name}: p50 edit->artefact {p50:.0f} ms for a {compile_ms:.0f} ms compile "
        f"(+{p50 - compile_ms:.0f} ms), p90 +{p90 - compile_ms:.0f} ms; "
        f"{len(saves)} saves, min {min(saves):.0f} ms, max {max(saves):.0f} ms"
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
) -> tuple[list[float], float, float]:
    watch = start_watch(tree, [pattern], env)
    try:
        watch.cycle(timeout=600)
        compile_ms = _compile_ms(tree, leaf, 5 if saves > NVCC_SAVES else 3, env)
        found = _saves(watch, tree, leaf, saves)
        cpu = _same_bytes_cpu_ms(watch, tree, leaf)
    finally:
        watch.stop()
    return found, compile_ms, cpu


def main() -> None:
    out = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    try:
        tree, env = _fake_tree(out)
        found, compile_ms, cpu = _measure(tree, env, "hopper/*", FAKE_LEAF, FAKE_SAVES)
        print(_line("watch", found, compile_ms) + f"; a save of the same bytes: {cpu:.1f} ms CPU")
        if shutil.which("nvcc") is None:
            print("watch (nvcc): skipped, nvcc is not on PATH")
            return
        real = make_project(out / "real")
        found, compile_ms, cpu = _measure(
            real, project_env(out), "hopper/qwen/w8", NVCC_LEAF, NVCC_SAVES
        )
        print(_line("watch (nvcc, one module)", found, compile_ms))
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
