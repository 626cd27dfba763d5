"""The release gate's benchmark (``bench/bench_gate.py``) at a tiny size.

One hopper target of the real-shaped tree at scale 0.1 is built with the fake compilers
(the fake nvcc writing PTX that assembles), locked, and checked: the real ``ptxas``
assembles every PTX on the cold runs, the cached runs run none, and the tree's declared
kernels are all exported (coverage finds no problem, the lock matches).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

BENCH = REPO / "bench" / "bench_gate.py"


@pytest.mark.nvcc
def test_bench_gate_runs_on_one_target(tmp_path: Path) -> None:
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not installed")
    argv = [sys.executable, str(BENCH), str(tmp_path / "gate"), "--scale", "0.1", "--reps", "1"]
    done = subprocess.run(
        [*argv, "--targets", "hopper/qwen3.6-27b/nvfp4"],
        capture_output=True,
        text=True,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    cold = [line for line in out.splitlines() if " CPU   cold, exit " in line]
    cached = [line.split("cached: ", 1)[1] for line in out.splitlines() if "cached: " in line]
    assert len(cold) == 2 and len(cached) == 2, out
    assert len(re.findall(r"ms wall, +\d+ ms CPU +\d+\.\d\dx the 2 s goal", out)) == 2, out
    declared = int(re.search(r"(\d+) kernels declared", out)[1])  # type: ignore[index]
    assert declared > 0
    assert "coverage: no problem; 1 target," in cold[0]
    assert re.search(r"[1-9]\d* named kernels checked", cold[0])
    assert re.search(r"; [1-9]\d* ptxas runs?, 0 from the cache", cold[0])
    assert re.search(r"; 0 ptxas runs, [1-9]\d* from the cache", cached[0])
    for line in (cold[1], cached[1]):
        assert re.search(r"[1-9]\d* kernels of 1 built target match kernels.lock", line), line
    assert "coverage problems per hardware: none" in out
