"""``metrale_orch.matrix`` and ``metrale-orch matrix``: rows, runners, sharding, CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metrale_orch import matrix as mx
from metrale_orch.tree import walk
from tests.support import REPO
from tests.support.matrix import RUNNERS_TOML, _write, cli, hw, make_tree, runners, sample_tree

ROW_KEYS = {
    "build",
    "build-runner",
    "hw",
    "id",
    "modules",
    "name",
    "runner",
    "runs-on",
    "seconds",
    "shard",
    "shards",
    "smoke",
    "smoke-runner",
    "target-count",
    "targets",
    "toolchain",
    "toolchain-available",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return sample_tree(tmp_path)


# --------------------------------------------------------------------------- the tree


def test_scan_tree_counts_modules_and_picks_toolchains(tree: Path) -> None:
    infos = {h.name: h for h in mx.scan_tree(tree)}
    assert sorted(infos) == ["apple", "hopper", "strix"]
    assert {t.name: t.modules for t in infos["hopper"].targets} == {
        "hopper/llama/bf16": 1,
        "hopper/qwen3/bf16": 3,
        "hopper/qwen3/nvfp4": 2,
    }
    assert [t.name for t in infos["hopper"].targets] == sorted(
        t.name for t in infos["hopper"].targets
    )
    assert (infos["hopper"].toolchain, infos["apple"].toolchain, infos["strix"].toolchain) == (
        "nvcc",
        "metal",
        "hip",
    )


def test_build_toolchain_override_wins_over_vendor(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {"strix": ('[hardware]\nvendor = "hip"\n[build]\ntoolchain = "nvcc"\n', {"m/q": 1})},
    )
    (info,) = mx.scan_tree(tmp_path)
    assert info.toolchain == "nvcc"


def test_rows_for_a_tree(tree: Path) -> None:
    matrix = mx.plan_matrix(mx.scan_tree(tree), runners(), allow_unmapped=True)
    rows = {r["hw"]: r for r in matrix["include"]}
    assert list(matrix) == ["include"]
    assert [r["hw"] for r in matrix["include"]] == ["apple", "hopper"]  # strix: unmapped
    hopper = rows["hopper"]
    assert set(hopper) == ROW_KEYS
    assert hopper["build"] == "build:hopper/*"
    assert hopper["smoke"] == "smoke:hopper"
    assert hopper["runs-on"] == ["self-hosted", "gpu-h100"]
    assert hopper["runner"] == "h100"
    assert hopper["targets"] == ["hopper/llama/bf16", "hopper/qwen3/bf16", "hopper/qwen3/nvfp4"]
    assert (hopper["target-count"], hopper["modules"]) == (3, 6)
    assert (hopper["shard"], hopper["shards"], hopper["name"], hopper["id"]) == (
        1,
        1,
        "hopper",
        "hopper",
    )
    assert hopper["toolchain-available"] is True
    assert rows["apple"]["toolchain"] == "metal"
    assert rows["apple"]["toolchain-available"] is True
    assert rows["apple"]["runs-on"] == ["macos-14"]


def test_toolchain_not_on_the_runner_class(tree: Path) -> None:
    text = RUNNERS_TOML.replace('apple = "mac"', 'apple = "linux"')
    rows = {
        r["hw"]: r
        for r in mx.plan_matrix(mx.scan_tree(tree), runners(text), allow_unmapped=True)["include"]
    }
    assert rows["apple"]["toolchain-available"] is False
    assert rows["hopper"]["toolchain-available"] is True


def test_rows_are_sorted_and_independent_of_input_order() -> None:
    infos = [
        hw("hopper", {"a/x": 3, "b/y": 1, "c/z": 2}),
        hw("apple", {"m/q": 2}, "metal"),
        hw("b200", {"m/q": 1, "m/r": 4}),
    ]
    rs = runners(RUNNERS_TOML + '\n[default]\nrunner = "linux"\n')
    expected = mx.plan_matrix(infos, rs, shards={"hopper": 2})
    assert [(r["hw"], r["shard"]) for r in expected["include"]] == [
        ("apple", 1),
        ("b200", 1),
        ("hopper", 1),
        ("hopper", 2),
    ]
    rng = random.Random(7)
    for _ in range(10):
        shuffled = [
            mx.HardwareInfo(
                name=h.name,
                toolchain=h.toolchain,
                targets=tuple(rng.sample(h.targets, len(h.targets))),
            )
            for h in rng.sample(infos, len(infos))
        ]
        again = mx.plan_matrix(shuffled, rs, shards={"hopper": 2})
        assert json.dumps(again, sort_keys=True) == json.dumps(expected, sort_keys=True)


# --------------------------------------------------------------------------- runners


def test_default_runner_serves_unlisted_hardware() -> None:
    rs = runners(RUNNERS_TOML + '\n[default]\nrunner = "linux"\n')
    (row,) = mx.plan_matrix([hw("b200", {"m/q": 1})], rs)["include"]
    assert (row["runner"], row["runs-on"]) == ("linux", ["ubuntu-latest"])
    # A hardware of its own keeps its class.
    (row,) = mx.plan_matrix([hw("hopper", {"m/q": 1})], rs)["include"]
    assert row["runner"] == "h100"


def test_unmapped_hardware_is_an_error_naming_it_and_the_file() -> None:
    infos = [hw("hopper", {"m/q": 1}), hw("b300", {"m/q": 1}), hw("b200", {"m/q": 1})]
    with pytest.raises(mx.UnmappedHardware) as info:
        mx.plan_matrix(infos, runners())
    assert info.value.hardware == ("b200", "b300")
    assert info.value.path == "ci/runners.toml"
    message = str(info.value)
    assert "ci/runners.toml" in message and "b200, b300" in message
    assert "--allow-unmapped" in message and "[default]" in message


def test_allow_unmapped_leaves_the_hardware_out() -> None:
    infos = [hw("hopper", {"m/q": 1}), hw("b200", {"m/q": 1})]
    matrix = mx.plan_matrix(infos, runners(), allow_unmapped=True)
    assert [r["hw"] for r in matrix["include"]] == ["hopper"]
    assert mx.unmapped_hardware(infos, runners()) == ("b200",)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[runners.a]\ntoolchains = []\n", "runners.a.labels", "missing"),
        ("[runners.a]\nlabels = []\n", "runners.a.labels", "at least one label"),
        ("[runners.a]\nlabels = [1]\n", "runners.a.labels", "non-blank strings"),
        ("[runners.a]\nlabels = ['x', 'x']\n", "runners.a.labels", "twice"),
        ("[runners.a]\nlabels = ['x']\nlabel = 'y'\n", "runners.a.label", "unknown key"),
        ("[runners.a]\nlabels = ['x']\ntoolchains = 'nvcc'\n", "runners.a.toolchains", "array"),
        ("runners = 3\n", "runners", "table"),
        ("[runners.a]\nlabels = ['x']\n[hardware]\nhopper = 'b'\n", "hardware.hopper", "'b'"),
        ("[runners.a]\nlabels = ['x']\n[hardware]\nhopper = ['x']\n", "hardware.hopper", "name"),
        ("[runners.a]\nlabels = ['x']\n[default]\nrunner = 'z'\n", "default.runner", "'z'"),
        ("[runners.a]\nlabels = ['x']\n[default]\nclass = 'a'\n", "default.class", "unknown"),
        ("[runner.a]\nlabels = ['x']\n", "runner", "unknown table"),
        (
            "[runners.a]\nlabels = ['x']\n[hardware]\nhopper = { build = 'a' }\n",
            "hardware.hopper.smoke",
            "missing",
        ),
        (
            "[runners.a]\nlabels = ['x']\n[hardware]\nhopper = { smoke = 'a' }\n",
            "hardware.hopper.build",
            'hopper = "<class>"',
        ),
        (
            "[runners.a]\nlabels = ['x']\n[hardware]\nhopper = { build = 'a', smoke = 'z' }\n",
            "hardware.hopper.smoke",
            "'z'",
        ),
        (
            "[runners.a]\nlabels = ['x']\n[hardware]\nhopper = { build = 'a', gpu = 'a' }\n",
            "hardware.hopper.gpu",
            "unknown key (known: build, smoke)",
        ),
        (
            "[runners.a]\nlabels = ['x']\n[hardware]\nhopper = { build = 1, smoke = 'a' }\n",
            "hardware.hopper.build",
            "name",
        ),
        ("[runners.a]\nlabels = ['x']\n[default]\nbuild = 'a'\n", "default.smoke", "missing"),
        ("[runners.a]\nlabels = ['x']\n[default]\nsmoke = 'a'\n", "default.build", "missing"),
        (
            "[runners.a]\nlabels = ['x']\n[default]\nrunner = 'a'\nsmoke = 'q'\n",
            "default.smoke",
            "'q'",
        ),
    ],
)
def test_runner_map_errors_name_the_file_and_key(text: str, key: str, problem: str) -> None:
    with pytest.raises(mx.RunnersError) as info:
        runners(text)
    assert info.value.key == key
    assert str(info.value).startswith(f"ci/runners.toml: {key}: ")
    assert problem in str(info.value)


SPLIT_TOML = (
    RUNNERS_TOML.replace('hopper = "h100"', 'hopper = { build = "linux", smoke = "h100" }')
    + '\n[default]\nbuild = "linux"\nsmoke = "h100"\n'
)


def test_a_plain_entry_builds_and_smokes_on_one_class() -> None:
    rs = runners(RUNNERS_TOML + '\n[default]\nrunner = "linux"\n')
    assert rs.hardware["hopper"] == mx.Placement(build="h100", smoke="h100")
    assert rs.default == mx.Placement.both("linux") and not rs.default.split
    (row,) = mx.plan_matrix([hw("hopper", {"m/q": 1})], rs)["include"]
    assert (row["runner"], row["build-runner"], row["smoke-runner"]) == ("h100",) * 3
    assert row["smoke"] == "smoke:hopper"
    # [default] build / smoke each override runner.
    rs = runners(RUNNERS_TOML + '\n[default]\nrunner = "linux"\nsmoke = "h100"\n')
    assert rs.default == mx.Placement(build="linux", smoke="h100")


def test_split_hardware_builds_on_one_class_and_smokes_on_another() -> None:
    rs = runners(SPLIT_TOML)
    assert rs.hardware["hopper"] == mx.Placement(build="linux", smoke="h100")
    assert rs.hardware["hopper"].split and rs.default == rs.hardware["hopper"]
    infos = [hw("hopper", {"a/q": 2, "b/q": 1}), hw("apple", {"m/q": 1}, "metal")]
    rows = {r["hw"]: r for r in mx.plan_matrix(infos, rs)["include"]}
    hopper = rows["hopper"]
    assert set(hopper) == ROW_KEYS
    assert (hopper["runner"], hopper["runs-on"]) == ("linux", ["ubuntu-latest"])
    assert (hopper["build-runner"], hopper["smoke-runner"]) == ("linux", "h100")
    assert (hopper["build"], hopper["smoke"]) == ("build:hopper/*", "")  # GPU smokes
    assert hopper["toolchain-available"] is True  # nvcc is on the CPU class
    assert rows["apple"]["smoke"] == "smoke:apple"  # a plain entry is unchanged
    (smoke,) = mx.plan_smoke_matrix(infos, rs)["include"]
    assert set(smoke) == ROW_KEYS
    assert (smoke["hw"], smoke["build"], smoke["smoke"]) == ("hopper", "", "smoke:hopper")
    assert (smoke["runner"], smoke["runs-on"]) == ("h100", ["self-hosted", "gpu-h100"])
    assert (smoke["build-runner"], smoke["smoke-runner"]) == ("linux", "h100")
    assert smoke["targets"] == ["hopper/a/q", "hopper/b/q"] and smoke["modules"] == 3
    assert (smoke["id"], smoke["name"]) == ("hopper", "hopper")


def test_split_and_sharded_hardware_smokes_once_on_its_smoke_class() -> None:
    rs = runners(SPLIT_TOML)
    infos = [hw("hopper", {"a/q": 2, "b/q": 2, "c/q": 1}), hw("b200", {"m/q": 1})]
    rows = mx.plan_matrix(infos, rs, shards={"hopper": 2})["include"]
    assert [(r["hw"], r["shard"], r["runner"], r["smoke"]) for r in rows] == [
        ("b200", 1, "linux", ""),  # the default: build on linux, smoke on h100
        ("hopper", 1, "linux", ""),
        ("hopper", 2, "linux", ""),
    ]
    smoke = mx.plan_smoke_matrix(infos, rs, shards={"hopper": 2})["include"]
    assert [(r["hw"], r["runner"], r["shards"], r["target-count"]) for r in smoke] == [
        ("b200", "h100", 1, 1),
        ("hopper", "h100", 1, 3),
    ]


def test_smoke_row_toolchain_is_checked_on_the_smoke_class() -> None:
    text = SPLIT_TOML.replace('smoke = "h100" }', 'smoke = "mac" }', 1)
    infos = [hw("hopper", {"m/q": 1})]
    (build,) = mx.plan_matrix(infos, runners(text))["include"]
    (smoke,) = mx.plan_smoke_matrix(infos, runners(text))["include"]
    assert (build["runner"], build["toolchain-available"]) == ("linux", True)
    assert (smoke["runner"], smoke["toolchain-available"]) == ("mac", False)


def test_load_runners_missing_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(mx.RunnersError, match=r"ci/runners\.toml: \(file\): does not exist"):
        mx.load_runners(tmp_path / "ci" / "runners.toml", tmp_path)
    _write(tmp_path / "ci" / "runners.toml", "[runners\n")
    with pytest.raises(mx.RunnersError, match="not valid TOML"):
        mx.load_runners(tmp_path / "ci" / "runners.toml", tmp_path)


# --------------------------------------------------------------------------- patterns


def test_pattern_selects_hardware_or_targets() -> None:
    infos = [
        hw("hopper", {"qwen3/bf16": 2, "qwen3/fp8": 1, "llama/bf16": 1}),
        hw("b200", {"m/q": 1}),
    ]
    rs = runners(RUNNERS_TOML + '\n[default]\nrunner = "linux"\n')
    by_hw = mx.plan_matrix(infos, rs, pattern="hop*")["include"]
    assert [(r["hw"], r["build"]) for r in by_hw] == [("hopper", "build:hopper/*")]
    (row,) = mx.plan_matrix(infos, rs, pattern="*/qwen3/*")["include"]
    assert row["targets"] == ["hopper/qwen3/bf16", "hopper/qwen3/fp8"]
    assert row["build"] == "build:hopper/qwen3/bf16 build:hopper/qwen3/fp8"
    # A pattern covering every target of a hardware selects it whole.
    (row,) = mx.plan_matrix(infos, rs, pattern="hopper/*")["include"]
    assert row["build"] == "build:hopper/*"
    with pytest.raises(mx.NoMatch, match="'gb10' matches no hardware"):
        mx.plan_matrix(infos, rs, pattern="gb10")


def test_pattern_only_checks_runners_of_selected_hardware() -> None:
    infos = [hw("hopper", {"m/q": 1}), hw("b200", {"m/q": 1})]
    (row,) = mx.plan_matrix(infos, runners(), pattern="hopper")["include"]
    assert row["hw"] == "hopper"


# --------------------------------------------------------------------------- sharding


def test_shards_by_count_and_by_size() -> None:
    infos = [hw("hopper", {f"m{i}/q": i + 1 for i in range(7)})]
    rows = mx.plan_matrix(infos, runners(), shards={"hopper": 3})["include"]
    assert [(r["shard"], r["shards"]) for r in rows] == [(1, 3), (2, 3), (3, 3)]
    assert [r["id"] for r in rows] == [f"hopper-shard{i}of3" for i in (1, 2, 3)]
    assert rows[0]["name"] == "hopper (shard 1 of 3)"
    assert all(r["smoke"] == "" for r in rows)
    for r in rows:
        assert r["build"].split() == [f"build:{t}" for t in r["targets"]]
    assert sorted(t for r in rows for t in r["targets"]) == [t.name for t in infos[0].targets]
    assert sum(r["modules"] for r in rows) == 28
    loads = [r["modules"] for r in rows]
    assert max(loads) - min(loads) <= 7

    by_size = mx.plan_matrix(infos, runners(), shard_size=3)["include"]
    assert len(by_size) == 3  # ceil(7 / 3)
    # An explicit count wins over the size; more shards than targets gives one per target.
    assert len(mx.plan_matrix(infos, runners(), shard_size=3, shards={"hopper": 1})["include"]) == 1
    assert len(mx.plan_matrix(infos, runners(), shards={"hopper": 50})["include"]) == 7


def test_smoke_rows_for_sharded_hardware() -> None:
    infos = [hw("hopper", {"a/q": 2, "b/q": 2, "c/q": 1}), hw("apple", {"m/q": 1}, "metal")]
    assert mx.plan_smoke_matrix(infos, runners()) == {"include": []}
    (row,) = mx.plan_smoke_matrix(infos, runners(), shards={"hopper": 2})["include"]
    assert set(row) == ROW_KEYS
    assert (row["hw"], row["smoke"], row["build"]) == ("hopper", "smoke:hopper", "")
    assert row["targets"] == ["hopper/a/q", "hopper/b/q", "hopper/c/q"]
    assert (row["modules"], row["shards"], row["runs-on"]) == (5, 1, ["self-hosted", "gpu-h100"])


@pytest.mark.parametrize(
    ("specs", "problem"),
    [
        (["hopper"], "expected HW=N"),
        (["=3"], "expected HW=N"),
        (["hopper=x"], "whole number"),
        (["hopper=0"], "at least 1"),
        (["hopper=2", "hopper=3"], "given twice"),
    ],
)
def test_shard_spec_errors(specs: list[str], problem: str) -> None:
    with pytest.raises(mx.ShardSpecError, match=problem):
        mx.parse_shard_specs(specs)


def test_shard_spec_for_unknown_hardware() -> None:
    assert mx.parse_shard_specs(["hopper=2", " b200 =3"]) == {"hopper": 2, "b200": 3}
    with pytest.raises(mx.ShardSpecError, match="no hardware tree kernels/gb10"):
        mx.plan_matrix([hw("hopper", {"m/q": 1})], runners(), shards={"gb10": 2})
    with pytest.raises(mx.ShardSpecError, match="at least 1"):
        mx.plan_matrix([hw("hopper", {"m/q": 1})], runners(), shard_size=0)


loads_strategy = st.dictionaries(
    st.text(alphabet="abcdefgh", min_size=1, max_size=4),
    st.integers(min_value=0, max_value=40),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(weights=loads_strategy, count=st.integers(min_value=1, max_value=12), seed=st.integers())
def test_sharding_laws(weights: dict[str, int], count: int, seed: int) -> None:
    targets = [mx.TargetLoad(name=f"hw/{n}/q", modules=m) for n, m in weights.items()]
    parts = mx.plan_shards(targets, count)
    # Every target in exactly one shard; no empty shard; as many shards as asked (or targets).
    placed = [t for part in parts for t in part]
    assert sorted(t.name for t in placed) == sorted(t.name for t in targets)
    assert len(placed) == len(targets)
    assert len(parts) == min(count, len(targets))
    assert all(part for part in parts)
    # Balanced: any two shards' loads within the heaviest target's weight.
    loads = [sum(max(1, t.modules) for t in part) for part in parts]
    assert max(loads) - min(loads) <= max(max(1, t.modules) for t in targets)
    # Deterministic: the input order does not matter.
    shuffled = random.Random(seed).sample(targets, len(targets))
    assert mx.plan_shards(shuffled, count) == parts


# --------------------------------------------------------------------------- CLI


def test_cli_prints_the_matrix_as_one_json_line(tree: Path) -> None:
    code, out, err = cli(tree, "--allow-unmapped")
    assert code == 0, err
    assert out.count("\n") == 1  # one line: fits $GITHUB_OUTPUT as is
    expected = mx.plan_matrix(mx.scan_tree(tree), runners(), allow_unmapped=True)
    assert json.loads(out) == expected
    assert out == json.dumps(expected, sort_keys=True, separators=(",", ":")) + "\n"
    assert "warning: ci/runners.toml: no runner for strix" in err
    code, pretty, _ = cli(tree, "--allow-unmapped", "--pretty")
    assert code == 0 and json.loads(pretty) == expected and pretty.count("\n") > 10


def test_cli_errors_are_one_line_with_exit_2(tree: Path) -> None:
    code, out, err = cli(tree)
    assert (code, out) == (2, "")
    assert err.startswith("error: ci/runners.toml: [hardware]: no runner for hardware strix")
    assert "Traceback" not in err
    code, _, err = cli(tree, "--runners", str(tree / "nope.toml"))
    assert code == 2 and "nope.toml: (file): does not exist" in err
    code, _, err = cli(tree, "--allow-unmapped", "--shards", "hopper")
    assert code == 2 and "expected N or HW=N" in err
    code, _, err = cli(tree, "--allow-unmapped", "--shard-size", "0")
    assert code == 2 and "at least 1" in err
    code, _, err = cli(tree, "nothing*")
    assert code == 2 and "matches no hardware" in err


def test_cli_pattern_shards_and_smoke_rows(tree: Path) -> None:
    code, out, err = cli(tree, "hopper", "--shards", "hopper=2")
    assert code == 0, err
    rows = json.loads(out)["include"]
    assert [(r["hw"], r["shard"], r["shards"]) for r in rows] == [
        ("hopper", 1, 2),
        ("hopper", 2, 2),
    ]
    code, out, err = cli(tree, "hopper", "--shards", "hopper=2", "--smoke-rows")
    assert code == 0, err
    assert [r["smoke"] for r in json.loads(out)["include"]] == ["smoke:hopper"]
    code, out, _ = cli(tree, "hopper", "--smoke-rows")
    assert json.loads(out) == {"include": []}


def test_cli_runners_path_is_relative_to_the_working_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tree / "other" / "r.toml", RUNNERS_TOML + '\n[default]\nrunner = "linux"\n')
    monkeypatch.chdir(tree / "other")
    code, out, err = cli(tree, "--runners", "r.toml")
    assert code == 0, err
    assert [r["hw"] for r in json.loads(out)["include"]] == ["apple", "hopper", "strix"]


# --------------------------------------------------------------------------- the repository


def _sample_hardware() -> list[str]:
    if not (REPO / "kernels").is_dir():
        return []
    return sorted({t.hardware for t in walk(REPO)})


def test_repository_runner_map_covers_the_sample_tree() -> None:
    rs = mx.load_runners(REPO / mx.DEFAULT_RUNNERS_FILE, REPO)
    assert rs.default is not None  # the documented fallback exists
    sample = _sample_hardware()
    assert sample, "the sample tree kernels/ has hardware with targets"
    unlisted = [h for h in sample if h not in rs.hardware]
    assert unlisted == [], f"add them under [hardware] in {mx.DEFAULT_RUNNERS_FILE}"
    # The shipped map compiles every NVIDIA tree on a CPU class; GPU classes only smoke.
    nvidia = [h for h in sample if h in ("b200", "b300", "gb10", "hopper")]
    assert nvidia == ["b200", "b300", "gb10", "hopper"]
    for name in nvidia:
        placement = rs.hardware[name]
        assert placement.split and placement.build.startswith("cpu"), name
        assert not any(label.startswith("gpu") for label in rs.classes[placement.build].labels)
        build, smoke = rs.classes[placement.build], rs.classes[placement.smoke]
        # The same CPU architecture: the toolchain install is part of every key.
        assert {"x64", "arm64"} & set(build.labels) == {"x64", "arm64"} & set(smoke.labels)
    code, out, err = cli(REPO)
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)["include"]
    assert [r["hw"] for r in rows] == sample
    assert all(set(r) == ROW_KEYS for r in rows)
    for r in rows:
        placement = rs.hardware[r["hw"]]
        assert r["build"] == f"build:{r['hw']}/*"
        assert r["smoke"] == ("" if placement.split else f"smoke:{r['hw']}")
        assert r["runs-on"] == list(rs.classes[placement.build].labels)
        assert r["targets"] == sorted(str(t) for t in walk(REPO) if t.hardware == r["hw"])
    code, out, err = cli(REPO, "--smoke-rows")
    assert code == 0, err
    smoke = json.loads(out)["include"]
    assert [r["hw"] for r in smoke] == nvidia
    for r in smoke:
        assert r["runs-on"] == list(rs.classes[rs.hardware[r["hw"]].smoke].labels)
        assert (r["build"], r["smoke"]) == ("", f"smoke:{r['hw']}")


def test_cli_warns_only_about_selected_unmapped_hardware(tree: Path) -> None:
    code, out, err = cli(tree, "hopper", "--allow-unmapped")
    assert code == 0 and err == ""
    code, out, err = cli(tree, "strix", "--allow-unmapped")
    assert (code, json.loads(out)) == (0, {"include": []})
    assert "no runner for strix" in err
