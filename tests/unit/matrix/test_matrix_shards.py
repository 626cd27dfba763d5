"""``metrale-orch matrix --shards N``: build rows balanced by the kept compile seconds (issue 38).

N rows in all, each holding one hardware's targets; the slowest row within 1.15x of the
ideal split (total / N) where the targets allow it; every target in exactly one row; the
same rows for the same times; never-built targets weighed by their module count.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch import matrix as mx
from metrale_orch.matrix.balance import allocate_rows, plan_costs
from tests.support.matrix import _write, cli, hw, runners, sample_tree

#: Every hardware of these tests builds on the one Linux class.
LINUX = """\
[runners.linux]
labels = ["ubuntu-latest"]
toolchains = ["nvcc"]

[default]
runner = "linux"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return sample_tree(tmp_path)


def generated(
    seed: int, sizes: Mapping[str, int]
) -> tuple[list[mx.HardwareInfo], dict[str, float]]:
    """Hardware with ``sizes[hw]`` targets each, of varied kept seconds (0.3 s to 30 s,
    half of them over 8 s), each hardware's total 10 s a target (so that N rows can
    share them evenly where N divides as the target counts do)."""
    rnd = random.Random(seed)
    infos, times = [], {}
    for name, count in sorted(sizes.items()):
        weights = {f"m{i:03d}/q": rnd.randint(1, 12) for i in range(count)}
        infos.append(hw(name, weights))
        drawn = [rnd.choice([rnd.uniform(0.3, 8), rnd.uniform(8, 30)]) for _ in weights]
        scale = 10 * count / math.fsum(drawn)
        times.update(
            {f"{name}/{leaf}": round(s * scale, 3) for leaf, s in zip(weights, drawn, strict=True)}
        )
    return infos, times


def rows_of(infos: list[mx.HardwareInfo], **options: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = mx.plan_matrix(infos, runners(LINUX), **options)["include"]
    return rows


def slowest_over_ideal(rows: list[dict[str, Any]], times: Mapping[str, float], n: int) -> float:
    row_seconds = [math.fsum(times[t] for t in r["targets"]) for r in rows]
    return max(row_seconds) / (math.fsum(times.values()) / n)


# --------------------------------------------------------------------------- balance


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_hardware_is_split_within_115_percent_of_the_ideal(seed: int, n: int) -> None:
    infos, times = generated(seed, {"hopper": 200})
    rows = rows_of(infos, total_shards=n, times=times)
    assert len(rows) == n
    assert slowest_over_ideal(rows, times, n) <= 1.15


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [8, 12, 20])
def test_rows_are_shared_among_hardware_by_their_seconds(seed: int, n: int) -> None:
    # Totals about 2:1:1: the rows go where the seconds are, each hardware one at least.
    infos, times = generated(seed, {"b200": 80, "gb10": 160, "hopper": 80})
    rows = rows_of(infos, total_shards=n, times=times)
    assert len(rows) == n
    assert {r["hw"] for r in rows} == {"b200", "gb10", "hopper"}
    assert slowest_over_ideal(rows, times, n) <= 1.15
    # Each row's expected seconds are the kept times of its targets, rounded.
    for r in rows:
        assert r["seconds"] == round(math.fsum(times[t] for t in r["targets"]), 1)


def test_a_giant_target_does_not_take_the_rows_it_cannot_use() -> None:
    # metal's 100 s target is the slowest row whatever metal gets: two rows take it
    # alone (103 s -> 100 s), a third would not help, so the rows go to hopper.
    costs = {
        "hopper": {f"hopper/m{i}/q": 10.0 for i in range(12)},
        "metal": {"metal/big/q": 100.0, **{f"metal/s{i}/q": 1.0 for i in range(3)}},
    }
    assert allocate_rows(costs, 7, {}) == {"hopper": 5, "metal": 2}
    # A hardware never gets more rows than targets; the rows left over are not made.
    assert allocate_rows(costs, 40, {}) == {"hopper": 12, "metal": 4}
    assert allocate_rows(costs, 7, {"metal": 1}) == {"hopper": 6, "metal": 1}


# --------------------------------------------------------------------------- laws

times_strategy = st.dictionaries(
    st.tuples(
        st.sampled_from(["b200", "gb10", "hopper"]), st.text("abcdef", min_size=1, max_size=3)
    ),
    st.one_of(st.none(), st.floats(min_value=0, max_value=60, allow_nan=False)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(entries=times_strategy, n=st.integers(min_value=3, max_value=30), seed=st.integers())
def test_rows_are_complete_disjoint_and_stable(
    entries: dict[tuple[str, str], float | None], n: int, seed: int
) -> None:
    by_hw: dict[str, dict[str, int]] = {}
    times: dict[str, float] = {}
    for (name, leaf), seconds in entries.items():
        by_hw.setdefault(name, {})[f"{leaf}/q"] = len(leaf)
        if seconds is not None:  # None: never built
            times[f"{name}/{leaf}/q"] = seconds
    infos = [hw(name, weights) for name, weights in sorted(by_hw.items())]
    rows = rows_of(infos, total_shards=n, times=times)
    every = sorted(t.name for info in infos for t in info.targets)
    placed = [t for r in rows for t in r["targets"]]
    assert sorted(placed) == every  # each target once, none left out
    assert all(
        r["targets"] and all(t.startswith(r["hw"] + "/") for t in r["targets"]) for r in rows
    )
    assert len(rows) == min(n, len(every))
    # The same times give the same rows, whatever the order of hardware, targets and times.
    rnd = random.Random(seed)
    shuffled = [
        mx.HardwareInfo(
            name=i.name, toolchain=i.toolchain, targets=tuple(rnd.sample(i.targets, len(i.targets)))
        )
        for i in rnd.sample(infos, len(infos))
    ]
    shuffled_times = dict(rnd.sample(sorted(times.items()), len(times)))
    assert rows_of(shuffled, total_shards=n, times=shuffled_times) == rows


# --------------------------------------------------------------------------- estimates


def test_never_built_targets_weigh_their_modules_at_the_trees_mean() -> None:
    modules = {"h/a/q": 4, "h/b/q": 6, "h/new/q": 5, "h/empty/q": 0}
    costs, timed = plan_costs(modules, {"h/a/q": 8.0, "h/b/q": 12.0, "gone/x/q": 99.0})
    assert timed
    # 20 s over 10 modules: 2 s a module; a target with no module still costs one.
    assert costs == {"h/a/q": 8.0, "h/b/q": 12.0, "h/new/q": 10.0, "h/empty/q": 2.0}
    # No kept time for any target of the tree: module counts, and no seconds in the rows.
    assert plan_costs(modules, {"gone/x/q": 99.0}) == (
        {"h/a/q": 4.0, "h/b/q": 6.0, "h/new/q": 5.0, "h/empty/q": 1.0},
        False,
    )
    infos = [hw("hopper", {"big/q": 9, "s1/q": 3, "s2/q": 3, "s3/q": 3})]
    rows = rows_of(infos, total_shards=2)
    assert [(r["targets"], r["seconds"]) for r in rows] == [
        (["hopper/big/q"], None),
        (["hopper/s1/q", "hopper/s2/q", "hopper/s3/q"], None),
    ]
    # Kept times outweigh module counts: the one slow small target gets a row alone.
    times = {"hopper/big/q": 5.0, "hopper/s1/q": 30.0, "hopper/s2/q": 5.0, "hopper/s3/q": 5.0}
    rows = rows_of(infos, total_shards=2, times=times)
    assert [(r["targets"], r["seconds"]) for r in rows] == [
        (["hopper/big/q", "hopper/s2/q", "hopper/s3/q"], 15.0),
        (["hopper/s1/q"], 30.0),
    ]


@pytest.mark.parametrize(
    "write",
    [
        None,
        "not json",
        '{"schema": 99, "targets": {"hopper/qwen3/bf16": 5}}',
        '{"schema": 1, "targets": ["hopper/qwen3/bf16"]}',
    ],
)
def test_missing_or_unreadable_times_fall_back_to_module_counts(
    tmp_path: Path, write: str | None
) -> None:
    if write is not None:
        _write(tmp_path / ".state" / "target-times.json", write)
    assert mx.read_kept_seconds(tmp_path) == {}


def test_compile_times_stand_in_for_a_missing_summary(tmp_path: Path) -> None:
    _write(
        tmp_path / ".state" / "compile-times.json",
        '{"schema": 1, "modules": {"h/a/q": {"k0": ["key0", 1.5], "k1": ["key1", 2.0]}}}',
    )
    assert mx.read_kept_seconds(tmp_path) == {"h/a/q": 3.5}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--shards", "0"], "--shards 0: N must be at least 1"),
        (["--shards", "-2"], "--shards -2: N must be at least 1"),
        (["--shards", "3", "--shards", "4"], "the number of rows is given twice (3 and 4)"),
        (["--shards", "2", "--shard-size", "5"], "--shards N and --shard-size both set the rows"),
        (
            ["--shards", "1"],
            "--shards 1: 2 rows at least are needed: one for each selected hardware "
            "(apple, hopper), as a row builds one hardware's targets",
        ),
        (
            ["--shards", "3", "--shards", "hopper=3"],
            "--shards 3: 4 rows at least are needed: hopper=3 plus one for each selected "
            "hardware (apple)",
        ),
    ],
)
def test_shard_count_errors_are_one_line(tree: Path, args: list[str], problem: str) -> None:
    code, out, err = cli(tree, "--allow-unmapped", *args)
    assert (code, out) == (2, "")
    assert problem in err and err.count("\n") == 1
    assert "Traceback" not in err


# --------------------------------------------------------------------------- the CLI


def test_cli_balances_by_the_kept_times_in_the_build_directory(tree: Path) -> None:
    # hopper: qwen3/bf16 (3 modules) 30 s, qwen3/nvfp4 (2) 10 s, llama/bf16 (1) never
    # built: 40 s over 5 modules, 8 s; apple/qwen3/f16 (2 modules) never built: 16 s.
    times = {"schema": 1, "targets": {"hopper/qwen3/bf16": 30.0, "hopper/qwen3/nvfp4": 10.0}}
    _write(tree / "out" / ".state" / "target-times.json", json.dumps(times))
    _write(tree / "pyproject.toml", '[tool.metrale-orch]\nbuild_dir = "out"\n')
    code, out, err = cli(tree, "--allow-unmapped", "--shards", "3")
    assert code == 0, err
    rows = json.loads(out)["include"]
    assert [(r["name"], r["targets"], r["seconds"], r["build"]) for r in rows] == [
        ("apple", ["apple/qwen3/f16"], 16.0, "build:apple/*"),
        (
            "hopper (shard 1 of 2)",
            ["hopper/llama/bf16", "hopper/qwen3/nvfp4"],
            18.0,
            "build:hopper/llama/bf16 build:hopper/qwen3/nvfp4",
        ),
        ("hopper (shard 2 of 2)", ["hopper/qwen3/bf16"], 30.0, "build:hopper/qwen3/bf16"),
    ]
    # The same again: one line, byte for byte.
    assert cli(tree, "--allow-unmapped", "--shards", "3")[1] == out
    # HW=N still works, and counts in N: apple keeps one row, hopper the rest.
    code, out, err = cli(tree, "--allow-unmapped", "--shards", "hopper=1", "--shards", "2")
    assert code == 0, err
    assert [r["name"] for r in json.loads(out)["include"]] == ["apple", "hopper"]
    # The smoke rows stay one per hardware that needs one.
    code, out, err = cli(tree, "--allow-unmapped", "--shards", "3", "--smoke-rows")
    assert code == 0, err
    smoke = json.loads(out)["include"]
    assert [(r["hw"], r["smoke"], r["seconds"], r["shards"]) for r in smoke] == [
        ("hopper", "smoke:hopper", None, 1)
    ]


def test_cli_without_times_weighs_modules(tree: Path) -> None:
    _write(tree / "build" / ".state" / "target-times.json", "{truncated")
    code, out, err = cli(tree, "hopper", "--shards", "2")
    # One warning naming the file it ignored (issue 43 B2), and the rows by module count.
    assert code == 0 and err.count("\n") == 1, err
    assert err.startswith("warning: ") and "target-times.json: ignored: " in err
    rows = json.loads(out)["include"]
    assert [(r["targets"], r["modules"], r["seconds"]) for r in rows] == [
        (["hopper/llama/bf16", "hopper/qwen3/nvfp4"], 3, None),
        (["hopper/qwen3/bf16"], 3, None),
    ]


def test_keep_times_merges_the_rows_times_into_the_kept_ones(tree: Path) -> None:
    # What the workflow's keep-times job does: the kept file (restored from the Actions
    # cache) and each build row's report, as download-artifact lays them out.
    kept = {"schema": 1, "targets": {"hopper/qwen3/bf16": 30.0, "hopper/llama/bf16": 5.0}}
    _write(tree / "build" / ".state" / "target-times.json", json.dumps(kept))
    reports = tree / "row-reports"
    row1 = {"schema": 1, "targets": {"hopper/qwen3/bf16": 12.5}}
    row2 = {"schema": 1, "targets": {"apple/qwen3/f16": 3.0}}
    _write(reports / "kernels-hopper-1" / ".state" / "target-times.json", json.dumps(row1))
    _write(reports / "kernels-apple" / ".state" / "target-times.json", json.dumps(row2))
    _write(reports / "kernels-apple" / "cache-stats.json", "{}")
    code, out, err = cli(tree, "--keep-times", str(reports))
    assert (code, err) == (0, "")
    assert out == f"kept the compile seconds of 3 targets (2 files read from {reports})\n"
    merged = json.loads((tree / "build" / ".state" / "target-times.json").read_text())
    # A row's new seconds replace the kept ones; a target no row compiled keeps its own.
    assert merged == {
        "schema": 1,
        "targets": {"apple/qwen3/f16": 3.0, "hopper/llama/bf16": 5.0, "hopper/qwen3/bf16": 12.5},
    }
    assert mx.read_kept_seconds(tree / "build") == merged["targets"]
    # Nothing kept yet (the first run): the rows' times alone.
    (tree / "build" / ".state" / "target-times.json").unlink()
    assert cli(tree, "--keep-times", str(reports))[0] == 0
    assert set(mx.read_kept_seconds(tree / "build")) == {"apple/qwen3/f16", "hopper/qwen3/bf16"}
    # A directory that is not there is one line, exit 2.
    code, out, err = cli(tree, "--keep-times", str(tree / "nowhere"))
    assert (code, out) == (2, "")
    assert "nowhere: not a directory" in err and err.count("\n") == 1
