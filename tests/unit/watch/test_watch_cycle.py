"""The edit loop's pure parts: which targets a change reaches, the words of a cycle, what
the build's report says each target did, and the cycle's line."""

from __future__ import annotations

from metrale_orch.cli._watch import format_cycle
from metrale_orch.tasks.report_lines import format_target
from metrale_orch.watch.changes import Changes
from metrale_orch.watch.cycle import (
    TargetOutcome,
    cycle_words,
    is_graph_change,
    needs_fresh_run,
    pattern_words,
    read_report,
)
from metrale_orch.watch.loop import CycleReport

DEPS = {
    "hopper/qwen/w4": frozenset({"kernels/hopper/common/util.cuh", "kernels/hopper/qwen/w4/a.cu"}),
    "hopper/qwen/w8": frozenset({"kernels/hopper/qwen/w8/mul.cu"}),
}
SELECTION = ("build:hopper/*",)


def test_an_edit_builds_exactly_the_targets_it_reaches() -> None:
    edit = Changes(changed=("kernels/hopper/qwen/w8/mul.cu",))
    assert cycle_words(edit, DEPS, SELECTION) == ("build:hopper/qwen/w8",)
    header = Changes(changed=("kernels/hopper/common/util.cuh", "kernels/hopper/qwen/w8/mul.cu"))
    assert cycle_words(header, DEPS, SELECTION) == ("build:hopper/qwen/w4", "build:hopper/qwen/w8")
    assert cycle_words(Changes(changed=("kernels/hopper/notes.txt",)), DEPS, SELECTION) == ()


def test_a_graph_change_builds_the_whole_selection() -> None:
    for changes in (
        Changes(added=("kernels/hopper/qwen/w8/div.cu",)),
        Changes(removed=("kernels/hopper/qwen/w8/mul.cu",)),
        Changes(changed=("kernels/hopper/qwen/MODEL.toml",)),
        Changes(changed=("toolchains/nvcc.toml",)),
        Changes(changed=("pyproject.toml",)),
    ):
        assert is_graph_change(changes)
        assert cycle_words(changes, DEPS, SELECTION) == SELECTION
    assert needs_fresh_run(Changes(changed=("pyproject.toml",)))
    assert needs_fresh_run(Changes(added=("toolchains/hip.toml",)))
    assert not needs_fresh_run(Changes(changed=("kernels/hopper/qwen/MODEL.toml",)))


def test_patterns_are_doit_words() -> None:
    assert pattern_words([]) == ("build",)
    assert pattern_words(["hopper/*", "build:gb10/*"]) == ("build:gb10/*", "build:hopper/*")


def test_the_report_is_read_from_the_reporters_own_lines() -> None:
    text = "\n".join(
        [
            "[1/2] build:hopper/qwen/w8",
            "FAILED build:hopper/qwen/w8: hopper/qwen/w8: module mul (mul.cu): the compiler "
            "exited with status 1",
            "  $ fakecc --ptx mul.cu -o mul.ptx",
            "mul.cu(1): error: forced failure",
            "mul.cu(2): error: another",
            format_target("build:hopper/qwen/w8", "failed", {"failed": 1, "shared": 1}, 0.1),
            format_target("build:hopper/qwen/w4", "cached", {"local": 2}, 0.02),
            "build: 0 built, 1 from cache, 0 up to date, 0 skipped, 1 failed in 0.1 s",
        ]
    )
    w4, w8 = read_report(text)
    assert w4 == TargetOutcome(
        target="hopper/qwen/w4", outcome="from cache", modules="2 local hits"
    )
    assert w8.outcome == "failed" and w8.modules == "1 shared, 1 failed"
    assert w8.errors == ("mul.cu(1): error: forced failure", "mul.cu(2): error: another")


def test_a_cycle_is_one_line_and_a_failure_its_compiler_lines() -> None:
    report = CycleReport(
        number=2,
        changes=Changes(changed=("kernels/hopper/qwen/w8/mul.cu",)),
        targets=(
            TargetOutcome(
                target="hopper/qwen/w8", outcome="failed", errors=("mul.cu(1): error: x",)
            ),
        ),
        seconds=0.05,
        status=1,
        whole=False,
    )
    assert format_cycle(report, "10:00:00", numeric=False) == [
        "[10:00:00] hopper/qwen/w8/mul.cu changed: hopper/qwen/w8 failed; 0.05 s",
        "    hopper/qwen/w8: mul.cu(1): error: x",
    ]
