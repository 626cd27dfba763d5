"""The build history (issue 43, item 5): ``metrale-orch profile`` looks back past a build
the cache served, lists the last builds and shows one; the history stays bounded and
survives a damaged file; the progress line's ETA comes from the kept compile times."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from doit.task import Task

from metrale_orch.cli import main
from metrale_orch.paths import profile_history
from metrale_orch.steps.history import (
    KEEP,
    MAX_BYTES,
    BuildRecord,
    add_record,
    decode_history,
    encode_history,
    last_compiling,
    new_record,
)
from metrale_orch.steps.profile import ProfileSummary
from metrale_orch.tasks.doit_api import new_run
from metrale_orch.tasks.reporter import BuildReporter
from tests.support.project import doit, make_project, project_env, use_fake_compiler
from tests.support.terminal import doit_on_terminal

HISTORY = "build/.state/profile-history.json"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def cli(root: Path, env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--root", str(root), *args], environ=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def project(tmp: Path) -> tuple[Path, dict[str, str]]:
    root = make_project(tmp / "proj")
    use_fake_compiler(root, tmp / "bin")
    return root, project_env(tmp, fake_bin=tmp / "bin")


def served_by_the_cache(root: Path, env: Mapping[str, str], *args: str) -> None:
    """A build that runs every selected target again (doit's database forgotten) and
    finds every module in the local cache: it compiles nothing."""
    (root / ".doit.db").unlink()
    run = doit(root, [*args], env)
    assert run.returncode == 0 and " 0 misses;" in run.out, run.text


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A build that compiled (#1, every target), then one the cache served (#2, Hopper's)."""
    root, env = project(tmp_path_factory.mktemp("two"))
    first = doit(root, ["build"], env)
    assert first.returncode == 0, first.text
    served_by_the_cache(root, env, "build:hopper/*")
    return root, env


# ------------------------------------------------------------------ through the commands


def test_profile_after_a_build_the_cache_served_shows_the_last_that_compiled(
    two_builds: tuple[Path, dict[str, str]],
) -> None:
    root, env = two_builds
    # profile.json keeps its format: the last build's spans, here lookups and no compile.
    events = json.loads((root / "build/profile.json").read_text())["traceEvents"]
    assert events and not [e for e in events if e.get("cat") == "compile"]
    code, out, err = cli(root, env, "profile")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (
        "no compiles in the last build (build/profile.json); "
        f"the last that compiled, from {HISTORY}:"
    )
    assert re.fullmatch(rf"slowest compiles \(build #1, {STAMP}: doit build\):", lines[1]), out
    assert lines[2].split() == ["target", "module", "seconds", "outcome"]
    rows = [ln.split() for ln in lines[3:] if ln.startswith("  ")]
    assert len(rows) == 7 and {r[3] for r in rows} == {"compiled"}
    assert {r[0] for r in rows} == {
        "gb10/qwen/w4",
        "gb10/qwen/w8",
        "hopper/qwen/w4",
        "hopper/qwen/w8",
    }
    assert any(ln.startswith("modules: 7 compiled, 0 local hits") for ln in lines), out
    # Nothing new at the top of build/: the history lives under .state/.
    assert (root / HISTORY).is_file()
    assert not [p for p in (root / "build").iterdir() if "history" in p.name]


def test_profile_lists_the_kept_builds_and_shows_one(
    two_builds: tuple[Path, dict[str, str]],
) -> None:
    root, env = two_builds
    code, out, err = cli(root, env, "profile", "--list")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"builds kept in {HISTORY}, newest first:"
    assert lines[1].split() == [
        "build",
        "finished",
        "targets",
        "compiled",
        "hits",
        "shared",
        "failed",
        "wall",
        "selection",
    ]
    assert re.fullmatch(
        rf"  #2     {STAMP}  +2  +0  +3  +1  +0  +\d+\.\d s  doit build:hopper/\*", lines[2]
    ), out
    assert re.fullmatch(
        rf"  #1     {STAMP}  +4  +7  +0  +3  +0  +\d+\.\d s  doit build", lines[3]
    ), out
    assert len(lines) == 4
    code, out, _ = cli(root, env, "profile", "--list", "1")
    assert code == 0 and len(out.splitlines()) == 3 and "#2 " in out

    code, out, _ = cli(root, env, "profile", "--build", "2")
    assert code == 0
    assert re.fullmatch(
        rf"no compiles in build #2 \({STAMP}: doit build:hopper/\*\)", out.splitlines()[0]
    )
    assert "modules: 0 compiled, 3 local hits, 0 remote hits, 1 shared, 0 failed" in out
    code, out, _ = cli(root, env, "profile", "--build", "1", "--top", "2")
    assert code == 0 and re.match(rf"slowest compiles \(build #1, {STAMP}: doit build\):\n", out)
    assert len([ln for ln in out.splitlines() if ln.startswith("  ")]) == 3  # header + 2

    assert cli(root, env, "profile", "--build", "9") == (
        2,
        "",
        "error: --build 9: not kept; the history holds 2 builds, #1 to #2 (see --list)\n",
    )
    code, _, err = cli(root, env, "profile", "--list", "0")
    assert code == 2 and err == "error: --list 0: expected a number, 1 or more\n"


def test_profile_list_before_any_build(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    assert cli(root, env, "profile", "--list") == (
        1,
        "",
        f"error: no build history yet ({HISTORY}): run doit build\n",
    )


def test_history_stays_bounded(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    path = profile_history(root / "build")
    path.parent.mkdir(parents=True)
    seeded: tuple[BuildRecord, ...] = ()
    for _ in range(KEEP + 10):
        seeded = (*seeded, new_record(seeded, [], finished_ns=0, words=["build"]))
    path.write_bytes(encode_history(seeded))
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    kept = decode_history(path.read_bytes())
    assert [r.build for r in kept] == list(range(12, KEEP + 12))
    assert kept[-1].summary.compiles == 7 and kept[-1].words == ("build",)
    served_by_the_cache(root, env, "build")
    kept = decode_history(path.read_bytes())
    assert [r.build for r in kept] == list(range(13, KEEP + 13))
    assert last_compiling(kept) == kept[-2]
    assert path.stat().st_size < MAX_BYTES // 40


NAN_SECONDS = (
    b'{"schema":1,"builds":[{"build":1,"finished":"2026-12-06T07:00:40Z","words":[],'
    b'"summary":{"slowest":[{"target":"h/m/q","module":"a","seconds":NaN,"outcome":"compiled",'
    b'"wait":0}]}}]}'
)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("fifo", "not a regular file"),
        ("link", "a symbolic link"),
        ("directory", "not a regular file"),
        ("nan", "not JSON: NaN is not a JSON number"),
        ("infinite", "builds[0].summary.slowest[0].seconds: expected seconds"),
        ("nested", "not JSON: nested too deeply"),
        ("huge", "larger than 4 MiB"),
        ("text", "not JSON: "),
        ("order", "builds[1].build: 1 is not after 1"),
    ],
)
def test_a_damaged_history_is_one_line_and_the_next_build_replaces_it(
    tmp_path: Path, damage: str, problem: str
) -> None:
    root, env = project(tmp_path)
    path = profile_history(root / "build")
    path.parent.mkdir(parents=True)
    one = new_record((), [], finished_ns=0, words=[])
    if damage == "fifo":
        os.mkfifo(path)
    elif damage == "link":
        (tmp_path / "elsewhere.json").write_bytes(encode_history([one]))
        path.symlink_to(tmp_path / "elsewhere.json")
    elif damage == "directory":
        path.mkdir()
    else:
        path.write_bytes(
            {
                "nan": NAN_SECONDS,
                "infinite": NAN_SECONDS.replace(b"NaN", b"1e999"),
                "nested": b"[" * 100_000,
                "huge": b" " * (MAX_BYTES + 1),
                "text": b"\xff not json",
                "order": encode_history([one, one]),
            }[damage]
        )
    code, out, err = cli(root, env, "profile", "--list")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {HISTORY}: {problem}") and err.count("\n") == 1, err
    assert err.endswith("(the next doit build that runs something starts a new one)\n")
    if damage == "directory":
        return  # a build cannot put a file there: it says so (below) and goes on
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    assert f"warning: {HISTORY}: {problem}" in run.err and "replaced by a new history" in run.err
    assert [r.build for r in decode_history(path.read_bytes())] == [1]
    assert not path.is_symlink() and (tmp_path / "elsewhere.json").exists() == (damage == "link")


def test_a_history_that_cannot_be_written_never_fails_the_build(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    profile_history(root / "build").mkdir(parents=True)
    run = doit(root, ["build"], env)
    assert run.returncode == 0, run.text
    assert f"warning: could not write the build history {root / HISTORY}" in run.err
    assert (root / "build/profile.json").is_file()


# ------------------------------------------------------------------ the ETA on a terminal


def test_the_eta_after_a_build_the_cache_served_comes_from_the_kept_times(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    first = doit(root, ["build"], env)
    assert first.returncode == 0, first.text
    served_by_the_cache(root, env, "build")  # its profile.json holds no compile
    # An edited module compiles for a while: the live line is drawn, with an ETA.
    source = root / "kernels/hopper/qwen/w8/mul.cu"
    source.write_text(source.read_text() + "\n// edited\n")
    code, text = doit_on_terminal(root, ["build"], {**env, "FAKECC_DELAY": "1.5"})
    assert code == 0, text
    assert "from cache, 2 up to date" in text and "modules " in text, text
    assert re.search(r"modules \d+/\d+ · .* · ETA \d+:\d\d", text), text


# ------------------------------------------------------------------ the pure parts


def record(build: int, compiles: int) -> BuildRecord:
    outcomes = {"compiled": compiles, "failed": 0, "local": 0, "remote": 0}
    summary = ProfileSummary(
        slowest=(),
        targets=1,
        workers=1,
        wall_seconds=1.0,
        outcomes=outcomes,
        steps={},
        compiled_bytes=0,
        restored_bytes=0,
    )
    return BuildRecord(build=build, finished="2026-12-06T07:00:40Z", words=(), summary=summary)


def test_add_record_keeps_the_newest_build_that_compiled_when_none_kept_did() -> None:
    history = (record(1, 3), record(2, 5), *(record(n, 0) for n in range(3, 10)))
    kept = add_record(history, record(10, 0), keep=4)
    assert [r.build for r in kept] == [2, 7, 8, 9, 10]
    kept = add_record(history, record(10, 1), keep=4)
    assert [r.build for r in kept] == [7, 8, 9, 10]


def test_a_record_round_trips_through_the_file() -> None:
    events = [
        {
            "ph": "X",
            "cat": "build",
            "ts": 0,
            "dur": 2_000_000,
            "pid": 1,
            "tid": 1,
            "args": {"target": "h/m/q"},
        },
        {
            "ph": "X",
            "cat": "compile",
            "ts": 10,
            "dur": 1_500_000,
            "pid": 1,
            "tid": 1,
            "args": {
                "target": "h/m/q",
                "module": "a",
                "outcome": "compiled",
                "seconds": 1.25,
                "wait": 0.25,
            },
        },
    ]
    built = new_record((), events, finished_ns=1_796_540_440 * 10**9, words=["build:h/*"])
    assert built.finished == "2026-12-06T07:00:40Z" and built.summary.compiles == 1
    data = encode_history([built])
    assert decode_history(data) == (built,)
    assert encode_history(decode_history(data)) == data


def test_a_target_found_up_to_date_leaves_the_eta(tmp_path: Path) -> None:
    """The ETA waits for the kept seconds of the selected targets not started yet: one
    doit finds up to date will never start, and is not waited for."""
    new_run(tmp_path, {})
    reporter = BuildReporter(io.StringIO(), {})
    reporter._expected = {"build:h/m/a": 4.0, "build:h/m/b": 60.0}
    reporter._selected = {"build:h/m/a", "build:h/m/b"}
    assert reporter._progress_text().endswith(" · ETA 1:04")
    reporter.skip_uptodate(Task("build:h/m/b", None))
    assert reporter._progress_text().endswith(" · ETA 0:04")
