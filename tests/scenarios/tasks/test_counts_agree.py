"""The counts a build prints agree, as a user reads them (issue 43, items 4 and 7).

Real ``doit build`` runs on the fake project (four NVIDIA targets, the Metal one
skipped): each run's ``build:`` summary, its ``done`` target lines, its ``FAILED`` lines
and its ``cache:`` line are parsed and checked against each other
(docs/guarantees.md, "What the counts mean"):

- built + from cache + up to date + skipped + failed = the targets selected;
- the ``done`` lines of each word (``built``, ``from cache``) are the summary's counts;
- a target line's modules add up, and over every target that ran they are the
  ``cache:`` line's: local hits, remote hits, shared, and compiled + failed = misses
  (a target that failed compiling has a line too), with the cache on or off, threads
  or processes.

A skip reason is said in full on a run that builds, and shortened on a no-op.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.project import DoitRun, doit

#: The modules of each target the fake project builds (gb10 adds its own common one).
MODULES = {"gb10/qwen/w4": 3, "gb10/qwen/w8": 3, "hopper/qwen/w4": 2, "hopper/qwen/w8": 2}
SELECTED = 5  # the four above and apple/llama/f16 (skipped: no Metal toolchain)
SKIP_REASON = "toolchain 'metal' is not installed: `xcrun` was not found"

_SUMMARY = re.compile(
    r"^build: (\d+) built, (\d+) from cache, (\d+) up to date, (\d+) skipped, (\d+) failed"
    r" in [\d.]+ s$",
    re.MULTILINE,
)
_CACHE = re.compile(
    r"^cache: (\d+) local hits?, (\d+) remote hits?, (?:(\d+) shared, )?(\d+) miss(?:es)?;",
    re.MULTILINE,
)
_TARGET = re.compile(
    r"^done build:(\S+): (built|from cache|failed) in [\d.]+ s \((\d+) modules?(?:: (.+))?\)$"
)
_PART = re.compile(r"^(\d+) (local hits?|remote hits?|shared|compiled|failed)$")
_WORD = {
    "local hit": "local",
    "remote hit": "remote",
    "shared": "shared",
    "compiled": "compiled",
    "failed": "failed",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Said:
    """What one run printed: its summary, target lines, failed targets, cache line."""

    summary: dict[str, int]
    targets: dict[str, tuple[str, dict[str, int]]]
    failed: tuple[str, ...]
    cache: dict[str, int] | None


def parse(run: DoitRun) -> Said:
    """The counts of ``run``'s output; every ``done`` line must parse."""
    found = _SUMMARY.search(run.out)
    assert found, run.text
    words = ("built", "from cache", "up to date", "skipped", "failed")
    summary = dict(zip(words, map(int, found.groups()), strict=True))
    targets = {}
    for line in run.out.splitlines():
        if line.startswith("done "):
            match = _TARGET.match(line)
            assert match, line
            name, word, total, parts = match.groups()
            modules = dict.fromkeys(_WORD.values(), 0)
            for part in (parts or "").split(", ") if parts else ():
                each = _PART.match(part)
                assert each, line
                modules[_WORD[each[2].removesuffix("s")]] += int(each[1])
            assert sum(modules.values()) == int(total), line
            targets[name] = (word, modules)
    failed = tuple(re.findall(r"^FAILED build:(\S+):", run.out, re.MULTILINE))
    cache = _CACHE.search(run.out)
    counts = None
    if cache:
        local, remote, shared, misses = cache.groups()
        counts = {
            "local": int(local),
            "remote": int(remote),
            "shared": int(shared or 0),
            "misses": int(misses),
        }
    return Said(summary=summary, targets=targets, failed=failed, cache=counts)


def assert_agree(run: DoitRun) -> Said:
    """Check every law of the module docstring on ``run``."""
    said = parse(run)
    assert sum(said.summary.values()) == SELECTED, run.out
    for word in ("built", "from cache", "failed"):
        lines = [n for n, (w, _m) in said.targets.items() if w == word]
        assert len(lines) == said.summary[word], (word, run.out)
    assert len(said.failed) == said.summary["failed"], run.out
    for name, (word, modules) in said.targets.items():
        assert sum(modules.values()) == MODULES[name], run.out
        # built: some module compiled in the run, here or by a target it shares it with
        if word == "built":
            assert modules["compiled"] or modules["shared"], run.out
        elif word == "from cache":
            assert not modules["compiled"], run.out
        else:
            assert modules["failed"], run.out
    if said.targets or said.failed:
        assert said.cache is not None, run.out
        total = {k: sum(m[k] for _w, m in said.targets.values()) for k in _WORD.values()}
        assert said.cache == {
            "local": total["local"],
            "remote": total["remote"],
            "shared": total["shared"],
            "misses": total["compiled"] + total["failed"],
        }, run.out
    return said


def _run(root: Path, env: Mapping[str, str], *args: str) -> DoitRun:
    run = doit(root, [*args, "build"], env)
    assert run.returncode in (0, 1), run.text
    return run


def test_cold_warm_and_noop_runs_agree(fake_project: tuple[Path, dict[str, str]]) -> None:
    root, env = fake_project
    cold = assert_agree(_run(root, env))
    assert cold.summary == {
        "built": 4, "from cache": 0, "up to date": 0, "skipped": 1, "failed": 0
    }  # fmt: skip
    assert cold.cache == {"local": 0, "remote": 0, "shared": 3, "misses": 7}

    noop = _run(root, env)
    assert parse(noop).summary["up to date"] == 4 and not parse(noop).targets
    assert_agree(noop)

    shutil.rmtree(root / "build")  # a fresh checkout: every target from the local cache
    warm = assert_agree(_run(root, env))
    assert warm.summary["from cache"] == 4 and warm.summary["built"] == 0, warm
    assert warm.cache is not None and warm.cache["misses"] == 0
    # Issue 43: a target line's module hits were said "from cache", the summary's word
    # for targets; each now says its target's word, its modules in the cache: line's.
    assert all(word == "from cache" for word, _m in warm.targets.values()), warm


@pytest.mark.parametrize("args", [(), ("-n", "2", "-P", "process")], ids=["thread", "process"])
def test_with_the_cache_off_every_compiled_module_is_a_miss(
    fake_project: tuple[Path, dict[str, str]], args: tuple[str, ...]
) -> None:
    # Issue 43: with the cache off the cache: line said "0 misses" (and no module shared)
    # though every module compiled.
    root, env = fake_project
    off = {**env, "METRALE_ORCH_CACHE_MODE": "off"}
    run = _run(root, off, *args)
    said = assert_agree(run)
    assert said.summary["built"] == 4 and said.cache is not None
    # 7 distinct compiles; worker processes share nothing without a cache: they compile.
    assert sum(said.cache.values()) == 10 and said.cache["misses"] >= 7, run.out
    assert re.search(r"^cache: .*; cache off$", run.out, re.MULTILINE), run.out


def test_a_read_only_cache_and_processes_agree(fake_project: tuple[Path, dict[str, str]]) -> None:
    root, env = fake_project
    assert_agree(_run(root, env, "-n", "2", "-P", "process"))
    shutil.rmtree(root / "build")
    ro = {**env, "METRALE_ORCH_CACHE_MODE": "read-only"}
    said = assert_agree(_run(root, ro, "-n", "2", "-P", "process"))
    assert said.summary["from cache"] == 4, said


def test_a_failed_target_is_counted_once_everywhere(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    (root / "kernels/hopper/qwen/w8/mul.cu").write_text("#error broken\n")
    run = _run(root, env)
    assert run.returncode == 1, run.text
    # Both w8 targets fail on mul.cu; their other modules were looked up as well.
    said = assert_agree(run)
    assert sorted(said.failed) == ["gb10/qwen/w8", "hopper/qwen/w8"]
    # Issue 43: a failed target's lookups were on the cache: line and on no target line.
    assert said.targets["hopper/qwen/w8"][1]["failed"] == 1, run.out
    assert said.summary["failed"] == 2 and said.summary["built"] == 2, run.out


def test_a_skip_reason_is_said_in_full_once_and_short_on_a_noop(
    fake_project: tuple[Path, dict[str, str]],
) -> None:
    root, env = fake_project
    first = _run(root, env)
    assert first.out.count(SKIP_REASON) == 1, first.out
    noop = _run(root, env)
    # Issue 43: the whole reason was repeated on every no-op.
    assert SKIP_REASON not in noop.out, noop.out
    assert (
        "skipped 1 target(s): toolchain 'metal' is not installed (apple/llama/f16); "
        "see `metrale-orch status`\n"
    ) in noop.out, noop.out


def test_a_long_skip_reason_is_cut_on_a_noop() -> None:
    from metrale_orch.tasks.report_lines import format_skipped  # new in issue 43

    reason = "x" * 431
    short = format_skipped(reason, ["hw/m/q"], full=False)
    assert short == f"skipped 1 target(s): {'x' * 99}… (hw/m/q); see `metrale-orch status`"
    assert format_skipped(reason, ["hw/m/q"], full=True).count(reason) == 1
    assert (
        format_skipped("no toolchain", ["a"], full=False) == "skipped 1 target(s): no toolchain (a)"
    )
