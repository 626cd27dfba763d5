"""Build readiness and "every view shows why" (SPEC 3.1, 3.7), as a user runs them.

``metrale-orch check`` must refuse exactly what ``doit build`` refuses, all at
once and grouped by file; ``doit list --status`` shows each error's or skip's
reason; a target named on the command line fails with the real reason (never
doit's ``Invalid parameter``); ``rdeps`` lists failing targets too.

The project is :func:`tests.support.project.make_project` (hopper, gb10 inheriting
hopper, apple whose toolchain is not installed) with the recording fake nvcc.

The tests of this topic that run in-process are in ``tests/unit/tasks/test_readiness.py``.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from metrale_orch.graph.check import file_of
from tests.support.project import (
    FILES,
    DoitRun,
    doit,
    fake_compiles,
)
from tests.support.tasks import HOPPER_HW, NVIDIA, project

GB10_HW = FILES["kernels/gb10/HARDWARE.toml"]
METAL_SKIP = (
    "skipped: toolchain 'metal' is not installed: `xcrun` was not found; install the Xcode "
    "command line tools on macOS (`xcode-select --install`); Metal kernels cannot be "
    "compiled on other systems [target apple/llama/f16]"
)


def orch(root: Path, env: Mapping[str, str], *args: str) -> DoitRun:
    """``python -m metrale_orch ARGS`` in ``root``."""
    proc = subprocess.run(
        [sys.executable, "-m", "metrale_orch", *args],
        cwd=root,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return DoitRun(proc.returncode, proc.stdout, proc.stderr)


def problems(run: DoitRun) -> list[str]:
    lines = run.err.splitlines()
    return [ln.removeprefix("problem: ") for ln in lines if ln.startswith("problem: ")]


def failed(run: DoitRun) -> dict[str, str]:
    """target -> message of the ``FAILED build:<target>: <message>`` lines."""
    out = {}
    for line in run.out.splitlines():
        if line.startswith("FAILED build:"):
            target, _, message = line.removeprefix("FAILED build:").partition(": ")
            out[target] = message
    return out


# ------------------------------------------------------------------ check == what the build refuses

#: One mistake each: files written over the project, the text the one problem holds
#: (file and key), and the targets it breaks ([] = the whole tree: "(tree)" fails).
#: ``check`` names the same targets, plus those the build skips for a missing compiler
#: that the mistake breaks too (:data:`CHECK_ALSO`).
MISTAKES: dict[str, tuple[dict[str, str], tuple[str, ...], list[str]]] = {
    "unknown [defaults] lever": (
        {"kernels/hopper/HARDWARE.toml": HOPPER_HW + "not_a_lever = 3\n"},
        ("kernels/hopper/HARDWARE.toml: [defaults]", "not_a_lever"),
        ["hopper/qwen/w4", "hopper/qwen/w8"],
    ),
    "[defaults] value type": (
        {"kernels/hopper/HARDWARE.toml": HOPPER_HW + "ffn_m16_tc = 1\n"},
        ("kernels/hopper/HARDWARE.toml: [defaults] ffn_m16_tc must be a boolean",),
        ["hopper/qwen/w4", "hopper/qwen/w8"],
    ),
    "[hardware] sm_count": (
        {"kernels/gb10/HARDWARE.toml": GB10_HW + "sm_count = 0\n"},
        ("kernels/gb10/HARDWARE.toml: [hardware] sm_count",),
        ["gb10/qwen/w4", "gb10/qwen/w8"],
    ),
    "[hardware] arch missing": (
        {"kernels/gb10/HARDWARE.toml": '[hardware]\nvendor = "nvidia"\ninherits = "hopper"\n'},
        ("kernels/gb10/HARDWARE.toml: [hardware] arch: is required to build",),
        ["gb10/qwen/w4", "gb10/qwen/w8"],
    ),
    "[build] flag type": (
        {"kernels/hopper/qwen/w8/KERNEL.toml": '[build]\nextra_nvcc_flags = ["-DX", 2]\n'},
        ("kernels/hopper/qwen/w8/KERNEL.toml: [build] extra_nvcc_flags[1]: must be a string",),
        ["gb10/qwen/w8", "hopper/qwen/w8"],
    ),
    "[modules] name": (
        {"kernels/hopper/common/KERNEL.toml": '[modules]\nadd = "no spaces"\n'},
        ("kernels/hopper/common/KERNEL.toml: [modules] add: must be a module name",),
        NVIDIA,
    ),
    "[build] toolchain unknown": (
        {
            "kernels/hopper/HARDWARE.toml": HOPPER_HW.replace(
                "[build]\n", '[build]\ntoolchain = "nosuch"\n'
            )
        },
        ("kernels/hopper/HARDWARE.toml: [build] toolchain: no toolchain named 'nosuch'",),
        ["hopper/qwen/w4", "hopper/qwen/w8"],
    ),
    "[shadow_exempt] value": (
        {"kernels/gb10/common/KERNEL.toml": '[shadow_exempt]\nextra = "extra_k"\n'},
        ("kernels/gb10/common/KERNEL.toml: [shadow_exempt] extra: must be an array",),
        ["gb10/qwen/w4", "gb10/qwen/w8"],
    ),
    "kernels/LEVERS.toml": (
        {"kernels/LEVERS.toml": '[[lever]]\nname = "x"\ntype = "float"\n'},
        ("kernels/LEVERS.toml", "[[lever]] #1"),
        NVIDIA,
    ),
    "toolchains/*.toml": (
        {"toolchains/nvcc.toml": '[toolchain]\nname = "nvcc"\nprogram = 3\n'},
        ("toolchains/nvcc.toml: program",),
        [],
    ),
}


#: Mistakes that also break the skipped apple target: the build would refuse it wherever
#: its compiler is installed, and ``check`` runs none.
CHECK_ALSO = {"kernels/LEVERS.toml": ["apple/llama/f16"]}


def test_a_clean_project_passes_check_and_builds(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    check = orch(root, env, "check")
    assert (check.returncode, check.err) == (0, METAL_SKIP + "\n"), check.text
    assert check.out == (
        "check: ok (the build accepts all 5 targets; 1 skipped: cannot be built here)\n"
    )
    assert fake_compiles(tmp_path) == []  # check compiles nothing
    build = doit(root, ["build"], env)
    assert build.returncode == 0, build.text


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_check_refuses_what_the_build_refuses(tmp_path: Path, mistake: str) -> None:
    files, says, broken = MISTAKES[mistake]
    root, env = project(tmp_path, files)
    check = orch(root, env, "check")
    assert check.returncode == 2, check.text
    assert "Traceback" not in check.text
    (problem,) = problems(check)
    assert all(part in problem for part in says), problem
    if broken:
        named = sorted([*broken, *CHECK_ALSO.get(mistake, [])])
        assert problem.endswith(f"[target {', '.join(named)}]"), problem
    else:
        assert "[target " not in problem, problem
    build = doit(root, ["build"], env)
    assert build.returncode != 0, build.text
    assert "Traceback" not in build.text
    refused = failed(build)
    assert sorted(refused) == (broken or ["(tree)"]), build.text
    for message in refused.values():
        assert all(part in message for part in says), message


def test_check_reports_everything_at_once_grouped_by_file(tmp_path: Path) -> None:
    root, env = project(
        tmp_path,
        {
            # two mistakes in one HARDWARE.toml ([defaults] lists every unknown lever)
            "kernels/hopper/HARDWARE.toml": HOPPER_HW + "lever_a = 1\nlever_b = 2\n",
            "kernels/gb10/HARDWARE.toml": GB10_HW + "sm_count = -1\n",
            "kernels/hopper/qwen/w8/KERNEL.toml": (
                '[build]\nextra_nvcc_flags = [true]\n[modules]\nmul = "a b"\n'
            ),
            "kernels/hopper/qwen/w4/SMOKE.toml": "[[case]]\nname = 7\n",
            "kernels/gb10/common/extra.cu": '#include "../../../outside.cuh"\n',
            "outside.cuh": "// not the tree's\n",
            # a hardware without targets is still checked
            "kernels/spare/HARDWARE.toml": '[hardware]\narch = "sm_90a"\n[defaults]\nx = 1\n',
        },
    )
    check = orch(root, env, "check")
    assert check.returncode == 2, check.text
    got = problems(check)
    files = [file_of(p) for p in got]
    assert files == sorted(files), got  # grouped: sorted by the file each names
    assert sorted(set(files)) == [
        "kernels/gb10/HARDWARE.toml",
        "kernels/gb10/common/extra.cu",
        "kernels/hopper/HARDWARE.toml",
        "kernels/hopper/qwen/w4/SMOKE.toml",
        "kernels/hopper/qwen/w8/KERNEL.toml",
        "kernels/spare/HARDWARE.toml",
    ]
    text = "\n".join(got)
    assert "lever_a" in text and "lever_b" in text
    assert "[hardware] sm_count" in text
    # both mistakes of one KERNEL.toml, though the plan stops at the first
    assert "[build] extra_nvcc_flags[0]" in text and "[modules] mul" in text
    assert "kernels/hopper/qwen/w4/SMOKE.toml" in text
    assert 'kernels/gb10/common/extra.cu:1: #include "../../../outside.cuh"' in text
    assert "kernels/spare/HARDWARE.toml: [defaults]" in text
    summary = check.err.splitlines()[-1]
    assert summary == f"check: {len(got)} problems in 6 files (4 of 5 targets affected)"
    assert check.out == "" and METAL_SKIP in check.err.splitlines()  # listed, no problem


# ------------------------------------------------------------------ doit list --status


def test_doit_list_status_shows_each_reason_on_the_targets_line(tmp_path: Path) -> None:
    root, env = project(tmp_path, {"kernels/hopper/HARDWARE.toml": HOPPER_HW + "bogus = 1\n"})
    listing = doit(root, ["list", "--status"], env)
    assert listing.returncode == 0, listing.text
    lines = {ln.split()[1]: ln for ln in listing.out.splitlines() if " build:" in ln}
    for target in ("hopper/qwen/w4", "hopper/qwen/w8"):
        line = lines[f"build:{target}"]
        assert f"build {target} (error: kernels/hopper/HARDWARE.toml: [defaults]" in line
        assert "bogus" in line and line.endswith(")")
    assert lines["build:apple/llama/f16"].endswith(
        "build apple/llama/f16 (skipped: toolchain 'metal' is not installed: `xcrun` was not "
        "found; install the Xcode command line tools on macOS (`xcode-select --install`); "
        "Metal kernels cannot be compiled on other systems)"
    )
    assert lines["build:gb10/qwen/w4"].endswith("build gb10/qwen/w4")
    # The same from the task cache (a second invocation is a hit).
    again = doit(root, ["list", "--status"], env)
    assert again.out == listing.out


# ------------------------------------------------------------------ named targets: the reason


def test_a_named_target_of_a_tree_that_does_not_walk_fails_with_the_reason(
    tmp_path: Path,
) -> None:
    root, env = project(tmp_path, {"kernels/hopper/HARDWARE.toml": HOPPER_HW + "[[[\n"})
    run = doit(root, ["build:gb10/qwen/w8", "build:apple/llama/f16"], env)
    assert run.returncode != 0
    assert "Invalid parameter" not in run.text and "Traceback" not in run.text
    got = failed(run)
    # Its own parent is broken: the resolver's message for it.
    assert got["gb10/qwen/w8"].startswith(
        "kernels/gb10/HARDWARE.toml: [hardware] inherits = 'hopper': the parent tree fails to "
        "load: kernels/hopper/HARDWARE.toml: cannot be read as TOML"
    ), run.text
    # A healthy hardware of a tree that does not walk: the tree's failure.
    assert "kernels/hopper/HARDWARE.toml: cannot be read as TOML" in got["apple/llama/f16"]
    assert fake_compiles(tmp_path) == []
    # `why` and `status` name it the same way.
    why = orch(root, env, "why", "gb10/qwen/w8")
    assert why.returncode == 0, why.text
    assert why.out.startswith("gb10/qwen/w8 does not build: kernels/gb10/HARDWARE.toml")
    status = orch(root, env, "status", "hopper/qwen/w4", "--json")
    (entry,) = json.loads(status.out)["targets"]
    assert entry["status"] == "error" and "cannot be read as TOML" in entry["detail"]


@pytest.mark.parametrize(
    ("path", "text", "reason"),
    [
        (
            "pyproject.toml",
            "[tool.metrale-orch]\nnope = 1\n",
            "pyproject.toml [tool.metrale-orch]: nope:",
        ),
        ("toolchains/more.toml", "[toolchain]\n", "toolchains/more.toml: name: is required"),
    ],
)
def test_a_named_target_of_a_broken_configuration_fails_with_the_reason(
    tmp_path: Path, path: str, text: str, reason: str
) -> None:
    root, env = project(tmp_path, {path: text})
    run = doit(root, ["build:hopper/qwen/w4", "build:nonsense"], env)
    assert run.returncode != 0 and "Invalid parameter" not in run.text
    assert "Traceback" not in run.text, run.text
    got = failed(run)
    assert got["hopper/qwen/w4"].startswith(reason), run.text
    assert got["nonsense"].startswith("not a target: 'nonsense'"), run.text


def test_a_name_that_is_no_target_fails_with_what_there_is(tmp_path: Path) -> None:
    root, env = project(tmp_path)
    names = ["build:hopper/qwen/w16", "build:hopper", "build:volta/qwen/w4"]
    for attempt in ("generated", "from the task cache"):
        run = doit(root, names, env)
        assert run.returncode != 0, (attempt, run.text)
        assert "Invalid parameter" not in run.text, attempt
        assert failed(run) == {
            "hopper/qwen/w16": "hopper/qwen/w16 is not a target of this tree: model "
            "hopper/qwen has no quant directory 'w16' (its targets: hopper/qwen/w4, "
            "hopper/qwen/w8); `doit list` shows every target",
            "hopper": "not a target: 'hopper' (expected hw/model/quant); `doit list` shows "
            "every target",
            "volta/qwen/w4": "kernels/volta/HARDWARE.toml: no such file: `volta` is not a "
            "hardware tree (a hardware tree is a directory kernels/<hw>/ holding HARDWARE.toml)",
        }, attempt
    # Nothing is cleaned for a name that is not a target, whatever it spells: a clean
    # of "../kept/x" would remove <root>/kept/x.
    kept = root / "kept" / "x"
    kept.mkdir(parents=True)
    (kept / "file").write_text("x")
    clean = doit(root, ["clean", "build:../kept/x"], env)
    assert clean.returncode == 0, clean.text
    assert (kept / "file").exists()


# ------------------------------------------------------------------ rdeps lists failing targets


def rdeps(root: Path, env: Mapping[str, str], path: str) -> dict[str, dict[str, object]]:
    run = orch(root, env, "rdeps", path, "--json")
    assert run.returncode == 0, run.text
    return {t["target"]: t for t in json.loads(run.out)["targets"]}


def test_rdeps_lists_failing_and_skipped_targets_marked(tmp_path: Path) -> None:
    root, env = project(
        tmp_path,
        {
            "kernels/hopper/HARDWARE.toml": HOPPER_HW + "bogus = 1\n",
            # an undeclared leaf-over-common win: gb10/qwen/w8, hopper/qwen/w8 do not resolve
            "kernels/hopper/qwen/w8/add.cu": 'extern "C" __global__ void add_leaf() {}\n',
        },
    )
    # scale.cu feeds hopper/qwen/w4 (a plan failure) and gb10/qwen/w4 (builds).
    hits = rdeps(root, env, "kernels/hopper/qwen/w4/scale.cu")
    assert sorted(hits) == ["gb10/qwen/w4", "hopper/qwen/w4"]
    assert hits["gb10/qwen/w4"]["modules"] == ["scale"]
    assert "failing" not in hits["gb10/qwen/w4"]
    assert hits["hopper/qwen/w4"]["modules"] == []
    assert "bogus" in str(hits["hopper/qwen/w4"]["failing"])
    # The file a resolution error names reaches the targets it breaks.
    hits = rdeps(root, env, "kernels/hopper/qwen/w8/add.cu")
    assert sorted(hits) == ["gb10/qwen/w8", "hopper/qwen/w8"]
    assert all("shadows" in str(h["failing"]) for h in hits.values())
    # A skipped target is listed with its modules and the reason.
    hits = rdeps(root, env, "kernels/apple/common/k.metal")
    assert hits["apple/llama/f16"]["modules"] == ["k"]
    assert "'metal' is not installed" in str(hits["apple/llama/f16"]["skipped"])
    # The text view marks them.
    run = orch(root, env, "rdeps", "kernels/hopper/common/util.cuh")
    assert run.returncode == 0, run.text
    lines = run.out.splitlines()
    assert "gb10/qwen/w4: add, scale" in lines
    failing = [ln for ln in lines if ln.startswith("hopper/qwen/w4: (failing: ")]
    assert len(failing) == 1 and "kernels/hopper/HARDWARE.toml" in failing[0]
    # hopper/qwen/w8 and gb10/qwen/w8 do not resolve: util.cuh is none of the files their
    # error names, and what else they would read is unknown.
    assert lines[-1] == "kernels/hopper/common/util.cuh reaches 2 target(s) (1 failing)"


def test_rdeps_of_a_tree_that_does_not_load_says_why(tmp_path: Path) -> None:
    root, env = project(tmp_path, {"kernels/hopper/HARDWARE.toml": "[[[\n"})
    run = orch(root, env, "rdeps", "kernels/hopper/qwen/w4/scale.cu")
    assert run.returncode == 2 and run.out == ""
    assert run.err.startswith("error: rdeps: no target is known, the tree does not load: ")
    assert run.err.count("\n") == 1 and "Traceback" not in run.err


def test_a_variable_naming_an_unusable_compiler_is_a_problem_as_in_the_build(
    tmp_path: Path,
) -> None:
    root, env = project(
        tmp_path,
        {
            "kernels/strix/HARDWARE.toml": '[hardware]\nvendor = "amd"\narch = "gfx1151"\n',
            "kernels/strix/common/k.cu": 'extern "C" __global__ void k() {}\n',
            "kernels/strix/m/MODEL.toml": "[model]\n",
            "kernels/strix/m/q/.gitkeep": "",
        },
    )
    env["SCALE_HOME"] = str(tmp_path / "no-scale-here")
    check = orch(root, env, "check")
    assert check.returncode == 2, check.text
    (problem,) = problems(check)
    assert problem.startswith("environment SCALE_HOME: "), problem
    assert problem.endswith("[target strix/m/q]"), problem
    build = doit(root, ["build"], env)
    assert failed(build) == {"strix/m/q": problem.removesuffix(" [target strix/m/q]")}
    if glob.glob("/opt/scale*"):
        return  # SCALE is installed on this machine
    # Unset, SCALE is simply not installed here: listed, not a problem.
    del env["SCALE_HOME"]
    env["HOME"] = str(tmp_path)  # no ~/scale*
    check = orch(root, env, "check")
    assert check.returncode == 0, check.text
    assert "skipped: toolchain 'scale' is not installed: no scale root was found" in check.err
