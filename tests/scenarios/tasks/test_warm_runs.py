"""A process that runs doit again (a warm process, as ``metrale-orch watch`` will be) gets a
clean run each time: each run's lines, counts, report files and build-log lines are those
the same run prints and writes in a process of its own.

The warm process runs doit through the package's loader, as ``metrale-orch doit`` does
(:func:`~metrale_orch.tasks.launch.run_doit`); its twin project runs each step as its own
``metrale-orch doit``. Both build with the recording fake compiler.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from metrale_orch.paths import LOG_NAME, PROFILE_NAME, STATS_NAME
from tests.support.project import (
    DoitRun,
    make_project,
    orch,
    project_env,
    python_code,
    use_fake_compiler,
)

#: The steps: a build, an edit and a build of what it reaches, a scoped no-op; one target
#: at a time, so which target compiles a module two share is the same in both projects.
STEPS: tuple[tuple[str, ...], ...] = (
    ("-n", "1", "build"),
    ("-n", "1", "build"),
    ("-n", "1", "build:hopper/*"),
)
EDITED = "kernels/hopper/qwen/w8/mul.cu"
MARK = "=== run {} ended: {}"

WARM = f"""
import sys
from pathlib import Path
from metrale_orch.tasks.launch import run_doit

for i, args in enumerate({STEPS!r}):
    if i == 1:
        with open({EDITED!r}, "a") as f:
            f.write("// an edit\\n")
    status = run_doit(list(args))
    print({MARK!r}.format(i, status), flush=True)  # the process's own stdout again
"""


def _project(tmp: Path) -> tuple[Path, dict[str, str]]:
    root = make_project(tmp / "proj")
    use_fake_compiler(root, tmp / "bin")
    return root, project_env(tmp, fake_bin=tmp / "bin")


def _runs_of(out: str) -> list[list[str]]:
    """The warm process's output cut into its runs, at the marks (each run's lines)."""
    runs: list[list[str]] = [[]]
    for line in out.splitlines():
        if line.startswith("=== run "):
            runs.append([])
        else:
            runs[-1].append(line)
    return runs[:-1]


def _steady(lines: list[str]) -> list[str]:
    """A run's lines without what differs between two equal runs (times, the order in
    which targets finish)."""
    timed = re.compile(r"\b\d+\.\d+ s\b")
    return sorted(timed.sub("T s", line) for line in lines)


def _report_files(root: Path) -> dict[str, object]:
    """What the run left: its cache statistics, the targets of its profile, and the
    summary lines of the build log (one per target built: what its modules came from)."""
    build = root / "build"
    stats = json.loads((build / STATS_NAME).read_text())
    stats.pop("seconds_saved")  # the kept compile times of each project's own first build
    profile = json.loads((build / PROFILE_NAME).read_text())
    targets = sorted(
        {str(e["args"]["target"]) for e in profile["traceEvents"] if "target" in e.get("args", {})}
    )
    log = (build / LOG_NAME).read_text().splitlines()
    summaries = sorted(line.split(": ", 1)[1] for line in log if " module(s): " in line)
    return {"stats": stats, "profile": targets, "log": summaries}


def test_each_run_of_a_warm_process_is_its_own(tmp_path: Path) -> None:
    warm_root, warm_env = _project(tmp_path / "warm")
    cold_root, cold_env = _project(tmp_path / "cold")
    proc = python_code(warm_root, WARM, [], warm_env)
    assert proc.returncode == 0, proc.text
    assert [line for line in proc.out.splitlines() if line.startswith("===")] == [
        MARK.format(i, 0) for i in range(len(STEPS))
    ]
    warm_runs = _runs_of(proc.out)
    cold: list[DoitRun] = []
    for i, args in enumerate(STEPS):
        if i == 1:
            with open(cold_root / EDITED, "a") as f:
                f.write("// an edit\n")
        cold.append(orch(cold_root, ["doit", *args], cold_env))
        assert cold[-1].returncode == 0, cold[-1].text
    for warm_lines, cold_run in zip(warm_runs, cold, strict=True):
        assert _steady(warm_lines) == _steady(cold_run.out.splitlines())
    second = warm_runs[1]
    assert any(
        line.startswith("build: 2 built, 0 from cache, 2 up to date, 1 skipped") for line in second
    ), second
    assert _report_files(warm_root) == _report_files(cold_root)
    assert proc.err == "".join(r.err for r in cold)
