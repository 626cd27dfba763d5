"""Whole-tree layout scenarios kept as data (SPEC 1.7 ``dump`` format).

Each ``tests/cases/layout/<case>/`` holds ``tree/`` (a repository root with ``kernels/``)
and ``expected.json``: the expected ``dump(tree)``, written by hand from the SPEC. A
target expected to fail is ``{"error": "<substring>"}`` or ``{"error": [<substrings>]}``.
Symlinks cannot be committed portably, so the symlink scenarios copy a case tree into
``tmp_path`` and add the links in code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from metrale_orch.tree import SymlinkError, Target, discover, dump, walk
from tests.support import REPO
from tests.support.tree import symlink

CASES = REPO / "tests" / "cases" / "layout"
CASE_NAMES = sorted(p.name for p in CASES.iterdir() if (p / "expected.json").is_file())


def load_dump(root: Path) -> dict[str, Any]:
    got = dump(root)
    data = json.loads(got) if isinstance(got, str) else got
    assert isinstance(data, dict)
    return data


def expected_of(case: str) -> dict[str, Any]:
    data = json.loads((CASES / case / "expected.json").read_text())
    assert isinstance(data, dict)
    return data


def assert_matches(got: dict[str, Any], expected: dict[str, Any], root: Path) -> None:
    assert list(got) == sorted(got), "dump keys must be sorted"
    assert list(got) == list(expected), "walked targets differ"
    for key, want in expected.items():
        have = got[key]
        if set(want) == {"error"}:
            assert set(have) == {"error"}, (key, have)
            parts = want["error"] if isinstance(want["error"], list) else [want["error"]]
            for part in parts:
                assert part in have["error"], (key, part, have["error"])
        else:
            assert "error" not in have, (key, have)
            assert have == want, key
    assert str(root.resolve()) not in json.dumps(got)


def test_cases_exist() -> None:
    assert len(CASE_NAMES) >= 6


@pytest.mark.parametrize("case", CASE_NAMES)
def test_case(case: str) -> None:
    root = CASES / case / "tree"
    expected = expected_of(case)
    assert_matches(load_dump(root), expected, root)
    # walk yields exactly the dumped targets, as Targets, sorted
    assert [str(t) for t in walk(root)] == list(expected)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_case_discover_agrees_with_dump(case: str) -> None:
    root = CASES / case / "tree"
    expected = expected_of(case)
    for key, want in expected.items():
        if set(want) == {"error"}:
            continue
        lay = discover(root, Target.parse(key))
        assert str(lay.target) == key
        assert lay.source_model == want["source_model"]
        assert sorted(lay.leaf) == sorted(want["leaf"])
        assert [s for s, _ in lay.modules()] == list(want["modules"])


def copy_case(case: str, dest: Path) -> Path:
    root = dest / "repo"
    shutil.copytree(CASES / case / "tree", root)
    return root


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("kernels/hopper/qwen3/w4a16/alias.cu", "gemm.cu"),
        ("kernels/hopper/qwen3/w4a16/dangling.cuh", "nowhere.cuh"),
        ("kernels/hopper/qwen3/w4a16/docs", "../../common/include"),
        ("kernels/hopper/qwen3/w4a16/README.md", "gemm.cu"),
    ],
)
def test_symlink_in_leaf_fails_only_that_target(tmp_path: Path, link: str, target: str) -> None:
    root = copy_case("01_basic", tmp_path)
    expected = expected_of("01_basic")
    symlink(root, link, target)
    got = load_dump(root)
    assert list(got) == list(expected)
    assert got["hopper/qwen3/fp8"] == expected["hopper/qwen3/fp8"]
    assert set(got["hopper/qwen3/w4a16"]) == {"error"}
    assert link in got["hopper/qwen3/w4a16"]["error"]
    with pytest.raises(SymlinkError):
        discover(root, Target.parse("hopper/qwen3/w4a16"))


def test_symlink_in_common_fails_every_target(tmp_path: Path) -> None:
    root = copy_case("02_overlay", tmp_path)
    symlink(root, "kernels/blackwell/common/extra.cu", "act.cu")
    got = load_dump(root)
    assert list(got) == list(expected_of("02_overlay"))
    for value in got.values():
        assert set(value) == {"error"}
    assert "kernels/blackwell/common/extra.cu" in got["blackwell/qwen3/w4a16"]["error"]


def test_use_of_symlink_fails_the_using_target(tmp_path: Path) -> None:
    root = copy_case("05_errors", tmp_path)
    symlink(root, "kernels/h/lib/link.cu", "z.cu")
    (root / "kernels/h/m/ok/KERNEL.toml").write_text('[sources]\nuse = ["lib/link.cu"]\n')
    got = load_dump(root)
    assert "kernels/h/lib/link.cu" in got["h/m/ok"]["error"]
    expected = expected_of("05_errors")
    assert (
        got["h/m/undeclared"]["error"]
        == load_dump(CASES / "05_errors/tree")["h/m/undeclared"]["error"]
    )
    assert list(got) == list(expected)


def test_case_trees_hold_no_symlinks() -> None:
    paths = list(CASES.rglob("*"))
    assert any(p.is_file() for p in paths), f"no case files under {CASES}"
    for path in paths:
        assert not path.is_symlink(), path
