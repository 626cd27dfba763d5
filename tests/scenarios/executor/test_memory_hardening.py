"""Memory-aware admission as the out-of-memory killer and containers really behave (issue
43, B1).

These are the tests of this topic that start processes; the others, and the rest of what
they check, are in ``tests/unit/executor/test_memory_hardening.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from metrale_orch.steps.times import TIMES
from tests.support.executor import GIB
from tests.support.project import doit

#: A compiler driver whose tool the kernel kills the first time, as nvcc's cicc is:
#: the tool dies by SIGKILL, the driver reports it and exits 137 (or 255 with nvcc's
#: words, $SAY); later runs hand over to the real (fake) compiler.
DRIVER = """\
import os, signal, subprocess, sys
mark = os.environ["KILL_MARK"]
if sys.argv[1:] != ["--version"] and not os.path.exists(mark):
    open(mark, "w").close()
    tool = subprocess.run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert tool.returncode == -9
    sys.stderr.write("nvcc error   : 'cicc' died due to signal 9 (Kill signal)\\n")
    sys.exit(255 if os.environ.get("SAY") else 137)
os.execv(sys.executable, [sys.executable, os.environ["REAL_CC"], *sys.argv[1:]])
"""


@pytest.mark.parametrize("say", ["", "1"])
def test_a_compile_whose_tool_the_kernel_killed_runs_again_and_the_build_passes(
    fake_project: tuple[Path, dict[str, str]], tmp_path: Path, say: str
) -> None:
    root, env = fake_project
    real = tmp_path / "bin" / "fakecc"
    real.rename(tmp_path / "fakecc-real")
    real.write_text(f"#!{sys.executable}\n" + DRIVER)
    real.chmod(0o755)
    mark = tmp_path / "killed"
    env = {**env, "KILL_MARK": str(mark), "REAL_CC": str(tmp_path / "fakecc-real"), "SAY": say}
    run = doit(root, ["-n", "2", "build"], env)
    assert mark.exists()  # one compile's tool was killed
    assert run.returncode == 0, run.text
    assert "status 137" not in run.text and "status 255" not in run.text


def test_a_one_off_huge_peak_is_replaced_by_the_next_builds_bound(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    env = {**env, "METRALE_ORCH_CACHE_MODE": "off"}
    assert doit(root, ["-n", "2", "build"], env).returncode == 0
    path = root / "build" / ".state" / TIMES
    kept = json.loads(path.read_text())
    # Say one build's compiles peaked at 1 TiB each (a runaway template, since fixed).
    kept["memory"] = {t: dict.fromkeys(mods, 1 << 40) for t, mods in kept["modules"].items()}
    path.write_text(json.dumps(kept))
    assert doit(root, ["forget", "build"], env).returncode == 0
    again = doit(root, ["-n", "2", "build"], env)
    assert again.returncode == 0, again.text
    peaks = json.loads(path.read_text()).get("memory", {})
    # The fake compiler uses less than the build process: its peaks are bounds now.
    assert peaks and all(p < 16 * GIB for mods in peaks.values() for p in mods.values()), peaks
